//! `linear_crossentropy`: the loss and gradients of `CE(h·Wᵀ)` for hidden states `h [N, C]` and
//! an output matrix `W [V, C]` (a language model's head), with [`super::IGNORE_INDEX`] and the
//! divisor of [`super::CrossEntropyParams`], computed in row chunks so that the `[N, V]` logits
//! never exist whole: per chunk of `R` rows, `logits = h_chunk·Wᵀ` (`[R, V]`, the only
//! scratch), the fused softmax cross-entropy in place (its gradient over its logits), then
//! `dh_chunk = dlogits·W` and `dW += dlogitsᵀ·h_chunk`. The softmax of a row is never split:
//! each chunk holds whole rows, so the loss is the plain op's, row for row.

use super::{check_divisor, CrossEntropyParams};
use crate::params::{check_len, checked_len, invalid, ShapeError, Space, TensorLen};

/// Bytes of logits a chunk holds when the caller gives no `chunk_rows`
/// ([`LinearCrossEntropyPlan::new`]).
pub const DEFAULT_CHUNK_BYTES: usize = 64 << 20;

/// Dimensions and scalars of [`LinearCrossEntropy`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinearCrossEntropyParams {
    /// Rows N (positions), may be 0.
    pub rows: usize,
    /// Hidden size C (≥ 1).
    pub dim: usize,
    /// Classes V (≥ 1): the rows of `weight`.
    pub vocab: usize,
    /// Rows per chunk (≥ 1); `None` picks [`LinearCrossEntropyPlan::new`]'s default (chunks of
    /// about `DEFAULT_CHUNK_BYTES` (64 MiB) of logits). The scratch is `chunk_rows·vocab` elements.
    pub chunk_rows: Option<usize>,
    /// As [`CrossEntropyParams::dloss`]: `None` computes the losses only (no `dh`, no `dweight`).
    pub dloss: Option<f32>,
    /// As [`CrossEntropyParams::divisor`] (`None`: this call's count of counted targets).
    pub divisor: Option<f32>,
}

impl LinearCrossEntropyParams {
    /// Operation name used in errors and golden cases.
    pub const OP: &'static str = "linear_crossentropy";

    /// `N` rows of `C` hidden values against `V` classes, default chunks, the gradient of a plain
    /// mean (`dloss = 1`, no divisor).
    pub const fn new(rows: usize, dim: usize, vocab: usize) -> Self {
        Self {
            rows,
            dim,
            vocab,
            chunk_rows: None,
            dloss: Some(1.0),
            divisor: None,
        }
    }

    /// The fused cross-entropy's parameters for a chunk of `rows` rows of logits.
    pub fn chunk_params(&self, rows: usize) -> CrossEntropyParams {
        CrossEntropyParams {
            rows,
            vocab: self.vocab,
            padded_vocab: self.vocab,
            dloss: self.dloss,
            divisor: self.divisor,
        }
    }
}

/// How [`LinearCrossEntropy`] is cut into chunks and the scratch it takes: a pure function of
/// the sizes, so the memory a call needs is known before it runs (the launcher allocates exactly
/// [`LinearCrossEntropyPlan::scratch_bytes`] from the device's allocator).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinearCrossEntropyPlan {
    /// Rows per chunk (the last chunk may be shorter; 0 when `rows = 0`).
    pub chunk_rows: usize,
    /// Number of chunks.
    pub chunks: usize,
    /// Bytes of the chunk's logits buffer (`chunk_rows·vocab` elements).
    pub logits_bytes: usize,
    /// Every byte the call allocates: the logits chunk plus the 4-byte count of counted targets.
    pub scratch_bytes: usize,
}

impl LinearCrossEntropyPlan {
    /// The plan for `p` with elements of `elem_bytes` bytes. Default chunk: the rows whose logits
    /// fit `DEFAULT_CHUNK_BYTES` (64 MiB) (at least 1), rounded down to a multiple of 64 when that is at
    /// least 64 (whole matmul tiles), never more than `rows`.
    pub fn new(p: &LinearCrossEntropyParams, elem_bytes: usize) -> Result<Self, ShapeError> {
        let op = LinearCrossEntropyParams::OP;
        let row_bytes = checked_len(op, "logits chunk", &[p.vocab, elem_bytes])?;
        let chunk = match p.chunk_rows {
            Some(0) => return Err(invalid(op, "chunk_rows", 0, "must be at least 1")),
            Some(r) => r,
            None => {
                let r = (DEFAULT_CHUNK_BYTES / row_bytes.max(1)).max(1);
                if r >= 64 {
                    r / 64 * 64
                } else {
                    r
                }
            }
        }
        .min(p.rows);
        let logits_bytes = checked_len(op, "logits chunk", &[chunk, row_bytes])?;
        Ok(Self {
            chunk_rows: chunk,
            chunks: if chunk == 0 {
                0
            } else {
                p.rows.div_ceil(chunk)
            },
            logits_bytes,
            scratch_bytes: logits_bytes + std::mem::size_of::<f32>(),
        })
    }
}

