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
