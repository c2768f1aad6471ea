//! A corpus of small HIP programs written the way HIP code usually is (plain C++ `__global__`
//! kernels, templates, overloads, namespaces, vector types, atomics, wave and cooperative-group
//! operations, dynamic LDS, device printf), in `kernels/`: hipcc builds each for gfx906 and
//! hip-build's host build compiles it for hip-emu. `tests/corpus.rs` runs every one on hip-emu
//! and checks it against a CPU result.

/// What hip-build generated: `BUNDLES`, `NOT_BUILT`, ...
#[allow(dead_code, clippy::all)]
pub mod kernels {
    pub use hip_build::ResourceUsage;

    /// One compiled source (the type the generated file fills in).
    #[derive(Clone, Copy, Debug)]
    pub struct Bundle {
        /// Source file stem.
        pub source: &'static str,
        /// The clang offload bundle hipcc wrote.
        pub bytes: &'static [u8],
    }

    /// The compiler's resource figures of one kernel.
    #[derive(Clone, Copy, Debug)]
    pub struct KernelResources {
        /// Source file stem.
        pub source: &'static str,
        /// Kernel symbol.
        pub kernel: &'static str,
        /// Target id.
        pub arch: &'static str,
        /// The figures.
        pub usage: ResourceUsage,
    }

    include!(concat!(env!("OUT_DIR"), "/kernels_gen.rs"));
}

/// A constant per kernel (`kernel_names::matmul_tiled::MATRIX_MULTIPLICATION_KERNEL_16U`, ...),
/// each the kernel's symbol.
#[allow(dead_code, clippy::all)]
pub mod kernel_names {
    include!(concat!(env!("OUT_DIR"), "/kernel_names.rs"));
}

/// The compiled bundle of `kernels/<source>.hip`, or why there is none.
pub fn bundle(source: &str) -> Result<&'static [u8], String> {
    if let Some(why) = kernels::NOT_BUILT {
        return Err(why.to_string());
    }
    kernels::BUNDLES
        .iter()
        .find(|b| b.source == source)
        .map(|b| b.bytes)
        .ok_or_else(|| format!("no bundle for kernels/{source}.hip"))
}
