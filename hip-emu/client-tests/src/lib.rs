//! No code: this package holds the tests that drive hip-emu as a client would, loading
//! libhip_emu.so through hip-sys and hip-rt (`tests/runtime_*.rs`, `tests/rccl_dlopen.rs`).
//! They live outside hip-emu so that hip-emu depends on neither hip-rt nor hip-kernels, not even
//! for its tests. The shared helpers are hip-emu's own `tests/common/mod.rs`.
