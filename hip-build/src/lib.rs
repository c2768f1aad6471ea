//! Build HIP kernels from a `build.rs`: find hipcc, pick the DCU archs it accepts, compile every
//! `kernels/*.hip` into one clang offload bundle (`--genco`, a code object per arch), record the
//! compiler's per-kernel resource usage, and generate a Rust file that embeds the bundles.
//!
//! hip-kernels builds its own kernels with it; a trainer with its own HIP kernels does the same
//! in a few lines (the model is candle's `bindgen_cuda`):
//!
//! ```no_run
//! // build.rs of a downstream crate, with `hip-build` in [build-dependencies]
//! fn main() {
//!     hip_build::Builder::new("my-trainer") // prefix of warnings and errors
//!         .kernels_dir("kernels")           // relative to CARGO_MANIFEST_DIR (the default)
//!         .build();                         // writes $OUT_DIR/kernels_gen.rs
//! }
//! ```
//!
//! ```ignore
//! // src/lib.rs of that crate, with `hip-kernels` in [dependencies]
//! mod my_kernels {
//!     use hip_kernels::embedded::{Bundle, KernelResources, ResourceUsage};
//!     include!(concat!(env!("OUT_DIR"), "/kernels_gen.rs"));
//! }
//! // my_kernels::BUNDLES[i].bytes is what hip_kernels::hip_rt::Module::load takes;
//! // my_kernels::NOT_BUILT says why there are none.
//! ```
//!
//! The generated file defines `HIPCC` (`Option<&str>`: the hipcc used, `None` without one),
//! `HIPCC_VERSION` (`&str`), `ARCHS`, `NOT_BUILT` (`Option<&str>`: why there are no kernels),
//! `BUNDLES` and `RESOURCES` ([`detect::render_generated`]); every item is `#[allow(dead_code)]`,
//! so including it in a private module warns about nothing. A second one,
//! `$OUT_DIR/kernel_names.rs`, holds a constant per kernel name ([`names`]), read from the
//! compiled code objects (or, without kernels, from the file given to [`Builder::names_file`]).
//! Without hipcc the build still succeeds: it prints a `cargo:warning` saying how to get hipcc and
//! `NOT_BUILT` holds the reason (or it panics, with [`Builder::require`]). [`Builder::skip`]
//! writes the same file without looking for hipcc and without a warning (for a disabled cargo
//! feature). Archs the compiler rejects are dropped with one warning for the build.
//!
//! **hip-emu.** Each source is also compiled for the host ([`host`]: clang++ >= 15 against a shim
//! shipped in this crate) and installed as `$OUT_DIR/hipemu/<key>.so`, where hip-emu (the
//! emulated HIP device) finds it when the program loads that bundle: the crate's own kernels run
//! on hip-emu with no further step. Without a clang++ the kernels still build for the GPU.
//!
//! **Cache.** Compiles are cached by content (the source, every file of the kernels and include
//! directories, the flags, the archs, the compiler) in `<target dir>/hip-build-cache`
//! (`HIPK_BUILD_CACHE` overrides): a profile change or a rebuild with the same inputs copies the
//! cached bundle instead of running hipcc.
//!
//! **Downstream `Cargo.toml`.** hip-kernels' CPU reference (`hip_kernels::cpu`, the oracle of
//! device tests) is slow unoptimised; the project builds it with opt-level 1 in the dev profile,
//! and a crate that tests against it should do the same (Cargo takes profile settings from the
//! top-level workspace only, so hip-kernels' own setting does not reach you):
//!
//! ```toml
//! [profile.dev.package.hip-kernels]
//! opt-level = 1
//! ```
//!
//! Environment ([`detect::ENV_VARS`] and [`host::ENV_VARS`], each a `rerun-if-env-changed`;
//! `HIPK_BUILD_CACHE` is read as it is): `HIPK_HIPCC` (the hipcc
//! to use), `HIPCC`, `ROCM_PATH`, `HIP_PATH` (searched in that order, then `/opt/dtk`,
//! `/opt/rocm` and `PATH`), `HIPK_ARCH` (comma-separated target ids instead of the DCU set
//! [`detect::DCU_ARCHS`]; every one must be accepted).
//!
//! Besides `std`, only the small `hip-codeobj` reader is used: build scripts should stay light. The rules (search order, arch lists,
//! remark parsing, rendering) are in [`detect`], with table tests that need no hipcc.
#![deny(unsafe_op_in_unsafe_fn)]
#![forbid(unsafe_code)]
// The crate example is a whole build.rs, `fn main` included.
#![allow(clippy::needless_doctest_main)]

mod cache;
mod compile;
pub mod detect;
mod emu_build;
pub mod host;
pub mod names;
mod once;

pub use compile::{HIPCC_FLAGS, NAMES_OUT_FILE};
pub use detect::ResourceUsage;
pub use emu_build::HOST_DIR;

use std::path::{Path, PathBuf};

/// What a [`Builder`] produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every source compiled for these archs.
    Built {
        /// Target ids of every bundle.
        archs: Vec<String>,
        /// Source stems, sorted.
        sources: Vec<String>,
    },
    /// No kernels (the generated file's `NOT_BUILT` holds this reason).
    NotBuilt(String),
}

