//! hip-emu: an emulated HIP device on the CPU (see issue 11 and the crate README).
//!
//! Built as `libhip_emu.so`, it is a HIP runtime that hip-sys loads through
//! `HIPK_HIP_LIBRARY=<path>/libhip_emu.so` (and hipBLAS/rocBLAS through
//! `HIPK_HIPBLAS_LIBRARY` / `HIPK_ROCBLAS_LIBRARY` naming the same file). `runtime` exports the
//! HIP runtime C ABI, `blas` the BLAS entry points, `rccl` an emulated RCCL (`nccl.h`'s C ABI,
//! for `HIPK_RCCL_LIBRARY`), `exec` runs kernels compiled for the host, one fibre per GPU thread.
//!
//! Everything it computes is computed on the host CPU: no figure measured through it is a GPU
//! performance figure, and its device name says so.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod blas;
pub mod exec;
pub mod rccl;
pub mod runtime;
