//! Version, devices, properties, attributes, errors.

use std::ffi::{c_char, c_int, c_uint};

use hip_sys::generated::hipDeviceProp_t;
use hip_sys::props::layouts::LegacyProps;
use hip_sys::{hipDeviceAttribute_t, hipError_t};

use super::device::{copy_cstr, set_current_ordinal, PRIORITY_RANGE};
use super::error::{self, Fail};
use super::{hip_exports, out, runtime};

/// `hipRuntimeGetVersion` / `hipDriverGetVersion`: HIP 5.2.0, the API level hip-sys's bindings
/// were generated from.
pub const RUNTIME_VERSION: c_int = 50_200_000;

const _: () = assert!(std::mem::size_of::<LegacyProps>() == std::mem::size_of::<hipDeviceProp_t>());

hip_exports! {
    fn hipInit(flags: c_uint) {
        if flags != 0 {
            return Err(Fail::invalid(format!("hipInit flags must be 0, got {flags}")));
        }
        runtime().map(|_| ())
    }

    fn hipRuntimeGetVersion(version: *mut c_int) {
        // SAFETY: out-parameter per the C API contract.
        unsafe { out(version, RUNTIME_VERSION, "runtimeVersion") }
    }

    fn hipDriverGetVersion(version: *mut c_int) {
        // SAFETY: out-parameter per the C API contract.
        unsafe { out(version, RUNTIME_VERSION, "driverVersion") }
    }

    fn hipGetDeviceCount(count: *mut c_int) {
        let n = runtime()?.devices.len() as c_int;
        // SAFETY: out-parameter per the C API contract.
        unsafe { out(count, n, "count") }
    }

    fn hipSetDevice(ordinal: c_int) {
        runtime()?.device(ordinal)?;
        set_current_ordinal(ordinal);
        Ok(())
    }

    fn hipGetDevice(ordinal: *mut c_int) {
        let d = runtime()?.current()?.ordinal;
        // SAFETY: out-parameter per the C API contract.
        unsafe { out(ordinal, d, "deviceId") }
    }

    fn hipSetDeviceFlags(flags: c_uint) {
        runtime()?.current()?;
        if flags & !0xF != 0 {
            return Err(Fail::invalid(format!("hipSetDeviceFlags: unknown flags {flags:#x}")));
        }
        Ok(())
    }

    /// Fills the legacy (HIP 5.x, 792-byte) layout: hip-emu reports HIP 5.2 and does not
    /// export `hipGetDevicePropertiesR0600`, so hip-sys reads this one.
    fn hipGetDeviceProperties(prop: *mut hipDeviceProp_t, ordinal: c_int) {
        let props = runtime()?.device(ordinal)?.legacy_props();
        // SAFETY: `prop` is null or points at a hipDeviceProp_t, which has the size of
        // LegacyProps (asserted above); LegacyProps mirrors it field by field.
        unsafe { out(prop.cast::<LegacyProps>(), props, "prop") }
    }

    fn hipDeviceGetName(name: *mut c_char, len: c_int, ordinal: c_int) {
        runtime()?.device(ordinal)?;
        let len = usize::try_from(len).ok().filter(|l| *l > 0 && !name.is_null()).ok_or_else(|| {
            Fail::invalid(format!("hipDeviceGetName: buffer {name:p} of length {len} is unusable"))
        })?;
        // SAFETY: the caller provides `len` writable chars at `name` (checked non-null).
        let buf = unsafe { std::slice::from_raw_parts_mut(name, len) };
        copy_cstr(buf, super::device::DEVICE_NAME);
        Ok(())
    }

    fn hipDeviceGetPCIBusId(bus_id: *mut c_char, len: c_int, ordinal: c_int) {
        let id = runtime()?.device(ordinal)?.pci_bus_id();
        let len = usize::try_from(len).ok().filter(|l| *l > id.len() && !bus_id.is_null()).ok_or_else(|| {
            Fail::invalid(format!("hipDeviceGetPCIBusId: buffer {bus_id:p} of length {len} cannot hold {id:?}"))
        })?;
        // SAFETY: the caller provides `len` writable chars at `bus_id` (checked non-null).
        let buf = unsafe { std::slice::from_raw_parts_mut(bus_id, len) };
        copy_cstr(buf, &id);
        Ok(())
    }

    fn hipDeviceTotalMem(bytes: *mut usize, ordinal: c_int) {
        let total = runtime()?.device(ordinal)?.capacity;
        // SAFETY: out-parameter per the C API contract.
        unsafe { out(bytes, total, "bytes") }
    }

    fn hipDeviceGetAttribute(value: *mut c_int, attr: hipDeviceAttribute_t, ordinal: c_int) {
        let dev = runtime()?.device(ordinal)?;
        let v = dev.attribute(attr).ok_or_else(|| {
            Fail::invalid(format!(
                "hipDeviceGetAttribute: attribute {} is not emulated by hip-emu (upstream ROCm numbering)",
                attr.0
            ))
        })?;
        // SAFETY: out-parameter per the C API contract.
        unsafe { out(value, v, "pi") }
    }

    fn hipDeviceGetStreamPriorityRange(least: *mut c_int, greatest: *mut c_int) {
        runtime()?;
        // SAFETY: out-parameters per the C API contract (either may be null in HIP).
        unsafe {
            if !least.is_null() {
                out(least, PRIORITY_RANGE.0, "leastPriority")?;
            }
            if !greatest.is_null() {
                out(greatest, PRIORITY_RANGE.1, "greatestPriority")?;
            }
        }
        Ok(())
    }

    /// Waits for every stream of the current device; returns (once) any fault of its work.
    fn hipDeviceSynchronize() {
        let dev = runtime()?.current()?;
        super::graph::refuse_wait(Some(dev.ordinal), None, "hipDeviceSynchronize")?;
        super::stats::bump(super::stats::Counter::HostWaits);
        dev.executor.sync_all()
    }

    fn hipDeviceCanAccessPeer(can: *mut c_int, ordinal: c_int, peer: c_int) {
        let rt = runtime()?;
        rt.device(ordinal)?;
        rt.device(peer)?;
        // All emulated devices share the host's address space.
        // SAFETY: out-parameter per the C API contract.
        unsafe { out(can, c_int::from(ordinal != peer), "canAccessPeer") }
    }

    /// Lets kernels of the current device use `peer`'s memory (checked at every launch).
    fn hipDeviceEnablePeerAccess(peer: c_int, flags: c_uint) {
        if flags != 0 {
            return Err(Fail::invalid(format!("hipDeviceEnablePeerAccess flags must be 0, got {flags}")));
        }
        let rt = runtime()?;
        rt.set_peer_access(rt.current()?.ordinal, peer, true)
    }

    fn hipDeviceDisablePeerAccess(peer: c_int) {
        let rt = runtime()?;
        rt.set_peer_access(rt.current()?.ordinal, peer, false)
    }
}