/// A kernel build for one crate; see the crate docs.
#[derive(Clone, Debug)]
pub struct Builder {
    name: String,
    kernels_dir: PathBuf,
    include_dirs: Vec<PathBuf>,
    flags: Vec<String>,
    out_file: String,
    required: Option<String>,
    names_file: Option<PathBuf>,
    source_archs: Vec<(String, Vec<String>)>,
}

impl Builder {
    /// A build whose messages start with `name` (usually the crate name). Defaults: sources in
    /// `kernels/` under `CARGO_MANIFEST_DIR`, output `$OUT_DIR/kernels_gen.rs`, hipcc optional.
    pub fn new(name: impl Into<String>) -> Builder {
        Builder {
            name: name.into(),
            kernels_dir: PathBuf::from("kernels"),
            include_dirs: Vec::new(),
            flags: Vec::new(),
            out_file: "kernels_gen.rs".into(),
            required: None,
            names_file: None,
            source_archs: Vec::new(),
        }
    }

    /// The directory holding the `*.hip` sources (relative paths are under
    /// `CARGO_MANIFEST_DIR`); it is also on the include path.
    pub fn kernels_dir(mut self, dir: impl Into<PathBuf>) -> Builder {
        self.kernels_dir = dir.into();
        self
    }

    /// Another include directory (e.g. hip-kernels' `kernels/` for `common.h`).
    pub fn include_dir(mut self, dir: impl Into<PathBuf>) -> Builder {
        self.include_dirs.push(dir.into());
        self
    }

    /// An extra hipcc flag, after [`HIPCC_FLAGS`].
    pub fn flag(mut self, flag: impl Into<String>) -> Builder {
        self.flags.push(flag.into());
        self
    }

    /// The generated file's name in `OUT_DIR` (default `kernels_gen.rs`).
    pub fn out_file(mut self, name: impl Into<String>) -> Builder {
        self.out_file = name.into();
        self
    }

    /// Panic instead of warning when the kernels cannot be built; `why` names what needs them
    /// (e.g. "the `device` feature").
    pub fn require(mut self, why: impl Into<String>) -> Builder {
        self.required = Some(why.into());
        self
    }

    /// The committed kernel-names file (relative paths are under `CARGO_MANIFEST_DIR`; format in
    /// [`names`]): the generated `$OUT_DIR/kernel_names.rs` ([`NAMES_OUT_FILE`]) takes its names
    /// from it when the kernels are not compiled, and from the compiled code objects when they
    /// are (with a warning if the file differs). Without it, a build without kernels has no
    /// kernel-name constants.
    pub fn names_file(mut self, path: impl Into<PathBuf>) -> Builder {
        self.names_file = Some(path.into());
        self
    }

    /// Also compile `<kernels_dir>/<source>.hip` for `archs` (target ids), besides the common
    /// archs: for a kernel that only some archs run (hip-kernels' matrix-core matmul on CDNA's
    /// gfx90a, which Debian's hipcc compiles, so that its code object is built and checked). Each
    /// extra arch is probed like the common ones and dropped with a `cargo:warning` when the
    /// compiler rejects it; that source's bundle then holds one more code object per accepted
    /// arch, and its resource rows name that arch.
    pub fn source_archs(mut self, source: &str, archs: &[&str]) -> Builder {
        let archs = archs.iter().map(|a| a.to_string()).collect();
        self.source_archs.push((source.to_string(), archs));
        self
    }

    /// Compile the kernels and write the generated file. Panics (a build error) when a compile
    /// fails, with the full command and stderr.
    pub fn build(self) -> Outcome {
        let manifest = PathBuf::from(env_var(&self.name, "CARGO_MANIFEST_DIR"));
        let out_dir = PathBuf::from(env_var(&self.name, "OUT_DIR"));
        let kernels_dir = manifest.join(&self.kernels_dir);
        let include_dirs: Vec<PathBuf> =
            self.include_dirs.iter().map(|d| manifest.join(d)).collect();
        let names_file = self.names_file.as_ref().map(|f| manifest.join(f));
        compile::Job {
            name: &self.name,
            kernels_dir: &kernels_dir,
            include_dirs: &include_dirs,
            flags: &self.flags,
            out_dir: &out_dir,
            manifest_dir: &manifest,
            out_file: &self.out_file,
            required: self.required.as_deref(),
            names_file: names_file.as_deref(),
            source_archs: &self.source_archs,
            version: String::new(),
        }
        .run()
    }

    /// Write the generated file with no kernels and `NOT_BUILT = reason`, without looking for
    /// hipcc and without a warning.
    pub fn skip(self, reason: &str) -> Outcome {
        let out_dir = PathBuf::from(env_var(&self.name, "OUT_DIR"));
        let text = detect::render_generated(None, "", &[], Some(reason), &[]);
        compile::write_if_changed(&self.name, &Path::new(&out_dir).join(&self.out_file), &text);
        let names_file = self
            .names_file
            .as_ref()
            .map(|f| PathBuf::from(env_var(&self.name, "CARGO_MANIFEST_DIR")).join(f));
        compile::write_names_from_file(&self.name, &out_dir, names_file.as_deref());
        Outcome::NotBuilt(reason.to_string())
    }
}

fn env_var(name: &str, var: &str) -> String {
    std::env::var(var)
        .unwrap_or_else(|_| panic!("{name}: cargo did not set {var} (run from build.rs)"))
}

#[cfg(test)]
mod detect_tests;
