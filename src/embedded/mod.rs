//! The HIP kernels embedded in this build: offload bundles, their resource table, and the
//! loader. (The kernel names each launcher uses are declared with its op, in
//! `src/ops/<family>/mod.rs`, and collected in [`crate::ops::KERNEL_FILES`].)
//!
//! `build.rs` compiles every `kernels/*.hip` with hipcc through the `hip-build` crate
//! (`--genco`, one clang offload bundle per source holding a code object for each selected arch)
//! and generates the constants read here. Without hipcc the crate still builds: [`bundle`] then returns [`KernelsNotBuilt`],
//! which says how to get hipcc.
//!
//! The kernels have been compiled and statically checked (registers, scratch, occupancy) for
//! gfx906 only; none has run on a GPU in this repository's CI.

pub mod loader;
mod table;

pub use hip_build::ResourceUsage;
pub use table::format_resource_table;

/// The kernels one source file exports, as its launchers name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelFile {
    /// File stem under `kernels/`.
    pub source: &'static str,
    /// Exported `extern "C"` kernel names.
    pub kernels: &'static [&'static str],
}

/// One embedded offload bundle: the compiled form of `kernels/<source>.hip`.
#[derive(Clone, Copy, Debug)]
pub struct Bundle {
    /// Source file stem (`layernorm` for `kernels/layernorm.hip`).
    pub source: &'static str,
    /// The clang offload bundle as hipcc wrote it (what `hipModuleLoadData` accepts).
    pub bytes: &'static [u8],
}

/// Compiler-reported resource usage of one kernel for one arch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelResources {
    /// Source file stem.
    pub source: &'static str,
    /// Exported kernel symbol.
    pub kernel: &'static str,
    /// Target id it was compiled for (`gfx906`).
    pub arch: &'static str,
    /// Registers, scratch, spills, LDS and occupancy.
    pub usage: ResourceUsage,
}

#[allow(clippy::all, unused_imports)]
mod generated {
    use super::{Bundle, KernelResources, ResourceUsage};
    include!(concat!(env!("OUT_DIR"), "/kernels_gen.rs"));
}

/// The kernels of this build are not available.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "HIP kernels for `{source_name}` are not in this build of hip-kernels: {reason}. To get \
     them, {how}",
    how = hip_build::detect::HOW_TO_GET_HIPCC
)]
pub struct KernelsNotBuilt {
    /// The kernel source that was asked for.
    pub source_name: String,
    /// Why it is missing (no hipcc, no accepted arch, or no such source).
    pub reason: String,
}

/// Every embedded bundle (empty when the kernels were not built).
pub fn bundles() -> &'static [Bundle] {
    generated::BUNDLES
}

/// The bundle compiled from `kernels/<source>.hip`.
pub fn bundle(source: &str) -> Result<&'static Bundle, KernelsNotBuilt> {
    if let Some(reason) = generated::NOT_BUILT {
        return Err(KernelsNotBuilt {
            source_name: source.to_string(),
            reason: reason.to_string(),
        });
    }
    generated::BUNDLES
        .iter()
        .find(|b| b.source == source)
        .ok_or_else(|| KernelsNotBuilt {
            source_name: source.to_string(),
            reason: format!("no kernels/{source}.hip was compiled into this build"),
        })
}

/// Why the kernels were not built, or `None` when they were.
pub fn not_built_reason() -> Option<&'static str> {
    generated::NOT_BUILT
}

/// Target ids every bundle holds a code object for (empty when not built).
pub fn archs() -> &'static [&'static str] {
    generated::ARCHS
}

/// Path of the hipcc that built the kernels, if one was found.
pub fn hipcc() -> Option<&'static str> {
    generated::HIPCC
}

/// First line of that hipcc's `--version` output.
pub fn hipcc_version() -> &'static str {
    generated::HIPCC_VERSION
}

/// Resource usage of every kernel for every arch, in source and compile order.
pub fn resources() -> &'static [KernelResources] {
    generated::RESOURCES
}

/// Resource usage of one kernel for one target id (`gfx906`), if it was recorded.
pub fn resource(kernel: &str, arch: &str) -> Option<&'static KernelResources> {
    generated::RESOURCES
        .iter()
        .find(|r| r.kernel == kernel && r.arch == arch)
}
