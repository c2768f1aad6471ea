//! The error every device launcher returns.

use crate::embedded::{loader::LoadError, KernelsNotBuilt};
use crate::params::ShapeError;

/// Why a launcher did not (fully) run. Shape, dtype, length and device checks all happen before
/// anything is launched.
#[derive(thiserror::Error)]
pub enum OpError {
    /// Bad shape, length or hyper-parameter: the same error the CPU reference gives.
    #[error(transparent)]
    Shape(#[from] ShapeError),
    /// This build has no HIP kernels (no hipcc when it was compiled); the message says how to
    /// get hipcc.
    #[error(transparent)]
    KernelsNotBuilt(#[from] KernelsNotBuilt),
    /// The kernels could not be loaded on this device (e.g. no code object for its arch).
    #[error(transparent)]
    Load(LoadError),
    /// A HIP call failed (allocation, copy, launch), or a buffer is on another device.
    #[error(transparent)]
    Hip(#[from] hip_rt::Error),
    /// GEMM tuning failed: a bad `HIPK_GEMM_TUNING*` value, a corrupt results file, a file
    /// that could not be written, or no candidate ran ([`crate::ops::matmul::tuning`]).
    #[error(transparent)]
    Tuning(#[from] crate::ops::matmul::TuningError),
    /// The op has a CPU reference but no device kernel yet.
    #[error("{op}: no device kernel yet ({reason}); use the CPU reference (hip_kernels::cpu)")]
    NoKernel {
        /// Operation name.
        op: &'static str,
        /// What is missing.
        reason: &'static str,
    },
}

impl From<LoadError> for OpError {
    fn from(e: LoadError) -> Self {
        match e {
            LoadError::NotBuilt(n) => OpError::KernelsNotBuilt(n),
            other => OpError::Load(other),
        }
    }
}

/// The Debug form is the Display text (what happened, the values, and the hint), so that
/// `fn main() -> Result<(), Box<dyn std::error::Error>>` and `.unwrap()` print the whole
/// message rather than the bare fields.
impl std::fmt::Debug for OpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self}")
    }
}
