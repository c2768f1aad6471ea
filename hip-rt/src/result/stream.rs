//! `hipStream*`.

use hip_sys::{hipError_t, hipEvent_t, hipStream_t};

use super::hip_fn;
use super::Result;

/// `hipStreamCreateWithPriority` on the current device.
pub fn create(flags: u32, priority: i32) -> Result<hipStream_t> {
    let f = hip_fn!(hipStreamCreateWithPriority)?;
    let mut s: hipStream_t = std::ptr::null_mut();
    // SAFETY: `s` is a valid out-pointer; flags and priority are plain values the runtime checks.
    unsafe { f(&mut s, flags, priority) }.result()?;
    Ok(s)
}

/// `hipStreamDestroy`.
///
/// # Safety
/// `stream` must be a live stream created by [`create`], destroyed at most once, and not used
/// afterwards.
pub unsafe fn destroy(stream: hipStream_t) -> Result<()> {
    let f = hip_fn!(hipStreamDestroy)?;
    // SAFETY: the caller guarantees `stream` is live and never used again.
    unsafe { f(stream) }.result()
}

/// `hipStreamSynchronize`.
///
/// # Safety
/// `stream` must be null (the default stream) or a live stream.
pub unsafe fn synchronize(stream: hipStream_t) -> Result<()> {
    let f = hip_fn!(hipStreamSynchronize)?;
    // SAFETY: the caller guarantees `stream` is null or live.
    unsafe { f(stream) }.result()
}

/// `hipStreamQuery`: `true` when all its work has completed, `false` on hipErrorNotReady.
///
/// # Safety
/// `stream` must be null (the default stream) or a live stream.
pub unsafe fn query(stream: hipStream_t) -> Result<bool> {
    let f = hip_fn!(hipStreamQuery)?;
    // SAFETY: the caller guarantees `stream` is null or live.
    ready(unsafe { f(stream) })
}

/// `hipStreamWaitEvent`: later work on `stream` waits for `event`'s last record.
///
/// # Safety
/// `stream` must be null or live, and `event` live.
pub unsafe fn wait_event(stream: hipStream_t, event: hipEvent_t) -> Result<()> {
    let f = hip_fn!(hipStreamWaitEvent)?;
    // SAFETY: the caller guarantees both handles are valid; flags must be 0.
    unsafe { f(stream, event, 0) }.result()
}

/// Map a query status: success → `true`, not-ready → `false`, anything else → `Err`.
pub(crate) fn ready(status: hipError_t) -> Result<bool> {
    if status == hipError_t::hipErrorNotReady {
        return Ok(false);
    }
    status.result()?;
    Ok(true)
}
