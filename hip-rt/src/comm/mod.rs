//! Collectives across devices through RCCL (ROCm's NCCL, shipped by DTK), loaded at run time by
//! `hip_sys::rccl`.
//!
//! - [`Comm`]: one communicator per device and rank. [`Comm::init_all`] creates one per local
//!   device in one call (single process); [`Comm::init_rank`] creates this process's rank from a
//!   [`UniqueId`] that rank 0 made and passed on (one process per device, or several hosts).
//! - Collectives ([`Comm::all_reduce`], [`Comm::reduce_scatter`], [`Comm::all_gather`],
//!   [`Comm::broadcast`], [`Comm::reduce`], [`Comm::send`] / [`Comm::recv`], and `_in_place`
//!   forms) take hip-rt's device buffers and views of [`CommElement`] types (f32, f16, bf16,
//!   i32, u8) and a [`Stream`](crate::Stream) of the communicator's device. Lengths are checked
//!   before RCCL sees a pointer. Each is queued on the stream like a kernel, and each buffer is
//!   recorded with its allocator on that stream (a buffer freed while a collective still reads it
//!   is not handed out again before the collective ends).
//! - [`group`]: several communicators driven from one thread (`ncclGroupStart`/`End`).
//! - No silent hang: [`Comm::wait`] waits for this communicator's queued collectives for at most
//!   its timeout ([`Comm::set_timeout`], default `HIPK_COMM_TIMEOUT_S` or 300 s), polling their
//!   completion and `ncclCommGetAsyncError`. A collective that does not complete in time becomes
//!   [`CommError::Timeout`] naming it, and the communicator is aborted (`ncclCommAbort`). An
//!   asynchronous RCCL error, or a collective already past its deadline, surfaces at the next call
//!   on the communicator. `Drop` waits the same bounded time, then destroys or aborts; it never
//!   panics (errors go to [`Device::check_err`](crate::Device::check_err)).
//!
//! [`check`] runs and times collectives the way nccl-tests does (the `collectives` bench and
//! hip-doctor use it).
//!
//! Waiting on the stream itself (`Stream::synchronize`) instead of [`Comm::wait`] gives up the
//! timeout: a collective whose peers never arrive then blocks it for ever, as with RCCL directly.

pub mod check;
mod collectives;
mod communicator;
mod error;
mod group;
mod id;

pub use communicator::{
    default_timeout, parse_timeout, AbortHandle, Comm, DEFAULT_TIMEOUT, MAX_TIMEOUT, MIN_TIMEOUT,
    TIMEOUT_VAR,
};
pub use error::CommError;
pub use group::{group, GroupGuard};
pub use id::UniqueId;

use hip_sys::rccl::{ncclDataType_t, ncclRedOp_t, Rccl};

use crate::error::Result;
use crate::memory::buffer::Element;

/// Element types RCCL reduces and moves: f32, f16, bf16, i32, u8.
pub trait CommElement: Element + sealed::Sealed {
    /// The RCCL data type.
    const DTYPE: ncclDataType_t;
}

mod sealed {
    pub trait Sealed {}
}

macro_rules! comm_elements {
    ($($t:ty => $dtype:ident,)*) => {$(
        impl sealed::Sealed for $t {}
        impl CommElement for $t {
            const DTYPE: ncclDataType_t = ncclDataType_t::$dtype;
        }
    )*};
}
comm_elements! {
    f32 => ncclFloat32,
    half::f16 => ncclFloat16,
    half::bf16 => ncclBfloat16,
    i32 => ncclInt32,
    u8 => ncclUint8,
}

/// A reduction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Prod,
    Max,
    Min,
    /// The mean over ranks (RCCL releases based on NCCL >= 2.10; older ones refuse it with a
    /// typed error rather than being passed a value they do not know).
    Avg,
}

impl ReduceOp {
    /// Every operation, in RCCL's order.
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Avg,
    ];

    /// The RCCL value.
    pub fn raw(self) -> ncclRedOp_t {
        match self {
            ReduceOp::Sum => ncclRedOp_t::ncclSum,
            ReduceOp::Prod => ncclRedOp_t::ncclProd,
            ReduceOp::Max => ncclRedOp_t::ncclMax,
            ReduceOp::Min => ncclRedOp_t::ncclMin,
            ReduceOp::Avg => ncclRedOp_t::ncclAvg,
        }
    }

    /// Lower-case name, as nccl-tests prints it ("sum", "prod", ...).
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Avg => "avg",
        }
    }
}

/// RCCL, or the load error as a [`CommError::Rccl`] naming `op`.
pub(crate) fn rccl(op: &'static str, rank: usize) -> Result<&'static Rccl> {
    hip_sys::rccl::rccl().map_err(|source| CommError::Rccl { op, rank, source }.into())
}

/// `result`, with a hip-sys error wrapped as a [`CommError::Rccl`] naming `op`.
pub(crate) fn call<T>(
    op: &'static str,
    rank: usize,
    result: std::result::Result<T, hip_sys::Error>,
) -> Result<T> {
    result.map_err(|source| CommError::Rccl { op, rank, source }.into())
}

#[cfg(test)]
mod tests;
