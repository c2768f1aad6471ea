//! An emulated RCCL: the C ABI of RCCL's `nccl.h` (the subset a data-parallel trainer uses),
//! exported from `libhip_emu.so` so that `HIPK_RCCL_LIBRARY=<path>/libhip_emu.so` binds it.
//!
//! Its only purpose is to test host code: collectives run on the CPU, in rank order, through a
//! shared memory region (see [`shm`]) that the ranks of one communicator map whether they are
//! threads of one process or separate processes. A collective is queued on its hip-emu stream
//! like any other work and completes when every rank's stream has reached it (see [`transfer`]).
//!
//! Beyond RCCL, it turns what a real RCCL leaves as a hang or as corrupted data into errors:
//! ranks disagreeing on a collective's kind, count, type, op or root, a rank that never arrives
//! (after `HIPK_EMU_RCCL_TIMEOUT_MS`), a buffer smaller than the count, two ranks of one
//! communicator on one device.
//!
//! Errors: a call that fails at once returns its `ncclResult_t`; a collective that fails while
//! it runs becomes a fault of its stream (the next synchronising HIP call returns it), the
//! communicator's asynchronous error (`ncclCommGetAsyncError`) and aborts the communicator for
//! every rank. `ncclGetLastError` returns the message, which is also printed to stderr once.

pub mod api;
pub mod comm;
pub mod reduce;
pub mod shm;
pub mod transfer;

use std::time::Duration;

/// The version `ncclGetVersion` reports: 2.18.4, encoded X*10000 + Y*100 + Z (NCCL >= 2.9
/// encoding), a release with `ncclAvg` and `ncclGetLastError`.
pub const VERSION: i32 = 21804;

/// Watchdog: how long a rank waits for the others (milliseconds).
pub const TIMEOUT_VAR: &str = "HIPK_EMU_RCCL_TIMEOUT_MS";
/// Default watchdog time. A minute: the emulated ranks are CPU threads that share the machine
/// with every other test, and under load one of them could spend over 10 s in emulated kernels
/// before reaching a collective (seen with 2 cores and a load of 13); a lost rank of a process
/// that exited is still reported within about 0.1 s.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// `ncclResult_t`: a newtype over the C enum (4 bytes), so a value this code does not name is
/// still representable.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NcclResult(pub u32);

impl NcclResult {
    pub const SUCCESS: NcclResult = NcclResult(0);
    pub const UNHANDLED_CUDA_ERROR: NcclResult = NcclResult(1);
    pub const SYSTEM_ERROR: NcclResult = NcclResult(2);
    pub const INTERNAL_ERROR: NcclResult = NcclResult(3);
    pub const INVALID_ARGUMENT: NcclResult = NcclResult(4);
    pub const INVALID_USAGE: NcclResult = NcclResult(5);
    pub const REMOTE_ERROR: NcclResult = NcclResult(6);
    pub const IN_PROGRESS: NcclResult = NcclResult(7);

    /// `ncclGetErrorString`'s text.
    pub fn describe(self) -> &'static str {
        match self.0 {
            0 => "no error",
            1 => "unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
            2 => "unhandled system error (run with NCCL_DEBUG=INFO for details)",
            3 => "internal error - please report this issue to the NCCL developers",
            4 => "invalid argument (run with NCCL_DEBUG=WARN for details)",
            5 => "invalid usage (run with NCCL_DEBUG=WARN for details)",
            6 => "remote process exited or there was a network error",
            7 => "NCCL operation in progress",
            _ => "unknown result code",
        }
    }
}

/// A failed RCCL call or collective: the result code and what went wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RcclFail {
    pub code: NcclResult,
    pub message: String,
}

impl RcclFail {
    pub fn new(code: NcclResult, message: impl Into<String>) -> RcclFail {
        RcclFail {
            code,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> RcclFail {
        RcclFail::new(NcclResult::INVALID_ARGUMENT, message)
    }

    pub fn usage(message: impl Into<String>) -> RcclFail {
        RcclFail::new(NcclResult::INVALID_USAGE, message)
    }
}

impl std::fmt::Display for RcclFail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.code.describe())
    }
}

