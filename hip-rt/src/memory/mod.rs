//! Device memory: the allocation trait, typed buffers and views, pinned host memory, copies.

pub mod alloc;
pub mod buffer;
mod copy;
pub mod pinned;
