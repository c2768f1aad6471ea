//! `hipMalloc` / `hipFree` / `hipHostMalloc` / `hipMemcpy*` / `hipMemset*`.

use std::ffi::c_void;

use hip_sys::hipStream_t;

use super::hip_fn;
use super::Result;
use crate::launch::DevicePtr;

/// `hipMalloc` of `bytes` (> 0) on the current device.
pub fn malloc(bytes: usize) -> Result<DevicePtr> {
    let f = hip_fn!(hipMalloc)?;
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: `p` is a valid out-pointer; the runtime validates the size.
    unsafe { f(&mut p, bytes) }.result()?;
    Ok(DevicePtr::from_raw(p))
}

/// `hipFree`.
///
/// # Safety
/// `ptr` must come from [`malloc`], be freed at most once, and not be used afterwards.
pub unsafe fn free(ptr: DevicePtr) -> Result<()> {
    let f = hip_fn!(hipFree)?;
    // SAFETY: the caller guarantees `ptr` is a live hipMalloc allocation, never used again.
    unsafe { f(ptr.as_raw()) }.result()
}

/// `hipHostMalloc`: page-locked host memory of `bytes` (> 0).
pub fn host_malloc(bytes: usize, flags: u32) -> Result<*mut c_void> {
    let f = hip_fn!(hipHostMalloc)?;
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: `p` is a valid out-pointer; the runtime validates size and flags.
    unsafe { f(&mut p, bytes, flags) }.result()?;
    Ok(p)
}

/// `hipHostFree`.
///
/// # Safety
/// `ptr` must come from [`host_malloc`], be freed at most once, and not be used afterwards
/// (including by pending asynchronous copies).
pub unsafe fn host_free(ptr: *mut c_void) -> Result<()> {
    let f = hip_fn!(hipHostFree)?;
    // SAFETY: the caller guarantees `ptr` is a live hipHostMalloc allocation, never used again.
    unsafe { f(ptr) }.result()
}

/// `hipMemcpyHtoDAsync` of `bytes`.
///
/// # Safety
/// `dst` must be device memory valid for `bytes`; `src` host memory valid for `bytes` reads
/// until the copy completes on `stream` (null or live).
pub unsafe fn copy_htod_async(
    dst: DevicePtr,
    src: *const c_void,
    bytes: usize,
    stream: hipStream_t,
) -> Result<()> {
    let f = hip_fn!(hipMemcpyHtoDAsync)?;
    // SAFETY: the caller guarantees both ranges are valid until completion; HIP only reads `src`.
    unsafe { f(dst.as_raw(), src.cast_mut(), bytes, stream) }.result()
}

/// `hipMemcpyDtoHAsync` of `bytes`.
///
/// # Safety
/// `src` must be device memory valid for `bytes`; `dst` host memory valid for `bytes` writes,
/// not accessed by the host until the copy completes on `stream` (null or live).
pub unsafe fn copy_dtoh_async(
    dst: *mut c_void,
    src: DevicePtr,
    bytes: usize,
    stream: hipStream_t,
) -> Result<()> {
    let f = hip_fn!(hipMemcpyDtoHAsync)?;
    // SAFETY: the caller guarantees both ranges are valid and unaliased until completion.
    unsafe { f(dst, src.as_raw(), bytes, stream) }.result()
}

/// `hipMemcpyDtoDAsync` of `bytes`.
///
/// # Safety
/// Both must be device memory valid for `bytes` until the copy completes on `stream`.
pub unsafe fn copy_dtod_async(
    dst: DevicePtr,
    src: DevicePtr,
    bytes: usize,
    stream: hipStream_t,
) -> Result<()> {
    let f = hip_fn!(hipMemcpyDtoDAsync)?;
    // SAFETY: the caller guarantees both device ranges are valid until completion.
    unsafe { f(dst.as_raw(), src.as_raw(), bytes, stream) }.result()
}

/// `hipMemsetD8Async`: set `bytes` bytes to `value`.
///
/// # Safety
/// `dst` must be device memory valid for `bytes` until the memset completes on `stream`.
pub unsafe fn memset_d8_async(
    dst: DevicePtr,
    value: u8,
    bytes: usize,
    stream: hipStream_t,
) -> Result<()> {
    let f = hip_fn!(hipMemsetD8Async)?;
    // SAFETY: the caller guarantees the device range is valid until completion.
    unsafe { f(dst.as_raw(), value, bytes, stream) }.result()
}

/// `hipMemcpyPeerAsync` of `bytes` from `src` on device `src_device` to `dst` on `dst_device`.
///
/// # Safety
/// `dst` must be memory of `dst_device` valid for `bytes` writes and `src` memory of
/// `src_device` valid for `bytes` reads, both until the copy completes on `stream` (null or
/// live).
pub unsafe fn copy_peer_async(
    dst: DevicePtr,
    dst_device: i32,
    src: DevicePtr,
    src_device: i32,
    bytes: usize,
    stream: hipStream_t,
) -> Result<()> {
    let f = hip_fn!(hipMemcpyPeerAsync)?;
    // SAFETY: the caller guarantees both ranges and the stream.
    unsafe {
        f(
            dst.as_raw(),
            dst_device,
            src.as_raw(),
            src_device,
            bytes,
            stream,
        )
    }
    .result()
}
