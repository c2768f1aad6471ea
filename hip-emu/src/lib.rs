//! hip-emu: an emulated HIP device on the CPU (see issue 11 and the crate README).
//!
//! `runtime` exports the HIP runtime C ABI (and the BLAS entry points); `exec` runs kernels
//! compiled for the host, one fibre per GPU thread.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod exec;
pub mod runtime;