/// Cross-entropy of `logits = h·Wᵀ` against `targets`, with its gradients: per counted row
/// `loss = logsumexp(logits) − logits[target]`; with `dloss`, `dlogits = (softmax − onehot)·
/// dloss/n` (n: the divisor, by default the counted rows), `dh = dlogits·W` (overwritten) and,
/// when given, `dweight += dlogitsᵀ·h` (accumulated; leave it `None` for a frozen head, as a
/// LoRA run: then it is not computed).
pub struct LinearCrossEntropy<'a, S: Space, T: hip_rt::Element> {
    /// Dimensions, chunking, `dloss` and divisor.
    pub params: LinearCrossEntropyParams,
    /// Hidden states `[rows, dim]`.
    pub h: S::In<'a, T>,
    /// Output matrix `[vocab, dim]` (an `nn.Linear(dim, vocab)` weight).
    pub weight: S::In<'a, T>,
    /// Class per row, in `0..vocab` or [`super::IGNORE_INDEX`].
    pub targets: S::In<'a, i32>,
    /// `[rows, dim]`, overwritten by the gradient of `h`; given exactly when `dloss` is.
    pub dh: Option<S::Out<'a, T>>,
    /// `[vocab, dim]`, the gradient of `weight` is added to it; `None` for a frozen head.
    /// Only with `dloss`.
    pub dweight: Option<S::Out<'a, T>>,
    /// Per-row loss (0 for ignored rows), overwritten.
    pub losses: S::Out<'a, f32>,
    /// Optional `[1]`: the loss sum over the counted rows divided by the divisor (as
    /// [`super::SoftmaxCrossEntropy::loss`]).
    pub loss: Option<S::Out<'a, f32>>,
    /// Optional `[2]`: the loss sum and the count of counted rows are added to it (as
    /// [`super::SoftmaxCrossEntropy::totals`]).
    pub totals: Option<S::Out<'a, f32>>,
    /// Device only, optional: as [`super::SoftmaxCrossEntropy::error`].
    pub error: Option<S::Out<'a, u32>>,
}

impl<S: Space, T: hip_rt::Element> LinearCrossEntropy<'_, S, T> {
    /// Check the dimensions, scalars, the presence of the gradients and every length.
    pub fn validate(&self) -> Result<(), ShapeError> {
        let p = &self.params;
        let op = LinearCrossEntropyParams::OP;
        for (name, v) in [("dim", p.dim), ("vocab", p.vocab)] {
            if v == 0 {
                return Err(invalid(op, name, 0, "must be at least 1"));
            }
        }
        if p.chunk_rows == Some(0) {
            return Err(invalid(op, "chunk_rows", 0, "must be at least 1 (or None)"));
        }
        if let Some(d) = p.dloss.filter(|d| !d.is_finite()) {
            return Err(invalid(op, "dloss", d, "must be finite"));
        }
        check_divisor(op, p.divisor)?;
        if p.dloss.is_some() != self.dh.is_some() {
            return Err(invalid(
                op,
                "dh",
                if self.dh.is_some() { "given" } else { "None" },
                "must be given exactly when dloss is Some",
            ));
        }
        if p.dloss.is_none() && self.dweight.is_some() {
            return Err(invalid(
                op,
                "dweight",
                "given",
                "needs dloss (a forward-only call computes no gradient)",
            ));
        }
        let h_len = checked_len(op, "h", &[p.rows, p.dim])?;
        let w_len = checked_len(op, "weight", &[p.vocab, p.dim])?;
        check_len(op, "h", h_len, self.h.numel())?;
        check_len(op, "weight", w_len, self.weight.numel())?;
        check_len(op, "targets", p.rows, self.targets.numel())?;
        check_len(op, "losses", p.rows, self.losses.numel())?;
        if let Some(d) = &self.dh {
            check_len(op, "dh", h_len, d.numel())?;
        }
        if let Some(d) = &self.dweight {
            check_len(op, "dweight", w_len, d.numel())?;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_chunks_fit_the_budget_and_explicit_ones_are_kept() {
        // The size: 4096 rows of a 151936-word vocabulary in bf16.
        let p = LinearCrossEntropyParams::new(4096, 896, 151_936);
        let plan = LinearCrossEntropyPlan::new(&p, 2).unwrap();
        // 64 MiB / (151936·2 B) = 220 rows, down to 192.
        assert_eq!((plan.chunk_rows, plan.chunks), (192, 22));
        assert_eq!(plan.logits_bytes, 192 * 151_936 * 2);
        assert_eq!(plan.scratch_bytes, plan.logits_bytes + 4);
        // A small problem is one chunk of all its rows; a huge row still gets one row.
        let small = LinearCrossEntropyPlan::new(&LinearCrossEntropyParams::new(5, 3, 7), 4);
        assert_eq!(small.unwrap().chunk_rows, 5);
        let wide = LinearCrossEntropyParams::new(10, 1, 1 << 26);
        assert_eq!(LinearCrossEntropyPlan::new(&wide, 4).unwrap().chunk_rows, 1);
        let p = LinearCrossEntropyParams {
            chunk_rows: Some(3),
            ..LinearCrossEntropyParams::new(10, 4, 8)
        };
        let plan = LinearCrossEntropyPlan::new(&p, 4).unwrap();
        assert_eq!(
            (plan.chunk_rows, plan.chunks, plan.logits_bytes),
            (3, 4, 96)
        );
        let none = LinearCrossEntropyPlan::new(&LinearCrossEntropyParams::new(0, 4, 8), 4);
        assert_eq!(none.unwrap().chunks, 0);
        let p = LinearCrossEntropyParams {
            chunk_rows: Some(0),
            ..p
        };
        let e = LinearCrossEntropyPlan::new(&p, 4).unwrap_err();
        assert!(e.to_string().contains("chunk_rows"), "{e}");
    }
}
