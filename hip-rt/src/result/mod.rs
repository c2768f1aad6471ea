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

/// Resolve one entry point of the HIP runtime (loading it on first use): `hip_fn!(hipMalloc)`.
/// A missing export is `hip_sys::Error::MissingSymbol` naming it.
macro_rules! hip_fn {
    ($name:ident) => {
        hip_sys::sym!($name).map_err($crate::error::Error::from)
    };
}
pub(crate) use hip_fn;
