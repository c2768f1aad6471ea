//! Code objects: offload-bundle and ELF parsing (no GPU needed), module loading and kernels.

pub mod bundle;
pub mod elf;