/// The watchdog time from `HIPK_EMU_RCCL_TIMEOUT_MS` (unset or empty: the default).
pub fn timeout_from_env() -> Result<Duration, RcclFail> {
    parse_timeout(std::env::var(TIMEOUT_VAR).ok().as_deref())
}

pub fn parse_timeout(value: Option<&str>) -> Result<Duration, RcclFail> {
    match value.map(str::trim).filter(|v| !v.is_empty()) {
        None => Ok(DEFAULT_TIMEOUT),
        Some(v) => match v.parse::<u64>() {
            Ok(ms) if ms > 0 => Ok(Duration::from_millis(ms)),
            _ => Err(RcclFail::invalid(format!(
                "{TIMEOUT_VAR}={v:?} is not a positive number of milliseconds; set e.g. \
                 {TIMEOUT_VAR}=30000 or unset it for {} s",
                DEFAULT_TIMEOUT.as_secs()
            ))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeout_parses_or_names_the_variable() {
        assert_eq!(parse_timeout(None).unwrap(), DEFAULT_TIMEOUT);
        assert_eq!(parse_timeout(Some(" ")).unwrap(), DEFAULT_TIMEOUT);
        assert_eq!(
            parse_timeout(Some("250")).unwrap(),
            Duration::from_millis(250)
        );
        for bad in ["0", "-1", "2s"] {
            let err = parse_timeout(Some(bad)).unwrap_err();
            assert!(err.message.contains(TIMEOUT_VAR), "{err}");
            assert_eq!(err.code, NcclResult::INVALID_ARGUMENT);
        }
    }
}

/// The values and sizes of RCCL's `nccl.h` (ROCm/rccl `src/nccl.h.in`), which the exports must
/// match bit for bit.
#[cfg(test)]
mod abi_tests {
    use super::comm::UniqueId;
    use super::reduce::{DataType, RedOp};
    use super::NcclResult;

    #[test]
    fn enum_values_and_sizes_match_nccl_h() {
        let types = [
            (DataType::Int8, 0),
            (DataType::Uint8, 1),
            (DataType::Int32, 2),
            (DataType::Uint32, 3),
            (DataType::Int64, 4),
            (DataType::Uint64, 5),
            (DataType::Float16, 6),
            (DataType::Float32, 7),
            (DataType::Float64, 8),
            (DataType::Bfloat16, 9),
        ];
        for (t, v) in types {
            assert_eq!(t as u32, v, "{t:?}");
            assert_eq!(DataType::from_raw(v).unwrap(), t);
        }
        let ops = [
            (RedOp::Sum, 0),
            (RedOp::Prod, 1),
            (RedOp::Max, 2),
            (RedOp::Min, 3),
            (RedOp::Avg, 4),
        ];
        for (o, v) in ops {
            assert_eq!(o as u32, v, "{o:?}");
        }
        let results = [
            NcclResult::SUCCESS,
            NcclResult::UNHANDLED_CUDA_ERROR,
            NcclResult::SYSTEM_ERROR,
            NcclResult::INTERNAL_ERROR,
            NcclResult::INVALID_ARGUMENT,
            NcclResult::INVALID_USAGE,
            NcclResult::REMOTE_ERROR,
            NcclResult::IN_PROGRESS,
        ];
        for (i, r) in results.iter().enumerate() {
            assert_eq!(r.0 as usize, i);
        }
        assert_eq!(std::mem::size_of::<NcclResult>(), 4, "a C enum");
        assert_eq!(std::mem::size_of::<UniqueId>(), 128);
        assert_eq!(std::mem::align_of::<UniqueId>(), 1, "char internal[128]");
        // NCCL >= 2.9 encodes versions as X*10000 + Y*100 + Z; >= 2.10 has ncclAvg.
        const { assert!(super::VERSION >= 2_10_00) };
    }
}
