//! Safe HIP runtime (work in progress).
pub mod caching;
