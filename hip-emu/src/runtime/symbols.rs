//! Module variables by symbol: `hipMemcpyToSymbol(Async)`, `hipMemcpyFromSymbol(Async)`,
//! `hipGetSymbolAddress`, `hipGetSymbolSize`.
//!
//! In HIP the `symbol` argument is the address of the variable's host-side shadow
//! (`HIP_SYMBOL(var)`). hip-emu's equivalent is the variable's address in the loaded host build
//! of a module on the current device (what `dlsym` of the variable's symbol in that shared object
//! gives): it names that variable's device mirror, the one `hipModuleGetGlobal` hands out (made
//! on first use, see `super::globals`). The device address `hipModuleGetGlobal` returned is
//! accepted too. When one host build backs several loaded modules, the oldest module's mirror
//! is meant. Anything else is `hipErrorInvalidSymbol`.

use std::ffi::c_void;

use hip_sys::{hipError_t, hipMemcpyKind, hipStream_t};

use super::api_memory::{copy, sides};
use super::error::{Fail, Res};
use super::globals::{self, Mirror};
use super::module::modules_on;
use super::{hip_exports, out, runtime};
use crate::exec;

/// The mirror `symbol` names on the current device (see the module docs).
fn resolve(symbol: *const c_void, api: &str) -> Res<Mirror> {
    let device = runtime()?.current()?.ordinal;
    if symbol.is_null() {
        return Err(Fail::new(
            hipError_t::hipErrorInvalidSymbol,
            format!("{api}: symbol is a null pointer"),
        ));
    }
    let at = symbol as usize;
    let modules = modules_on(device);
    for m in &modules {
        let mirrors = m.mirrors.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(found) = mirrors.iter().find(|x| x.device_ptr == at || x.host == at) {
            return Ok(found.clone());
        }
    }
    for m in &modules {
        let Ok(key) = m.host_key.as_ref() else {
            continue;
        };
        let Ok(host) = exec::host::load_for_key(key) else {
            continue;
        };
        if let Some(g) = host.globals.iter().find(|g| g.addr == at) {
            return globals::get(m, g.name);
        }
    }
    Err(Fail::new(
        hipError_t::hipErrorInvalidSymbol,
        format!(
            "{api}: {symbol:p} is not a variable of a module loaded on device {device}: pass the \
             address of a `__device__` or `__constant__` variable in the module's host build \
             (hip-emu's HIP_SYMBOL(var): dlsym of its symbol in that shared object) or the device \
             address hipModuleGetGlobal returned, after hipModuleLoadData"
        ),
    ))
}

/// The device address of bytes `offset..offset + bytes` of the variable `symbol` names.
fn range(symbol: *const c_void, offset: usize, bytes: usize, api: &str) -> Res<usize> {
    let m = resolve(symbol, api)?;
    match offset.checked_add(bytes) {
        Some(end) if end <= m.size => Ok(m.device_ptr + offset),
        _ => Err(Fail::invalid(format!(
            "{api}: {bytes} bytes at offset {offset} do not fit in variable `{}` ({} bytes)",
            m.symbol, m.size
        ))),
    }
}

/// Copies into a variable: queued on `stream`, or (`None`) on the null stream and waited for.
fn to_symbol(
    symbol: *const c_void,
    src: *const c_void,
    bytes: usize,
    offset: usize,
    kind: hipMemcpyKind,
    stream: Option<hipStream_t>,
    api: &str,
) -> Res {
    let dst = range(symbol, offset, bytes, api)?;
    let s = sides(kind, dst, src as usize)?;
    copy(
        api,
        dst,
        src as usize,
        bytes,
        s,
        stream.unwrap_or(std::ptr::null_mut()),
        stream.is_none(),
    )
}

/// Copies out of a variable (`stream` as [`to_symbol`]).
fn from_symbol(
    dst: *mut c_void,
    symbol: *const c_void,
    bytes: usize,
    offset: usize,
    kind: hipMemcpyKind,
    stream: Option<hipStream_t>,
    api: &str,
) -> Res {
    let src = range(symbol, offset, bytes, api)?;
    let s = sides(kind, dst as usize, src)?;
    copy(
        api,
        dst as usize,
        src,
        bytes,
        s,
        stream.unwrap_or(std::ptr::null_mut()),
        stream.is_none(),
    )
}

hip_exports! {
    fn hipMemcpyToSymbol(symbol: *const c_void, src: *const c_void, bytes: usize, offset: usize, kind: hipMemcpyKind) {
        to_symbol(symbol, src, bytes, offset, kind, None, "hipMemcpyToSymbol")
    }

    fn hipMemcpyToSymbolAsync(symbol: *const c_void, src: *const c_void, bytes: usize, offset: usize, kind: hipMemcpyKind, stream: hipStream_t) {
        to_symbol(symbol, src, bytes, offset, kind, Some(stream), "hipMemcpyToSymbolAsync")
    }

    fn hipMemcpyFromSymbol(dst: *mut c_void, symbol: *const c_void, bytes: usize, offset: usize, kind: hipMemcpyKind) {
        from_symbol(dst, symbol, bytes, offset, kind, None, "hipMemcpyFromSymbol")
    }

    fn hipMemcpyFromSymbolAsync(dst: *mut c_void, symbol: *const c_void, bytes: usize, offset: usize, kind: hipMemcpyKind, stream: hipStream_t) {
        from_symbol(dst, symbol, bytes, offset, kind, Some(stream), "hipMemcpyFromSymbolAsync")
    }

    fn hipGetSymbolAddress(dev_ptr: *mut *mut c_void, symbol: *const c_void) {
        let m = resolve(symbol, "hipGetSymbolAddress")?;
        // SAFETY: out-parameter per the C API contract.
        unsafe { out(dev_ptr, m.device_ptr as *mut c_void, "devPtr") }
    }

    fn hipGetSymbolSize(size: *mut usize, symbol: *const c_void) {
        let m = resolve(symbol, "hipGetSymbolSize")?;
        // SAFETY: out-parameter per the C API contract.
        unsafe { out(size, m.size, "size") }
    }
}
