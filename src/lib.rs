//! hip-kernels: hand-written HIP kernels for training on Hygon DCU, with a CPU reference.
#![deny(unsafe_op_in_unsafe_fn)]
#![doc = include_str!("../README.md")]

pub mod cpu;
pub mod embedded;
pub mod files;
#[cfg(feature = "golden")]
pub mod golden;
pub mod ops;
pub mod params;
pub mod tolerance;

/// The HIP runtime hip-kernels is built on, re-exported so device users need one dependency.
pub use hip_rt;

/// The Rust blocks of the guides in `docs/` run as doctests (plain blocks run, `no_run` blocks
/// compile), so a guide cannot drift from the API it shows.
#[cfg(doctest)]
pub mod guides {
    #[doc = include_str!("../docs/API-TOUR.md")]
    pub struct ApiTour;
    #[doc = include_str!("../docs/SEVERAL-DEVICES.md")]
    pub struct SeveralDevices;
}
