//! Fused softmax + cross-entropy over `[rows, vocab]` logits (llm.c's fused classifier), with
//! PyTorch's `ignore_index = -100` and mean reduction; f64 internally.

use super::error::check_indices;
use super::{Element, OpError, ShapeError};
use crate::params::{check_len, checked_len};

/// The target value of a row that takes no part in the loss (PyTorch's default `ignore_index`).
pub const IGNORE_INDEX: i32 = -100;

/// Logits `[rows, padded_vocab]` of which the first `vocab` columns are classes; columns
/// `vocab..padded_vocab` (padding, e.g. a vocabulary rounded up to a multiple of 128) are ignored.
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

    /// Check the dimensions, `dloss` and the lengths of `logits`, `targets` and `losses`.
    pub fn validate(&self, logits: usize, targets: usize, losses: usize) -> Result<(), ShapeError> {
        let invalid = |name, value: String, reason| ShapeError::Invalid {
            op: Self::OP,
            name,
            value,
            reason,
        };
        if self.vocab == 0 {
            return Err(invalid("vocab", "0".into(), "must be at least 1"));
        }
        if self.padded_vocab < self.vocab {
            return Err(invalid(
                "padded_vocab",
                format!("{} (vocab = {})", self.padded_vocab, self.vocab),
                "must be at least vocab",
            ));
        }
        if let Some(d) = self.dloss.filter(|d| !d.is_finite()) {
            return Err(invalid("dloss", d.to_string(), "must be finite"));
        }
        check_len(Self::OP, "logits", self.logits_len()?, logits)?;
        check_len(Self::OP, "targets", self.rows, targets)?;
        check_len(Self::OP, "losses", self.rows, losses)
    }

    /// Check that every target is in `0..vocab` or is [`IGNORE_INDEX`].
    pub fn check_targets(&self, targets: &[i32]) -> Result<(), OpError> {
        check_indices(
            Self::OP,
            "targets",
            targets,
            (self.vocab, "vocab"),
            Some(IGNORE_INDEX),
            |i| format!("row = {i}"),
        )
    }
}

/// Arguments of [`softmax_cross_entropy`].
#[derive(Debug)]
pub struct SoftmaxCrossEntropy<'a, T> {
    /// Dimensions and `dloss`.
    pub params: CrossEntropyParams,
    /// Logits `[rows, padded_vocab]`; with `dloss`, overwritten by the gradient.
    pub logits: &'a mut [T],
    /// Class per row, in `0..vocab` or [`IGNORE_INDEX`].
    pub targets: &'a [i32],
    /// Per-row loss `lse(row) − row[target]` (0 for ignored rows), overwritten.
    pub losses: &'a mut [f32],
    /// Optional `[1]`: the mean loss over the counted rows (NaN when all are ignored), rounded
    /// to f32 (the device computes it there, without a host sync).
    pub loss: Option<&'a mut [f32]>,
    /// Device only, optional: one `u32` the device sets to the first row whose target is out
    /// of range (`u32::MAX` if none). The CPU reference returns the error instead.
    pub error: Option<&'a mut [u32]>,
}

