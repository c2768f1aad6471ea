//! Fused softmax + cross-entropy over `[rows, vocab]` logits (llm.c's fused classifier), with
//! PyTorch's `ignore_index = -100` and mean reduction: the op's parameters and argument struct
//! ([`SoftmaxCrossEntropy`]), shared by the CPU reference ([`crate::cpu`]) and the launcher
//! (`kernels/crossentropy.hip`).

pub(crate) mod cpu;
mod device;
#[cfg(feature = "golden")]
mod golden;

pub use device::softmax_cross_entropy;
#[cfg(feature = "golden")]
pub use golden::CrossEntropyCase;
#[cfg(feature = "golden")]
pub(crate) use golden::GOLDEN;

use crate::params::{check_len, checked_len, invalid, ShapeError, Space, TensorLen};

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
/// by `dlogits = (softmax − onehot)·dloss/n` (n = rows not ignored), padding and ignored rows 0.
pub struct SoftmaxCrossEntropy<'a, S: Space, T: hip_rt::Element> {
    /// Dimensions and `dloss`.
    pub params: CrossEntropyParams,
    /// Logits `[rows, padded_vocab]`; with `dloss`, overwritten by the gradient.
    pub logits: S::Out<'a, T>,
    /// Class per row, in `0..vocab` or [`IGNORE_INDEX`].
    pub targets: S::In<'a, i32>,
    /// Per-row loss (0 for ignored rows), overwritten.
    pub losses: S::Out<'a, f32>,
    /// Optional `[1]`: the mean loss over the counted rows (NaN when all are ignored). On the
    /// device it is computed there (no host sync); read it with the step's one read-back.
    pub loss: Option<S::Out<'a, f32>>,
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
        check_len(op, "logits", p.logits_len()?, self.logits.numel())?;
        check_len(op, "targets", p.rows, self.targets.numel())?;
        check_len(op, "losses", p.rows, self.losses.numel())?;
        if let Some(l) = &self.loss {
            check_len(op, "loss", 1, l.numel())?;
        }
        if let Some(e) = &self.error {
            check_len(op, "error", 1, e.numel())?;
        }
        Ok(())
    }
}
