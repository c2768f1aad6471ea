//! [`DdpError`]: what the data-parallel helpers can fail with.

use std::time::Duration;

/// A data-parallel failure. Each text names what happened, the value involved and what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DdpError {
    /// The launcher's environment variables are inconsistent (see [`EnvError`]).
    #[error(transparent)]
    Env(#[from] EnvError),
    /// The rendezvous that hands rank 0's unique id to the other ranks failed.
    #[error(transparent)]
    Rendezvous(#[from] RendezvousError),
    /// The job's secret could not be found or made.
    #[error(transparent)]
    Secret(#[from] SecretError),
    /// `LOCAL_RANK` names a device this process cannot open.
    #[error("LOCAL_RANK={local_rank} selects device {local_rank}, which cannot be opened: {source}. Start at most as many processes per node as devices are visible (torchrun --nproc-per-node), or narrow HIP_VISIBLE_DEVICES consistently")]
    Device {
        /// The local rank (the device ordinal).
        local_rank: usize,
        /// What hip-rt said.
        source: Box<crate::Error>,
    },
    /// Gradient ranges that cannot be bucketed (empty, overlapping, outside the buffer).
    #[error("gradient reducer: {0}")]
    Ranges(String),
    /// `mark_ready` with an index that names no tensor.
    #[error(
        "gradient reducer: mark_ready({index}) but there are {count} tensors (indices 0..{count})"
    )]
    NoSuchTensor {
        /// The index passed.
        index: usize,
        /// How many tensors the reducer was built with.
        count: usize,
    },
    /// `mark_ready` twice for one tensor in one step.
    #[error("gradient reducer: tensor {index} (elements {start}..{end}) was marked ready twice in one step; mark each tensor once between finish() calls")]
    MarkedTwice {
        /// The tensor.
        index: usize,
        /// Its first element.
        start: usize,
        /// One past its last element.
        end: usize,
    },
    /// `finish` while some tensors were never marked ready.
    #[error("gradient reducer: finish() with {count} tensor(s) not marked ready (first: {first:?}); every rank must mark every tensor each step, or the ranks' collectives stop matching")]
    Unmarked {
        /// How many are missing.
        count: usize,
        /// The first few missing indices.
        first: Vec<usize>,
    },
    /// `finish` after a bucket failed to launch.
    #[error("gradient reducer: only {launched} of {buckets} buckets were launched this step (an earlier mark_ready failed); reset() the reducer and redo the step on every rank")]
    NotLaunched {
        /// Buckets launched.
        launched: usize,
        /// Buckets in the plan.
        buckets: usize,
    },
    /// A buffer whose length does not match the plan it is used with.
    #[error("{what}: the buffer holds {found} elements but {expected} are needed ({rule})")]
    Length {
        /// The call.
        what: &'static str,
        /// The buffer's length.
        found: usize,
        /// The length needed.
        expected: usize,
        /// Why.
        rule: String,
    },
    /// A plan or helper made for another world size than the communicator's.
    #[error("{what}: made for {planned} ranks but the communicator has {world}; build it from comm.world()")]
    World {
        /// The call.
        what: &'static str,
        /// The world size it was made for.
        planned: usize,
        /// The communicator's world size.
        world: usize,
    },
    /// A HIP or RCCL failure (allocation, event, stream, collective).
    #[error(transparent)]
    Hip(#[from] crate::Error),
}

impl From<crate::comm::CommError> for DdpError {
    fn from(e: crate::comm::CommError) -> Self {
        DdpError::Hip(e.into())
    }
}

/// torchrun's variables (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`,
/// optionally `LOCAL_WORLD_SIZE`) that do not describe a valid launch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EnvError {
    /// Some of the required variables are set and others are not.
    #[error("launcher variables partly set: {set:?} set but {missing:?} missing. Set all of RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT (torchrun does) for one process per device, or none of them for a single process")]
    Partial {
        /// The variables that are set.
        set: Vec<&'static str>,
        /// The required variables that are not.
        missing: Vec<&'static str>,
    },
    /// A variable whose value is not valid Unicode.
    #[error("{var} is not valid UTF-8; set it to a plain value")]
    NotUnicode {
        /// The variable.
        var: &'static str,
    },
    /// A count or rank that is not a non-negative integer.
    #[error("{var}={value:?} is not a non-negative integer; set it to a number such as 0")]
    NotANumber {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
    },
    /// `WORLD_SIZE` or `LOCAL_WORLD_SIZE` of 0.
    #[error("{var}=0: a job has at least one process; set it to the number of processes")]
    ZeroSize {
        /// The variable.
        var: &'static str,
    },
    /// A rank at or past its size.
    #[error("{var}={value} but {size_var}={size}: ranks run from 0 to {size_var}-1; check the launcher's arguments")]
    RankOutOfRange {
        /// `RANK` or `LOCAL_RANK`.
        var: &'static str,
        /// Its value.
        value: usize,
        /// `WORLD_SIZE` or `LOCAL_WORLD_SIZE`.
        size_var: &'static str,
        /// The size.
        size: usize,
    },
    /// More processes on this node than in the whole job.
    #[error("LOCAL_WORLD_SIZE={local} is larger than WORLD_SIZE={world}; one node cannot hold more processes than the job")]
    LocalLargerThanWorld {
        /// `LOCAL_WORLD_SIZE`.
        local: usize,
        /// `WORLD_SIZE`.
        world: usize,
    },
    /// `MASTER_PORT` or `HIPK_RDZV_PORT` not in 1..=65535.
    #[error("{var}={value:?} is not a TCP port in 1..=65535 (0 means \"any port\", which the ranks cannot agree on); pick a free port, e.g. 29500")]
    BadPort {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
    },
    /// A count past the largest accepted.
    #[error("{var}={value} is larger than {max}, the most ranks hip-rt accepts; check the launcher's arguments")]
    TooLarge {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// The largest accepted.
        max: usize,
    },
    /// Under Slurm (`SLURM_PROCID` set, no torchrun variables), a variable it needs is not set.
    #[error("SLURM_PROCID is set (a rank started by srun) but {var}, which gives {why}, is not: start the ranks with srun inside an sbatch/salloc allocation, or set torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) instead")]
    SlurmMissing {
        /// The variable.
        var: &'static str,
        /// What it gives.
        why: &'static str,
    },
    /// A `SLURM_JOB_NODELIST` that is not a Slurm host list.
    #[error("SLURM_JOB_NODELIST={value:?} is not a Slurm host list ({why}); set MASTER_ADDR to rank 0's host instead")]
    BadNodeList {
        /// Its value (the first 200 characters).
        value: String,
        /// What is wrong.
        why: String,
    },
    /// An empty `MASTER_ADDR`.
    #[error("MASTER_ADDR is empty; set it to rank 0's host name or IP address (127.0.0.1 on one machine)")]
    EmptyAddr,
}

