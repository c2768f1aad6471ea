//! The thin layer: one fallible wrapper per HIP call, grouped by API prefix.
//!
//! Each function resolves its entry point on first use (a missing one is
//! `hip_sys::Error::MissingSymbol` naming it), makes the call, and turns the status into a
//! `Result`. No function here keeps state; the safe types above own the handles.
//!
//! Only the no-device paths of this layer have run (against Debian's ROCm 5.2 libamdhip64 with
//! no GPU): every call that needs a device is untested on hardware.

pub mod device;
pub mod error;
pub mod event;
pub mod memory;
pub mod module;
pub mod stream;

use hip_sys::HipApi;

use crate::error::Result;

/// Resolve one entry point of the HIP runtime: `hip_fn!(hipMalloc)`.
macro_rules! hip_fn {
    ($name:ident) => {
        $crate::result::lookup(stringify!($name), |api| &api.$name)
    };
}
pub(crate) use hip_fn;

/// Load the runtime (once per process) and pick one function pointer out of its table.
pub(crate) fn lookup<T: Copy>(
    name: &'static str,
    pick: impl FnOnce(&'static HipApi) -> &'static std::result::Result<T, libloading::Error>,
) -> Result<T> {
    let hip = hip_sys::hip()?;
    match pick(hip.api()) {
        Ok(f) => Ok(*f),
        Err(_) => Err(hip_sys::Error::MissingSymbol { name, library: hip.path().to_path_buf() }.into()),
    }
}
