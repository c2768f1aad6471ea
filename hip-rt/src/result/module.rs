//! `hipModule*` / `hipFuncGetAttribute`.

use std::ffi::{c_void, CStr};
use std::sync::OnceLock;

use hip_sys::{hipFunction_attribute, hipFunction_t, hipModule_t, hipStream_t};

use super::hip_fn;
use super::Result;
use crate::launch::LaunchConfig;

/// `hipModuleLoadData` on the current device.
///
/// # Safety
/// `image` must hold a complete code object or offload bundle: the runtime reads as many bytes
/// as the image's own headers claim.
pub unsafe fn load_data(image: &[u8]) -> Result<hipModule_t> {
    let f = hip_fn!(hipModuleLoadData)?;
    let mut m: hipModule_t = std::ptr::null_mut();
    // SAFETY: `m` is a valid out-pointer; the caller guarantees `image` is complete.
    unsafe { f(&mut m, image.as_ptr().cast()) }.result()?;
    Ok(m)
}

/// `hipModuleUnload`.
///
/// # Safety
/// `module` must be live, unloaded at most once; its functions must not be used afterwards.
pub unsafe fn unload(module: hipModule_t) -> Result<()> {
    let f = hip_fn!(hipModuleUnload)?;
    // SAFETY: the caller guarantees `module` is live and its functions are no longer used.
    unsafe { f(module) }.result()
}

/// `hipModuleGetFunction`.
///
/// # Safety
/// `module` must be live.
pub unsafe fn get_function(module: hipModule_t, name: &CStr) -> Result<hipFunction_t> {
    let f = hip_fn!(hipModuleGetFunction)?;
    let mut func: hipFunction_t = std::ptr::null_mut();
    // SAFETY: `func` is a valid out-pointer, `name` NUL-terminated, `module` live (caller).
    unsafe { f(&mut func, module, name.as_ptr()) }.result()?;
    Ok(func)
}

/// `hipModuleGetGlobal`: the device address and size in bytes of a module variable.
///
/// # Safety
/// `module` must be live.
pub unsafe fn get_global(module: hipModule_t, name: &CStr) -> Result<(crate::DevicePtr, usize)> {
    let f = hip_fn!(hipModuleGetGlobal)?;
    let mut ptr: hip_sys::hipDeviceptr_t = std::ptr::null_mut();
    let mut bytes = 0usize;
    // SAFETY: valid out-pointers, `name` NUL-terminated, `module` live (caller).
    unsafe { f(&mut ptr, &mut bytes, module, name.as_ptr()) }.result()?;
    Ok((crate::DevicePtr(ptr as u64), bytes))
}

/// `hipFuncGetAttribute`.
///
/// # Safety
/// `func` must be a live function of a live module.
pub unsafe fn func_attribute(func: hipFunction_t, attr: hipFunction_attribute) -> Result<i32> {
    let f = hip_fn!(hipFuncGetAttribute)?;
    let mut v = 0;
    // SAFETY: `v` is a valid out-pointer and `func` live (caller).
    unsafe { f(&mut v, attr, func) }.result()?;
    Ok(v)
}

/// `hipModuleLaunchKernel` with `kernelParams` (no `extra`).
///
/// # Safety
/// `func` must be live; `params` must point at one pointer per kernel parameter, in order, each
/// to a value of the parameter's type, valid until this call returns; `stream` null or live on
/// the function's device; device memory the kernel touches must stay valid until it completes.
pub unsafe fn launch_kernel(
    func: hipFunction_t,
    cfg: &LaunchConfig,
    stream: hipStream_t,
    params: *mut *mut c_void,
) -> Result<()> {
    let f = hip_fn!(hipModuleLaunchKernel)?;
    let (g, b) = (cfg.grid, cfg.block);
    // SAFETY: the caller guarantees the handles and the argument array as documented above.
    let status = unsafe {
        f(
            func,
            g.0,
            g.1,
            g.2,
            b.0,
            b.1,
            b.2,
            cfg.shared_mem_bytes,
            stream,
            params,
            std::ptr::null_mut(),
        )
    };
    status.result()
}

/// hip-emu's `hipemuSetLaunchArgSizes(count, sizes)`, if the loaded runtime exports it.
type AnnounceFn = unsafe extern "C" fn(usize, *const usize);

/// Tell the runtime the size of each argument of this thread's next launch, when it can check
/// them (hip-emu exports `hipemuSetLaunchArgSizes`; a real HIP runtime does not, and then this
/// does nothing). hip-emu compares them with the kernel's code-object metadata and fails the
/// launch with hipErrorInvalidValue naming the kernel and argument on a mismatch.
pub fn announce_arg_sizes(sizes: &[usize]) {
    static ANNOUNCE: OnceLock<Option<AnnounceFn>> = OnceLock::new();
    // SAFETY: hip-emu defines this symbol with exactly this prototype; no other runtime exports
    // the name.
    let f = ANNOUNCE
        .get_or_init(|| unsafe { crate::emu::symbol::<AnnounceFn>(b"hipemuSetLaunchArgSizes\0") });
    if let Some(f) = f {
        // SAFETY: `sizes` is a live slice of `sizes.len()` usizes for the duration of the call;
        // hip-emu copies it.
        unsafe { f(sizes.len(), sizes.as_ptr()) };
    }
}