/// How handing rank 0's RCCL unique id to the other ranks failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RendezvousError {
    /// `MASTER_ADDR:MASTER_PORT` does not resolve.
    #[error("rendezvous: cannot resolve {addr}: {source}; check MASTER_ADDR")]
    Resolve {
        /// `host:port`.
        addr: String,
        /// The resolver's error.
        source: std::io::Error,
    },
    /// Rank 0 cannot listen on the rendezvous port.
    #[error("rendezvous: rank 0 cannot listen on {addr}: {source}. Is another job (or torchrun's own store) using the port? Pick another MASTER_PORT, or set HIPK_RDZV_PORT to a free port on every rank")]
    Bind {
        /// The address.
        addr: String,
        /// The socket error.
        source: std::io::Error,
    },
    /// A socket error while exchanging the id.
    #[error("rendezvous on rank {rank}: {what} {peer}: {source}")]
    Io {
        /// This process's rank.
        rank: usize,
        /// What was being done.
        what: &'static str,
        /// The other side.
        peer: String,
        /// The socket error.
        source: std::io::Error,
    },
    /// Rank 0 did not hear from every rank in time.
    #[error("rendezvous: rank 0 waited {waited:?} at {addr} for {world} ranks; rank(s) {missing:?} never connected{strays}. Check that every process was started with the same MASTER_ADDR/MASTER_PORT and WORLD_SIZE and can reach rank 0; raise the timeout (HIPK_COMM_TIMEOUT_S) if they start slowly")]
    MissingRanks {
        /// The listening address.
        addr: String,
        /// `WORLD_SIZE`.
        world: usize,
        /// The ranks that never connected.
        missing: Vec<usize>,
        /// How long rank 0 waited.
        waited: Duration,
        /// A note on refused stray connections (empty if none).
        strays: String,
    },
    /// A rank other than 0 could not get the id in time.
    #[error("rendezvous: rank {rank} of {world} got no unique id from rank 0 at {addr} within {waited:?} ({last}). Check that rank 0 is running with the same MASTER_ADDR/MASTER_PORT, and that every rank was started; raise the timeout (HIPK_COMM_TIMEOUT_S) if rank 0 starts slowly")]
    NoAnswer {
        /// This rank.
        rank: usize,
        /// `WORLD_SIZE`.
        world: usize,
        /// Rank 0's address.
        addr: String,
        /// How long this rank tried.
        waited: Duration,
        /// The last thing that went wrong.
        last: String,
    },
    /// A peer whose job description does not match (world size, rank, protocol version).
    #[error("rendezvous: {detail}. Every process must be started with the same WORLD_SIZE, a distinct RANK in 0..WORLD_SIZE and the same hip-rt version")]
    Mismatch {
        /// Who said what.
        detail: String,
    },
    /// The process at rank 0's address failed to prove that it holds the job's secret.
    #[error("rendezvous: the process at {peer} did not prove that it holds this job's secret, so rank {rank} did not join it. Give every rank the same HIPK_RDZV_SECRET (or HIPK_RDZV_SECRET_FILE), or check that MASTER_ADDR/MASTER_PORT name this job's rank 0")]
    Unproved {
        /// This rank.
        rank: usize,
        /// The address.
        peer: String,
    },
    /// This rank's run settings differ from rank 0's.
    #[error("rendezvous: rank 0 refused rank {rank}: {detail}. Start every rank with the same flags and files")]
    Settings {
        /// This rank.
        rank: usize,
        /// The setting and both values.
        detail: String,
    },
    /// Something at rank 0's address that does not speak the rendezvous protocol.
    #[error("rendezvous: {peer} answered rank {rank} with bytes that are not hip-rt's rendezvous; is MASTER_PORT used by another service?")]
    Stray {
        /// This rank.
        rank: usize,
        /// The address.
        peer: String,
    },
}

/// The job's secret (see [`super::Secret`]) is missing, unsafe or unreadable.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SecretError {
    /// A secret too short or too long.
    #[error("the rendezvous secret from {origin} is {len} bytes long; use 16 to 1024 bytes (e.g. HIPK_RDZV_SECRET=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'))")]
    Length {
        /// Where it came from.
        origin: String,
        /// Its length.
        len: usize,
    },
    /// A secret file others could read or replace.
    #[error("the rendezvous secret file {} {why}", path.display())]
    Unsafe {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong.
        why: String,
    },
    /// No `HIPK_RDZV_SECRET`, no `HIPK_RDZV_SECRET_FILE` and no `HOME` for the default file.
    #[error("no rendezvous secret: set HIPK_RDZV_SECRET (the same on every rank) or HIPK_RDZV_SECRET_FILE, or HOME for the default file $HOME/.hipk/rdzv-secret")]
    NoHome,
    /// Reading or making a secret file failed.
    #[error("rendezvous secret: {what} {}: {source}", path.display())]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// What was being done.
        what: &'static str,
        /// What the OS said.
        source: std::io::Error,
    },
}
