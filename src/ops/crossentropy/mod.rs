//! Fused softmax + cross-entropy over `[rows, vocab]` logits (llm.c's fused classifier), with
//! PyTorch's `ignore_index = -100`, mean reduction or an explicit divisor, and the loss sum and
//! count of counted targets as outputs: the op's parameters and argument struct
//! ([`SoftmaxCrossEntropy`]), shared by the CPU reference ([`crate::cpu`]) and the launcher
//! (`kernels/crossentropy.hip`). [`LinearCrossEntropy`] (`linear.rs`) is the same loss of
//! `h·Wᵀ` computed in row chunks, so the `[rows, vocab]` logits never exist whole.

pub(crate) mod cpu;
mod device;
#[cfg(feature = "golden")]
mod golden;
mod linear;
mod linear_device;

pub use device::softmax_cross_entropy;
#[cfg(feature = "golden")]
pub(crate) use golden::GOLDEN;
#[cfg(feature = "golden")]
pub use golden::{CrossEntropyCase, LinearCrossEntropyCase};
pub use linear::{LinearCrossEntropy, LinearCrossEntropyParams, LinearCrossEntropyPlan};
pub use linear_device::linear_cross_entropy;

use crate::params::{check_len, checked_len, invalid, ShapeError, Space, TensorLen};

// Each struct runs itself on its space (`ops::Run`): the CPU reference, or the launcher.
crate::ops::run::launch! {
    SoftmaxCrossEntropy['a] T => softmax_cross_entropy, softmax_cross_entropy;
    LinearCrossEntropy['a] T => linear_cross_entropy, linear_cross_entropy;
}

/// The target value of a row that takes no part in the loss (PyTorch's default `ignore_index`).
pub const IGNORE_INDEX: i32 = -100;

/// Logits `[rows, padded_vocab]` of which the first `vocab` columns are classes (columns
/// `vocab..padded_vocab` are padding, e.g. a vocabulary rounded up to a multiple of 128), and the
/// upstream gradient.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CrossEntropyParams {
    /// Rows N (positions), may be 0.
    pub rows: usize,
    /// Classes V (≥ 1).
    pub vocab: usize,
    /// Row stride Vp of the logits (≥ `vocab`).
    pub padded_vocab: usize,
    /// Gradient of the mean loss (1 for a plain mean, `1/K` with K accumulation steps, times a
    /// loss scale; finite); `None` computes the losses only and leaves the logits unchanged.
    pub dloss: Option<f32>,
    /// What the loss sum is divided by, for `loss` and the gradient: `None` (what
    /// [`CrossEntropyParams::new`] sets) is the count of this call's counted targets (a plain
    /// mean); `Some(d)` (finite, > 0) is a count the caller knows, e.g. the counted targets of a
    /// whole step over its micro-batches and ranks, so that accumulated gradients and the summed
    /// `loss` of the micro-batches are the step's mean, not a mean of means.
    pub divisor: Option<f32>,
}

impl CrossEntropyParams {
    /// Operation name used in errors and kernel names.
    pub const OP: &'static str = "crossentropy";

    /// Unpadded logits `[rows, vocab]`, the gradient of a plain mean (`dloss = 1`).
    pub const fn new(rows: usize, vocab: usize) -> Self {
        Self {
            rows,
            vocab,
            padded_vocab: vocab,
            dloss: Some(1.0),
            divisor: None,
        }
    }

    /// Elements of `logits` (`[rows, padded_vocab]`).
    pub fn logits_len(&self) -> Result<usize, ShapeError> {
        checked_len(Self::OP, "logits", &[self.rows, self.padded_vocab])
    }

    /// Check that every target is in `0..vocab` or is [`IGNORE_INDEX`] (the CPU reference calls
    /// it; the device reports bad targets through the `error` flag).
    pub fn check_targets(&self, targets: &[i32]) -> Result<(), ShapeError> {
        crate::params::check_indices(Self::OP, "targets", targets, self.vocab, true, |i| {
            format!("row = {i}")
        })
    }
}

/// Per row: `loss = logsumexp(row[..V]) − row[target]`; with `dloss`, the logits are overwritten
/// by `dlogits = (softmax − onehot)·dloss/n` (n = the divisor: by default the rows not ignored),
/// padding and ignored rows 0.
pub struct SoftmaxCrossEntropy<'a, S: Space, T: hip_rt::Element> {
    /// Dimensions and `dloss`.
    pub params: CrossEntropyParams,
    /// Logits `[rows, padded_vocab]`; with `dloss`, overwritten by the gradient.
    pub logits: S::Out<'a, T>,
    /// Class per row, in `0..vocab` or [`IGNORE_INDEX`].
    pub targets: S::In<'a, i32>,
    /// Per-row loss (0 for ignored rows), overwritten.
    pub losses: S::Out<'a, f32>,
    /// Optional `[1]`: the loss sum over the counted rows divided by the divisor (the mean by
    /// default; NaN when all are ignored and no divisor is given). On the device it is computed
    /// there (no host sync); read it with the step's one read-back.
    pub loss: Option<S::Out<'a, f32>>,
    /// Optional `[2]`: the loss sum over the counted rows and their count are **added** to
    /// `totals[0]` and `totals[1]` (zero it once per step; micro-batches and ranks then sum into
    /// it, and `totals[0] / totals[1]` is the step's mean). The count is exact below 2^24.
    pub totals: Option<S::Out<'a, f32>>,
    /// Device only, optional: one `u32` set to the first row whose target is out of range, or
    /// `u32::MAX` (the CPU reference returns the error instead and ignores it).
    pub error: Option<S::Out<'a, u32>>,
}

impl<S: Space, T: hip_rt::Element> SoftmaxCrossEntropy<'_, S, T> {
    /// Check the dimensions, `dloss` and every length.
    pub fn validate(&self) -> Result<(), ShapeError> {
        let p = &self.params;
        let op = CrossEntropyParams::OP;
        if p.vocab == 0 {
            return Err(invalid(op, "vocab", 0, "must be at least 1"));
        }
        if p.padded_vocab < p.vocab {
            return Err(invalid(
                op,
                "padded_vocab",
                format!("{} (vocab = {})", p.padded_vocab, p.vocab),
                "must be at least vocab",
            ));
        }
        if let Some(d) = p.dloss.filter(|d| !d.is_finite()) {
            return Err(invalid(op, "dloss", d, "must be finite"));
        }
        check_divisor(op, p.divisor)?;
        check_len(op, "logits", p.logits_len()?, self.logits.numel())?;
        check_len(op, "targets", p.rows, self.targets.numel())?;
        check_len(op, "losses", p.rows, self.losses.numel())?;
        if let Some(l) = &self.loss {
            check_len(op, "loss", 1, l.numel())?;
        }
        if let Some(t) = &self.totals {
            check_len(op, "totals", 2, t.numel())?;
        }
        if let Some(e) = &self.error {
            check_len(op, "error", 1, e.numel())?;
        }
        Ok(())
    }
}

/// A given divisor must be finite and positive (a count of targets, or any positive scale).
pub(crate) fn check_divisor(op: &'static str, divisor: Option<f32>) -> Result<(), ShapeError> {
    match divisor {
        Some(d) if !(d.is_finite() && d > 0.0) => Err(invalid(
            op,
            "divisor",
            d,
            "must be finite and > 0 (None divides by this call's count of counted targets)",
        )),
        _ => Ok(()),
    }
}
