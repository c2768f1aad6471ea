//! Readers for what `hipcc --genco` writes, with no HIP runtime and no GPU:
//!
//! - [`bundle`]: clang offload bundles (one code object per offload target), and
//!   [`bundle::CodeObjects`], which takes a bundle or a bare code object alike;
//! - [`compressed`]: compressed bundles (`CCOB`, zlib or zstd), decompressed with a bound;
//! - [`elf`]: the few ELF64 fields of an AMDGPU code object needed to diagnose it (its
//!   processor, its kernel symbols);
//! - [`emu`]: the key that ties a code object to its host build for the emulated device.
//!
//! Every read is bounds-checked: malformed or truncated input is an error
//! ([`bundle::BundleError`], [`elf::ElfError`]), never a panic. `hip-rt` re-exports both modules
//! as `hip_rt::module::{bundle, elf}`; the emulated device (`hip-emu`) reads its kernels'
//! bundles with them.

#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod bundle;
pub mod compressed;
pub mod demangle;
pub mod elf;
pub mod emu;
