//! Raw FFI to the HIP runtime (ROCm's `libamdhip64`, DTK's `libgalaxyhip`) and to hipBLAS and
//! rocBLAS, loaded at run time: nothing links at build time, and a machine without ROCm builds
//! and runs (every entry point then returns a typed [`Error`]).
//!
//! - [`hip()`] finds and loads the runtime once per process (search order: [`search::targets`])
//!   and never unloads it. [`Hip::api`] is the bindgen-generated table of entry points; resolve
//!   one with [`sym!`], which turns a missing export into [`Error::MissingSymbol`].
//! - Status codes are newtypes over the C integer ([`hipError_t`], [`blas::hipblasStatus_t`],
//!   [`blas::rocblas_status`]) with `.result()`.
//! - [`Hip::device_props`] reads `hipDeviceProp_t` in whichever layout the runtime uses (legacy
//!   on ROCm 5.x and DTK, R0600 on ROCm >= 6) and sanity-checks it. Prefer it to
//!   `hipDeviceGetAttribute`: the generated [`hipDeviceAttribute_t`] constants carry upstream
//!   ROCm's numbering, and DTK renumbers that enum (a stock value yields "invalid argument").
//! - [`blas::hipblas()`] / [`blas::rocblas()`] load the BLAS libraries independently: a missing BLAS
//!   never breaks the runtime.
//! - [`rccl::rccl()`] loads RCCL (collectives across devices) the same way; only `ncclGetVersion`
//!   is required, every other entry point is resolved on first use.
//!
//! ```no_run
//! fn main() -> Result<(), hip_sys::Error> {
//!     let hip = hip_sys::hip()?; // NotFound lists every place searched
//!     println!("{} ({}, {})", hip.path().display(), hip.flavour(), hip.runtime_version()?);
//!     let get_count = hip_sys::sym!(hipGetDeviceCount)?; // MissingSymbol if not exported
//!     let mut count = 0;
//!     // SAFETY: hipGetDeviceCount writes one int through a valid pointer.
//!     unsafe { get_count(&mut count) }.result()?; // NoDevice carries what to check
//!     for ordinal in 0..count {
//!         let props = hip.device_props(ordinal)?;
//!         println!("{ordinal}: {} {} wave{}", props.name, props.arch(), props.warp_size);
//!     }
//!     Ok(())
//! }
//! ```
//!
//! # Environment
//! - `HIPK_HIP_LIBRARY`, `HIPK_HIPBLAS_LIBRARY`, `HIPK_ROCBLAS_LIBRARY`, `HIPK_RCCL_LIBRARY`: the exact file to load
//!   (nothing else is tried when set).
//! - `HIP_PATH`, `ROCM_PATH`: install roots whose `lib/` (and `$ROCM_PATH/hip/lib`) are searched
//!   before `/opt/dtk/hip/lib`, `/opt/dtk/lib`, `/opt/rocm/lib` and the system loader
//!   (`LD_LIBRARY_PATH`). On DTK, `source /opt/dtk/env.sh` sets them.
//! - Build time, feature `bindgen` only: `HIPK_HIP_INCLUDE_DIR`, else `$ROCM_PATH/include`, else
//!   `/opt/rocm/include`: the headers to regenerate the bindings from.
//!
//! # Safety contract
//! Every function pointer obtained here is `unsafe extern "C"`: calling it requires the C API's
//! preconditions (valid pointers and sizes, handles from the same runtime, a current device).
//! The safe wrappers live in `hip-rt`.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod blas;
mod dl;
mod error;
pub mod generated;
mod loader;
pub mod props;
pub mod rccl;
pub mod search;
pub mod version;

pub use error::{builtin_strings, hint, Error, HipError};
pub use generated::{
    hipDeviceAttribute_t, hipDevice_t, hipDeviceptr_t, hipError_t, hipEvent_t,
    hipFunction_attribute, hipFunction_t, hipMemcpyKind, hipModule_t, hipStream_t, HipApi,
};
pub use libloading;
pub use loader::{hip, hip_search_report, load_from, Hip};
pub use props::{DeviceProps, PropsLayout};
pub use version::{Flavour, FlavourEvidence, RuntimeVersion};

/// Where each library search looked and what it found, for `hip-doctor`. Runs the searches that
/// have not run yet (each library is still loaded at most once per process).
#[derive(Debug, Clone)]
pub struct SearchReports {
    pub hip: search::SearchReport,
    pub hipblas: search::SearchReport,
    pub rocblas: search::SearchReport,
}

/// See [`SearchReports`].
pub fn search_report() -> SearchReports {
    SearchReports {
        hip: hip_search_report(),
        hipblas: blas::hipblas_search_report(),
        rocblas: blas::rocblas_search_report(),
    }
}
