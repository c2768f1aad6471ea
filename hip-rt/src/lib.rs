//! hip-rt: a safe HIP runtime for Rust, for Hygon DCU (DTK) and AMD GPUs (ROCm).
//!
//! # Layers
//! - [`result`]: one fallible wrapper per HIP call, grouped by API prefix (`result::stream::create`,
//!   `result::memory::copy_htod_async`). Raw handles in, `Result` out.
//! - The safe layer: [`Device`] (properties, limits, allocator, Drop-error log), [`Stream`],
//!   [`Event`], [`DeviceBuffer`] with borrow-checked views, [`PinnedHostBuffer`], [`Module`] /
//!   [`Function`] with a checked [`LaunchConfig`] and an unsafe argument builder, and [`Blas`]
//!   (hipBLAS, rocBLAS as fallback) for row-major GEMM, [`Graph`] / [`GraphExec`] (stream
//!   capture and replay), and [`Comm`] (RCCL collectives across
//!   devices, with a completion timeout), and [`ddp`] (data parallel on top of it: launcher
//!   variables, the unique-id rendezvous, the bucketed gradient reducer, ZeRO-1 shards).
//! - Pure logic usable without a GPU: [`module::bundle`] / [`module::elf`] (code-object
//!   inspection), [`launch`] (launch geometry and validation).
//!
//! # Safety contract
//! Safe functions cannot cause undefined behaviour on the host: lengths are checked before HIP
//! sees a pointer, views borrow their buffer, host memory used by an asynchronous copy is pinned
//! and waited for before the host touches it again. Kernel launches stay `unsafe`: hip-rt cannot
//! check that arguments match the kernel or that the kernel stays in bounds.
//! `Drop` never panics; errors there are recorded on the device ([`Device::check_err`]).
//!
//! # What has run where
//! No GPU was available while this crate was written. The pure modules ([`module::bundle`],
//! [`module::elf`], [`launch`], range/length checks, error mapping) are unit-tested. Every path
//! that needs a device (allocation, copies, streams, events, module load, launch, BLAS, peer
//! copies, collectives) runs in the device tests (`--features device`) on hip-emu, the
//! CPU-emulated HIP device with its emulated RCCL; against a real runtime it has only run up to
//! Debian's ROCm 5.2 `libamdhip64` answering hipErrorNoDevice. Nothing has run on hardware.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod blas;
pub mod caching;
pub mod comm;
pub mod ddp;
pub mod device;
mod device_memory;
pub mod emu;
pub mod error;
pub mod event;
pub mod graph;
pub mod launch;
pub mod memory;
pub mod module;
pub mod result;
pub mod stream;

pub use blas::{Batch, Blas, BlasBackend, Gemm, GemmElement};
pub use comm::{Comm, CommElement, CommError, ReduceOp, UniqueId};
pub use device::{Device, MemoryInfo, EMULATED_FIGURE_LABEL, EMULATED_NAME_MARK};
pub use error::{Error, Result};
pub use event::{Event, EventOptions};
pub use graph::{CaptureMode, CaptureStatus, Graph, GraphExec, UpdateRefused};
pub use launch::{
    DevicePtr, DeviceRepr, KernelArg, KernelArgs, LaunchConfig, LaunchError, LaunchLimits,
};
pub use memory::alloc::{DeviceAllocator, DirectAllocator, RawAllocation, RawStream};
pub use memory::buffer::{
    ChunksMut, DeviceBuffer, DeviceSlice, DeviceSliceMut, DeviceView, DeviceViewMut, Element,
};
pub use memory::pinned::PinnedHostBuffer;
pub use module::{DeviceGlobal, Function, LaunchBuilder, Module};
pub use stream::{Stream, StreamOptions};

/// Compiles the README's example as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
