//! Kernel execution: the host build of kernels/*.hip, its registry and the fibre scheduler.