/// `hipGetLastError`: this thread's last status, reset to success.
#[no_mangle]
pub extern "C" fn hipGetLastError() -> hipError_t {
    error::last_error(true)
}

/// `hipPeekAtLastError`: this thread's last status, kept.
#[no_mangle]
pub extern "C" fn hipPeekAtLastError() -> hipError_t {
    error::last_error(false)
}

/// `hipGetErrorName`: e.g. "hipErrorInvalidValue".
#[no_mangle]
pub extern "C" fn hipGetErrorName(code: hipError_t) -> *const c_char {
    error::intern(hip_sys::builtin_strings(code).0)
}

/// `hipGetErrorString`: the description, followed by the detail of the last error with this
/// code on this thread (e.g. which kernel argument was wrong).
#[no_mangle]
pub extern "C" fn hipGetErrorString(code: hipError_t) -> *const c_char {
    let generic = hip_sys::builtin_strings(code).1;
    match error::detail_for(code) {
        Some(detail) => error::intern(&format!("{generic} [{detail}]")),
        None => error::intern(generic),
    }
}

/// hip-emu only: the most recent detailed error message of this thread (empty if none). The
/// pointer stays valid for the life of the process.
#[no_mangle]
pub extern "C" fn hipemuLastErrorMessage() -> *const c_char {
    error::intern(&error::latest_detail().unwrap_or_default())
}
