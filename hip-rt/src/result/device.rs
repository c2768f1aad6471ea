//! `hipGetDevice*` / `hipSetDevice` / `hipDevice*` / `hipMemGetInfo`.

use std::ffi::{c_char, CStr};

use super::hip_fn;
use super::Result;

/// `hipGetDeviceCount`. With no device, the runtime answers hipErrorNoDevice (an `Err`).
pub fn count() -> Result<i32> {
    let f = hip_fn!(hipGetDeviceCount)?;
    let mut n = 0;
    // SAFETY: `n` is a valid, writable int for the duration of the call.
    unsafe { f(&mut n) }.result()?;
    Ok(n)
}

/// `hipSetDevice`: make `ordinal` this thread's current device.
pub fn set(ordinal: i32) -> Result<()> {
    let f = hip_fn!(hipSetDevice)?;
    // SAFETY: takes a plain integer; the runtime validates the ordinal.
    unsafe { f(ordinal) }.result()
}

/// `hipGetDevice`: this thread's current device.
pub fn current() -> Result<i32> {
    let f = hip_fn!(hipGetDevice)?;
    let mut d = 0;
    // SAFETY: `d` is a valid, writable int for the duration of the call.
    unsafe { f(&mut d) }.result()?;
    Ok(d)
}

/// `hipDeviceSynchronize`: wait for all work on the current device.
pub fn synchronize() -> Result<()> {
    let f = hip_fn!(hipDeviceSynchronize)?;
    // SAFETY: takes no arguments.
    unsafe { f() }.result()
}

/// `hipMemGetInfo`: `(free, total)` bytes of the current device.
pub fn mem_info() -> Result<(usize, usize)> {
    let f = hip_fn!(hipMemGetInfo)?;
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: both out-pointers are valid, writable usizes for the duration of the call.
    unsafe { f(&mut free, &mut total) }.result()?;
    Ok((free, total))
}

/// `hipDeviceGetPCIBusId`: e.g. `0000:03:00.0`.
pub fn pci_bus_id(ordinal: i32) -> Result<String> {
    let f = hip_fn!(hipDeviceGetPCIBusId)?;
    let mut buf = [0 as c_char; 64];
    // SAFETY: `buf` is writable for the 64 bytes we pass as its length; the runtime writes a
    // NUL-terminated string of at most that length.
    unsafe { f(buf.as_mut_ptr(), buf.len() as i32, ordinal) }.result()?;
    buf[buf.len() - 1] = 0;
    // SAFETY: `buf` is NUL-terminated (last byte forced to 0 above) and lives across the read.
    Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned())
}

/// `hipDeviceGetStreamPriorityRange`: `(least, greatest)`; greater priority = lower number.
pub fn stream_priority_range() -> Result<(i32, i32)> {
    let f = hip_fn!(hipDeviceGetStreamPriorityRange)?;
    let (mut least, mut greatest) = (0, 0);
    // SAFETY: both out-pointers are valid, writable ints for the duration of the call.
    unsafe { f(&mut least, &mut greatest) }.result()?;
    Ok((least, greatest))
}

/// `hipDeviceCanAccessPeer`: whether device `ordinal` can access `peer`'s memory.
pub fn can_access_peer(ordinal: i32, peer: i32) -> Result<bool> {
    let f = hip_fn!(hipDeviceCanAccessPeer)?;
    let mut can = 0;
    // SAFETY: `can` is a valid, writable int for the duration of the call.
    unsafe { f(&mut can, ordinal, peer) }.result()?;
    Ok(can != 0)
}

/// `hipDeviceEnablePeerAccess`: let the current device access `peer`'s memory.
pub fn enable_peer_access(peer: i32) -> Result<()> {
    let f = hip_fn!(hipDeviceEnablePeerAccess)?;
    // SAFETY: plain integers; the runtime validates them.
    unsafe { f(peer, 0) }.result()
}

/// `hipDeviceDisablePeerAccess`.
pub fn disable_peer_access(peer: i32) -> Result<()> {
    let f = hip_fn!(hipDeviceDisablePeerAccess)?;
    // SAFETY: a plain integer; the runtime validates it.
    unsafe { f(peer) }.result()
}
