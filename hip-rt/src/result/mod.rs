//! The thin layer: one fallible wrapper per HIP call, grouped by API prefix.
//!
//! Each function resolves its entry point on first use (a missing one is
//! `hip_sys::Error::MissingSymbol` naming it), makes the call, and turns the status into a
//! `Result`. No function here keeps state; the safe types above own the handles.
//!
//! Its error type is the sys layer's, [`hip_sys::Error`] (the loader, a missing symbol, or a HIP
//! status code): this layer never depends on the safe layer's [`crate::Error`], which wraps it
//! (`Error::Sys`) and adds what only the safe types know.
//!
//! Only the no-device paths of this layer have run (against Debian's ROCm 5.2 libamdhip64 with
//! no GPU): every call that needs a device is untested on hardware.

/// What every wrapper of this layer returns.
pub type Result<T, E = hip_sys::Error> = std::result::Result<T, E>;

pub mod device;
pub mod error;
pub mod event;
pub mod graph;
pub mod memory;
pub mod module;
pub mod stream;

/// Resolve one entry point of the HIP runtime (loading it on first use): `hip_fn!(hipMalloc)`.
/// A missing export is `hip_sys::Error::MissingSymbol` naming it.
macro_rules! hip_fn {
    ($name:ident) => {
        hip_sys::sym!($name)
    };
}
pub(crate) use hip_fn;
