//! Safe HIP runtime (work in progress).
