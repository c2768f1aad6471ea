//! hip-kernels: hand-written HIP kernels for training on Hygon DCU, with a CPU reference.
#![deny(unsafe_op_in_unsafe_fn)]
#![doc = include_str!("../README.md")]

pub mod cpu;
pub mod doctor;
pub mod golden;
pub mod kernels;
pub mod ops;
pub mod params;
pub mod tolerance;
