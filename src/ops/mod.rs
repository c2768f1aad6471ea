//! The ops: one directory per op family (`src/ops/<family>/`) holding its parameters and
//! argument structs (`mod.rs`), CPU reference (`cpu.rs`, re-exported in [`crate::cpu`]), device
//! launcher (`device.rs`, re-exported here) and golden-case glue (`golden.rs`). See
//! `docs/ADDING-AN-OP.md`.
//!
//! Every launcher validates shapes, lengths and devices into [`OpError`] before launching
//! anything; without HIP kernels in the build it returns [`OpError::KernelsNotBuilt`]. Launchers
//! queue work and do not wait for the host unless their docs say so (`# Host sync`); the one
//! wait common to all of them is the first launch of a kernel source on a device, which loads
//! its code object ([`crate::embedded::loader::function`]). None of them has run on a GPU yet.

mod error;
pub(crate) mod launch;

pub use crate::params::DeviceElement;
pub use error::OpError;

use crate::embedded::KernelFile;
#[cfg(feature = "golden")]
use crate::golden::GoldenOp;

// The op families: each is a module `src/ops/<family>/` whose public items are re-exported
// here. Plain `mod` lines (not a macro) so that rustfmt and rust-analyzer see every module.
pub mod adamw;
pub mod attention;
pub mod bias;
pub mod clip;
pub mod crossentropy;
pub mod encoder;
pub mod gelu;
pub mod layernorm;
pub mod matmul;

pub use adamw::*;
pub use attention::*;
pub use bias::*;
pub use clip::*;
pub use crossentropy::*;
pub use encoder::*;
pub use gelu::*;
pub use layernorm::*;
pub use matmul::*;

/// Joins each family's `cpu` module (re-exported in [`crate::cpu`]), `KERNELS` and `GOLDEN` to
/// the registry. Adding a family is one `mod`, one `pub use` and one name in this list.
macro_rules! registry {
    ($($family:ident),* $(,)?) => {
        /// The CPU functions of every family (re-exported by [`crate::cpu`]).
        pub(crate) mod cpu_functions {
            $(pub use super::$family::cpu::*;)*
        }

        /// The kernel sources and the kernel names their launchers use, one entry per family.
        pub const KERNEL_FILES: &[KernelFile] = &[$($family::KERNELS),*];

        /// Every golden op of every family.
        #[cfg(feature = "golden")]
        pub fn registry() -> impl Iterator<Item = &'static GoldenOp> {
            [$($family::GOLDEN),*].into_iter().flatten()
        }
    };
}

registry! {
    matmul,
    layernorm,
    attention,
    adamw,
    encoder,
    gelu,
    crossentropy,
    bias,
    clip,
}

/// The golden op named `name` (the `op` metadata of a case file).
#[cfg(feature = "golden")]
pub fn golden_op(name: &str) -> Option<&'static GoldenOp> {
    registry().find(|op| op.name == name)
}

/// The names of every golden op, in registry order.
#[cfg(feature = "golden")]
pub fn golden_op_names() -> Vec<&'static str> {
    registry().map(|op| op.name).collect()
}

/// The kernels of `kernels/<source>.hip` its launchers use, if a family lists it.
pub fn kernel_names(source: &str) -> Option<&'static [&'static str]> {
    KERNEL_FILES
        .iter()
        .find(|f| f.source == source)
        .map(|f| f.kernels)
}
