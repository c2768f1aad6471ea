//! Raw HIP FFI (work in progress).