/// Fused softmax + cross-entropy with mean reduction over the rows whose target is not
/// [`IGNORE_INDEX`]; returns that mean (f64, from the unrounded per-row losses).
///
/// Per row, in f64: `lse = max + ln Σ_{j<V} exp(x_j − max)` (stable for any finite logits),
/// `loss = lse − x[target]` (stored rounded to f32). With `dloss = Some(d)` and `n` counted rows,
/// the logits are overwritten by `dlogits_j = (exp(x_j − lse) − [j = target])·d/n` for `j < V`;
/// padded columns `V..Vp` are set to 0 and ignored rows are all 0.
///
/// When every row is ignored (or `rows = 0`), the mean is NaN, as PyTorch's `0/0` (the
/// gradient is then 0 everywhere, as PyTorch's). Lengths, `dloss` and every target are checked
/// before anything is written.
pub fn softmax_cross_entropy<T: Element>(args: SoftmaxCrossEntropy<'_, T>) -> Result<f64, OpError> {
    let SoftmaxCrossEntropy {
        params: shape,
        logits,
        targets,
        losses,
        loss,
        error,
    } = args;
    let dloss = shape.dloss;
    shape.validate(logits.len(), targets.len(), losses.len())?;
    for (name, len) in [
        ("loss", loss.as_ref().map(|l| l.len())),
        ("error", error.as_ref().map(|e| e.len())),
    ] {
        if let Some(len) = len {
            check_len(CrossEntropyParams::OP, name, 1, len)?;
        }
    }
    shape.check_targets(targets)?;
    let (v, vp) = (shape.vocab, shape.padded_vocab);
    let counted = targets.iter().filter(|&&t| t != IGNORE_INDEX).count();
    let scale = dloss.map(|d| f64::from(d) / counted as f64);
    let mut total = 0.0f64;
    for ((row, &target), loss) in logits.chunks_mut(vp).zip(targets).zip(losses.iter_mut()) {
        let Ok(target) = usize::try_from(target) else {
            // The ignore index (the only negative value that passed the check).
            *loss = 0.0;
            if scale.is_some() {
                row.fill(T::from_f64(0.0));
            }
            continue;
        };
        let x: Vec<f64> = row[..v].iter().map(|e| e.to_f64()).collect();
        let max = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let lse = max + x.iter().map(|xj| (xj - max).exp()).sum::<f64>().ln();
        let l = lse - x[target];
        total += l;
        *loss = l as f32;
        if let Some(s) = scale {
            for (j, (d, xj)) in row.iter_mut().zip(&x).enumerate() {
                let onehot = if j == target { 1.0 } else { 0.0 };
                *d = T::from_f64(((xj - lse).exp() - onehot) * s);
            }
            row[v..].fill(T::from_f64(0.0));
        }
    }
    let mean = total / counted as f64;
    if let Some(l) = loss {
        l[0] = mean as f32;
    }
    Ok(mean)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_row_huge_logits_ignore_and_padding() {
        // Row 0: logits equal -> loss ln 3, p = 1/3. Row 1: ±1e4 -> loss ≈ 2e4 for the wrong
        // class. Row 2 ignored. Padding column 3 holds garbage and is zeroed.
        let s = CrossEntropyParams {
            rows: 3,
            vocab: 3,
            padded_vocab: 4,
            dloss: Some(2.0),
        };
        let mut logits = [
            5.0f32, 5.0, 5.0, 99.0, 1e4, -1e4, 0.0, 99.0, 1.0, 2.0, 3.0, 99.0,
        ];
        let mut losses = [9.0f32; 3];
        let mean = softmax_cross_entropy(SoftmaxCrossEntropy {
            params: s,
            logits: &mut logits,
            targets: &[1, 1, IGNORE_INDEX],
            losses: &mut losses,
            loss: None,
            error: None,
        })
        .unwrap();
        let l0 = 3f64.ln();
        assert_eq!(losses, [l0 as f32, 2e4, 0.0]);
        assert_eq!(mean, (l0 + 2e4) / 2.0);
        // d/n = 1: row 0 = p − onehot = (1/3, −2/3, 1/3); row 1 = (1, −1, e^-1e4 ≈ 0).
        let third = (1.0f64 / 3.0) as f32;
        assert_eq!(
            logits,
            [
                third,
                (-2.0f64 / 3.0) as f32,
                third,
                0.0,
                1.0,
                -1.0,
                0.0,
                0.0,
                0.0,
                0.0,
                0.0,
                0.0
            ]
        );
    }

    #[test]
    fn all_ignored_gives_nan_mean_and_zero_gradient() {
        let mut logits = [1.0f32, 2.0, 3.0, 4.0];
        let mut losses = [1.0f32; 2];
        let mean = softmax_cross_entropy(SoftmaxCrossEntropy {
            params: CrossEntropyParams::new(2, 2),
            logits: &mut logits,
            targets: &[IGNORE_INDEX; 2],
            losses: &mut losses,
            loss: None,
            error: None,
        })
        .unwrap();
        assert!(mean.is_nan());
        assert_eq!((logits, losses), ([0.0; 4], [0.0; 2]));
    }

    #[test]
    fn forward_only_leaves_logits_and_bad_targets_are_named() {
        let mut logits = [0.0f32, 0.0];
        let mut losses = [0.0f32];
        softmax_cross_entropy(SoftmaxCrossEntropy {
            params: CrossEntropyParams {
                dloss: None,
                ..CrossEntropyParams::new(1, 2)
            },
            logits: &mut logits,
            targets: &[0],
            losses: &mut losses,
            loss: None,
            error: None,
        })
        .unwrap();
        assert_eq!((logits, losses), ([0.0; 2], [2f64.ln() as f32]));
        for bad in [2, -1, -101] {
            let mut logits = [7.0f32; 4];
            let e = softmax_cross_entropy(SoftmaxCrossEntropy {
                params: CrossEntropyParams::new(2, 2),
                logits: &mut logits,
                targets: &[0, bad],
                losses: &mut [0.0; 2],
                loss: None,
                error: None,
            })
            .unwrap_err();
            assert!(
                e.to_string()
                    .contains(&format!("`targets`[row = 1] = {bad}")),
                "{e}"
            );
            assert_eq!(logits, [7.0; 4]);
        }
        let e = softmax_cross_entropy(SoftmaxCrossEntropy {
            params: CrossEntropyParams {
                rows: 1,
                vocab: 3,
                padded_vocab: 2,
                dloss: None,
            },
            logits: &mut [0.0f32; 2],
            targets: &[0],
            losses: &mut [0.0],
            loss: None,
            error: None,
        })
        .unwrap_err();
        assert!(
            e.to_string().contains("padded_vocab = 2 (vocab = 3)"),
            "{e}"
        );
    }
}
