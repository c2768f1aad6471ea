//! Safe HIP runtime (work in progress).
#![deny(unsafe_op_in_unsafe_fn)]

pub mod launch;
pub mod module;
