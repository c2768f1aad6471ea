//! [`CommError`]: what the communicator layer can fail with.

use std::time::Duration;

/// A communicator failure. Each text names the operation, the values involved and what to do.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum CommError {
    /// A buffer whose length does not fit the collective.
    #[error("{op}: {what} holds {found} elements but must hold {expected} ({rule}); pass views of those lengths (use .slice(..))")]
    Count {
        /// The collective.
        op: &'static str,
        /// Which buffer.
        what: &'static str,
        /// Its length.
        found: usize,
        /// The length the collective needs.
        expected: usize,
        /// The rule, e.g. "send = recv × world (4)".
        rule: String,
    },
    /// A root or peer rank outside the communicator.
    #[error("{op}: {what} {value} is not a rank of this communicator (ranks 0..{world})")]
    Rank {
        /// The operation.
        op: &'static str,
        /// "root", "peer" or "rank".
        what: &'static str,
        /// The value passed.
        value: usize,
        /// The communicator's size.
        world: usize,
    },
    /// A communicator set without devices, or with one device twice (RCCL refuses two ranks of
    /// one communicator on one device).
    #[error("{0}")]
    Devices(String),
    /// A unique id in the wrong format.
    #[error("unique id: {0}")]
    BadId(String),
    /// An RCCL call failed (the RCCL status, or a missing entry point, or `ncclAvg` on an RCCL
    /// that predates it).
    #[error("{op} on rank {rank}: {source}")]
    Rccl {
        /// The RCCL call.
        op: &'static str,
        /// This communicator's rank.
        rank: usize,
        /// What hip-sys said.
        source: hip_sys::Error,
    },
    /// RCCL reported an asynchronous error for this communicator (a failed or mismatched
    /// collective, a dead peer). The communicator has been aborted.
    #[error("{op} on rank {rank} of {world}: RCCL reported an asynchronous error: {source}. The communicator was aborted; create a new one")]
    Async {
        /// The oldest operation not known to have completed (or the call that noticed).
        op: &'static str,
        /// This communicator's rank.
        rank: usize,
        /// The communicator's size.
        world: usize,
        /// The asynchronous status.
        source: hip_sys::Error,
    },
    /// The stream running a collective reported a failure (e.g. the runtime turned the
    /// collective's failure into a stream error). The communicator has been aborted.
    #[error("{op} on rank {rank} of {world} failed on its stream: {source}. The communicator was aborted; create a new one")]
    Failed {
        /// The oldest collective not known to have completed.
        op: &'static str,
        /// This communicator's rank.
        rank: usize,
        /// The communicator's size.
        world: usize,
        /// What the runtime said.
        source: Box<crate::Error>,
    },
    /// A collective did not complete in time: another rank died, never called it, or called a
    /// different one. The communicator has been aborted.
    #[error("{op} on rank {rank} of {world} did not complete within {timeout:?}: a rank died, never called {op}, or called another collective (with other counts, types or root). The communicator was aborted; raise the timeout (Comm::set_timeout, HIPK_COMM_TIMEOUT_S) if the work is merely slow")]
    Timeout {
        /// The collective.
        op: &'static str,
        /// This communicator's rank.
        rank: usize,
        /// The communicator's size.
        world: usize,
        /// The timeout that expired.
        timeout: Duration,
    },
    /// `HIPK_COMM_TIMEOUT_S` is not a number of seconds in the accepted range.
    #[error("HIPK_COMM_TIMEOUT_S={value:?} is not a number of seconds in {min:?}..={max:?}; set e.g. HIPK_COMM_TIMEOUT_S=600, or unset it for the default of 300 s")]
    BadTimeout {
        /// The value.
        value: String,
        /// The shortest accepted.
        min: Duration,
        /// The longest accepted.
        max: Duration,
    },
    /// The communicator was aborted earlier (timeout or asynchronous error).
    #[error(
        "{op} on rank {rank}: the communicator was aborted earlier ({reason}); create a new one"
    )]
    Aborted {
        /// The call attempted.
        op: &'static str,
        /// This communicator's rank.
        rank: usize,
        /// Why it was aborted.
        reason: String,
    },
}
