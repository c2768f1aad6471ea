//! `hipEvent*`.

use hip_sys::{hipEvent_t, hipStream_t};

use super::hip_fn;
use super::stream::ready;
use super::Result;

/// `hipEventCreateWithFlags` on the current device.
pub fn create(flags: u32) -> Result<hipEvent_t> {
    let f = hip_fn!(hipEventCreateWithFlags)?;
    let mut e: hipEvent_t = std::ptr::null_mut();
    // SAFETY: `e` is a valid out-pointer; the runtime validates the flags.
    unsafe { f(&mut e, flags) }.result()?;
    Ok(e)
}

/// `hipEventDestroy`.
///
/// # Safety
/// `event` must be live, destroyed at most once, and not used afterwards.
pub unsafe fn destroy(event: hipEvent_t) -> Result<()> {
    let f = hip_fn!(hipEventDestroy)?;
    // SAFETY: the caller guarantees `event` is live and never used again.
    unsafe { f(event) }.result()
}

/// `hipEventRecord`.
///
/// # Safety
/// `event` must be live and `stream` null or live, both on the same device.
pub unsafe fn record(event: hipEvent_t, stream: hipStream_t) -> Result<()> {
    let f = hip_fn!(hipEventRecord)?;
    // SAFETY: the caller guarantees both handles are valid and on one device.
    unsafe { f(event, stream) }.result()
}

/// `hipEventSynchronize`.
///
/// # Safety
/// `event` must be live.
pub unsafe fn synchronize(event: hipEvent_t) -> Result<()> {
    let f = hip_fn!(hipEventSynchronize)?;
    // SAFETY: the caller guarantees `event` is live.
    unsafe { f(event) }.result()
}

/// `hipEventQuery`: `true` once the recorded work completed, `false` on hipErrorNotReady.
///
/// # Safety
/// `event` must be live.
pub unsafe fn query(event: hipEvent_t) -> Result<bool> {
    let f = hip_fn!(hipEventQuery)?;
    // SAFETY: the caller guarantees `event` is live.
    ready(unsafe { f(event) })
}

/// `hipEventElapsedTime` in milliseconds between two completed, timing-enabled events.
///
/// # Safety
/// Both events must be live.
pub unsafe fn elapsed_ms(start: hipEvent_t, end: hipEvent_t) -> Result<f32> {
    let f = hip_fn!(hipEventElapsedTime)?;
    let mut ms = 0f32;
    // SAFETY: `ms` is a valid out-pointer; the caller guarantees both events are live.
    unsafe { f(&mut ms, start, end) }.result()?;
    Ok(ms)
}
