//! `__device__` and `__constant__` variables: `hipModuleGetGlobal`. A variable lives in its
//! module's host build (a global of the shared object, `crate::exec::host::GlobalInfo`); the
//! first `hipModuleGetGlobal` of it gives it a mirror in device memory (an ordinary allocation of
//! the module's device, with its guards and range checks), holding the variable's initial bytes.
//! Every launch of a kernel of that module copies each mirror into its variable before the
//! kernel runs and back after it (on the executor thread, launches being serialised), so what
//! the host writes through the pointer is what the kernel reads, and the reverse. The mirrors are
//! freed when the module is unloaded.

use std::ffi::{c_char, c_void, CStr};

use hip_sys::{hipDeviceptr_t, hipError_t, hipModule_t};

use super::error::{Fail, Res};
use super::memory::{self, Owner};
use super::module::{module, Module};
use super::{hip_exports, out, runtime};
use crate::exec;

/// A variable and its device mirror.
#[derive(Debug, Clone)]
pub struct Mirror {
    /// The variable's symbol.
    pub symbol: String,
    /// Its address in the host build.
    pub host: usize,
    /// Its size in bytes.
    pub size: usize,
    /// The mirror's device address.
    pub device_ptr: usize,
}

/// The variable `name` (its symbol, or its demangled C++ name) of `m`'s host build.
fn find(m: &Module, name: &str) -> Res<exec::host::GlobalInfo> {
    let not_found = |why: String| {
        Fail::new(
            hipError_t::hipErrorNotFound,
            format!("hipModuleGetGlobal: variable `{name}`: {why}"),
        )
    };
    let key = m.host_key.clone().map_err(not_found)?;
    let host = exec::host::load_for_key(&key).map_err(not_found)?;
    let readable = |s: &str| hip_codeobj::demangle::demangle_name(s).unwrap_or_else(|| s.into());
    host.globals
        .iter()
        .find(|g| g.name == name)
        .or_else(|| host.globals.iter().find(|g| readable(g.name) == name))
        .copied()
        .ok_or_else(|| {
            let names: Vec<String> = host.globals.iter().map(|g| readable(g.name)).collect();
            not_found(format!(
                "the module's host build {} defines the variables {names:?} (a `static` or \
                 namespace-scope `const` variable has internal linkage and is not exported)",
                host.path.display()
            ))
        })
}

/// The mirror of `name` in module `m` (made on first use).
pub(super) fn get(m: &Module, name: &str) -> Res<Mirror> {
    let mut mirrors = m.mirrors.lock().unwrap_or_else(|p| p.into_inner());
    let g = find(m, name)?;
    if let Some(existing) = mirrors.iter().find(|x| x.symbol == g.name) {
        return Ok(existing.clone());
    }
    if g.size == 0 {
        return Err(Fail::invalid(format!(
            "hipModuleGetGlobal: variable `{name}` has no bytes"
        )));
    }
    let dev = runtime()?.device(m.device)?;
    let what = format!("hipModuleGetGlobal({name})");
    dev.charge(g.size.next_multiple_of(memory::ALIGN), &what)?;
    let alloc = match memory::allocate(g.size, Owner::Device(m.device)) {
        Ok(a) => a,
        Err(e) => {
            dev.release(g.size.next_multiple_of(memory::ALIGN));
            return Err(e);
        }
    };
    // SAFETY: the variable is `size` bytes of the loaded (never unloaded) host build; the new
    // allocation holds at least `size` writable bytes; they do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(g.addr as *const u8, alloc.start as *mut u8, g.size) };
    let mirror = Mirror {
        symbol: g.name.to_string(),
        host: g.addr,
        size: g.size,
        device_ptr: alloc.start,
    };
    mirrors.push(mirror.clone());
    Ok(mirror)
}

/// Which way [`sync`] copies.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Device mirror -> variable (before a launch).
    In,
    /// Variable -> device mirror (after it).
    Out,
}

/// Copies every mirror of a launch's module (a mirror freed by the program is skipped).
pub fn sync(mirrors: &[Mirror], direction: Direction) {
    for m in mirrors {
        if memory::check_range(m.device_ptr, m.size, "a module variable").is_err() {
            continue;
        }
        let (src, dst) = match direction {
            Direction::In => (m.device_ptr, m.host),
            Direction::Out => (m.host, m.device_ptr),
        };
        // SAFETY: both are `size` bytes: the live mirror (checked above) and the variable of a
        // host build that stays loaded; launches are serialised, so nothing else touches them.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, m.size) };
    }
}

/// Frees the mirrors of an unloaded module.
pub fn free_all(m: &Module) {
    let mirrors = std::mem::take(&mut *m.mirrors.lock().unwrap_or_else(|p| p.into_inner()));
    for x in mirrors {
        if let Ok(a) = memory::free(x.device_ptr, false) {
            if let Ok(dev) = runtime().and_then(|rt| rt.device(m.device)) {
                dev.release(a.rounded);
            }
        }
    }
}

hip_exports! {
    /// The device address and size of a module's `__device__` / `__constant__` variable, by
    /// symbol or demangled name (see the module docs: a mirror in device memory).
    fn hipModuleGetGlobal(dptr: *mut hipDeviceptr_t, bytes: *mut usize, hmod: hipModule_t, name: *const c_char) {
        runtime()?;
        if name.is_null() {
            return Err(Fail::invalid("hipModuleGetGlobal: name is a null pointer"));
        }
        // SAFETY: a non-null, NUL-terminated C string per the C API contract.
        let name = unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned();
        let m = module(hmod)?;
        let mirror = get(&m, &name)?;
        if !dptr.is_null() {
            // SAFETY: out-parameter per the C API contract (null: not wanted).
            unsafe { out(dptr, mirror.device_ptr as *mut c_void, "dptr") }?;
        }
        if !bytes.is_null() {
            // SAFETY: as above.
            unsafe { out(bytes, mirror.size, "bytes") }?;
        }
        Ok(())
    }
}
