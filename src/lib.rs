//! hip-kernels: hand-written HIP kernels for training on Hygon DCU, with a CPU reference.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod cpu;
pub mod golden;
pub mod kernels;
pub mod ops;
pub mod params;
pub mod tolerance;
