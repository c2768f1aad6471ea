//! Shapes, hyper-parameters, element types and their validation, shared by the CPU reference
//! ([`crate::cpu`]) and the device launchers ([`crate::ops`]).
//!
//! Nothing here depends on either implementation: a launcher validates its buffer lengths with the
//! same `validate` methods the reference uses, so both reject the same inputs with the same
//! [`ShapeError`]. Every tensor is dense and row-major; batched tensors are packed (batch stride =
//! the size of one matrix).

mod element;

pub use element::{DType, Element};
/// The 16-bit float types [`Element`] is implemented for (re-exported `half` types).
pub use half::{bf16, f16};

/// The operations with a CPU reference, device launchers and golden cases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// [`MatmulShape`].
    Matmul,
    /// [`LayerNormShape`], forward.
    LayerNormForward,
    /// [`LayerNormShape`], backward.
    LayerNormBackward,
    /// [`AttentionShape`], forward.
    AttentionForward,
    /// [`AttentionShape`], backward.
    AttentionBackward,
    /// [`AdamWConfig`].
    AdamW,
}

impl Op {
    /// All operations.
    pub const ALL: [Op; 6] = [
        Op::Matmul,
        Op::LayerNormForward,
        Op::LayerNormBackward,
        Op::AttentionForward,
        Op::AttentionBackward,
        Op::AdamW,
    ];

    /// The name used in golden cases (`op` metadata) and kernel names.
    pub const fn name(self) -> &'static str {
        match self {
            Op::Matmul => "matmul",
            Op::LayerNormForward => "layernorm_forward",
            Op::LayerNormBackward => "layernorm_backward",
            Op::AttentionForward => "attention_forward",
            Op::AttentionBackward => "attention_backward",
            Op::AdamW => "adamw",
        }
    }

    /// Inverse of [`Op::name`].
    pub fn from_name(name: &str) -> Option<Op> {
        Op::ALL.into_iter().find(|op| op.name() == name)
    }
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Bad shape, length, dtype or parameter given to an op (CPU reference or device launcher).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ShapeError {
    /// A buffer has the wrong number of elements for the shape.
    #[error("{op}: `{tensor}` has {got} elements but the shape needs {expected}; pass a buffer of exactly {expected} elements")]
    Length {
        /// Operation name.
        op: &'static str,
        /// Tensor (argument) name.
        tensor: &'static str,
        /// Elements the shape requires.
        expected: usize,
        /// Elements given.
        got: usize,
    },
    /// A tensor has the wrong element type.
    #[error("{op}: `{tensor}` is {got} but must be {expected}; convert it first")]
    DType {
        /// Operation name.
        op: &'static str,
        /// Tensor (argument) name.
        tensor: &'static str,
        /// Required type.
        expected: DType,
        /// Given type.
        got: DType,
    },
    /// The element count of a shape does not fit in `usize`.
    #[error("{op}: the size of `{tensor}` overflows usize; use smaller dimensions")]
    Overflow {
        /// Operation name.
        op: &'static str,
        /// Tensor (argument) name.
        tensor: &'static str,
    },
    /// A dimension or parameter is out of its valid range.
    #[error("{op}: {name} = {value} is invalid: {reason}")]
    Invalid {
        /// Operation name.
        op: &'static str,
        /// Parameter name.
        name: &'static str,
        /// The offending value, formatted.
        value: String,
        /// What is required.
        reason: &'static str,
    },
    /// An optional buffer is present where it must be absent, or the reverse.
    #[error("{op}: `{tensor}` must be {}; {fix}", if *.required { "given" } else { "absent" })]
    Presence {
        /// Operation name.
        op: &'static str,
        /// Tensor (argument) name.
        tensor: &'static str,
        /// Whether the tensor is required.
        required: bool,
        /// How to fix it.
        fix: &'static str,
    },
}

/// Product of dimensions, or [`ShapeError::Overflow`].
///
/// The product of the non-zero dimensions must fit in `usize` even when another dimension is
/// zero: code indexes with sub-products (`m·n` per batch, `tq·d` per head) whether or not the
/// batch is empty, so `[0, 2^32, 2^32]` is an overflow, not an empty tensor.
pub fn checked_len(
    op: &'static str,
    tensor: &'static str,
    dims: &[usize],
) -> Result<usize, ShapeError> {
    let non_zero = dims
        .iter()
        .filter(|&&d| d != 0)
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or(ShapeError::Overflow { op, tensor })?;
    Ok(if dims.contains(&0) { 0 } else { non_zero })
}

/// Check that a buffer length equals the expected element count.
pub fn check_len(
    op: &'static str,
    tensor: &'static str,
    expected: usize,
    got: usize,
) -> Result<(), ShapeError> {
    if expected == got {
        Ok(())
    } else {
        Err(ShapeError::Length {
            op,
            tensor,
            expected,
            got,
        })
    }
}

fn invalid(
    op: &'static str,
    name: &'static str,
    value: impl std::fmt::Display,
    reason: &'static str,
) -> ShapeError {
    ShapeError::Invalid {
        op,
        name,
        value: value.to_string(),
        reason,
    }
}

/// `out = alpha·op(A)·op(B) + beta·C`, row-major, packed batches.
///
/// `a` is `[batch, m, k]` (`[batch, k, m]` if `trans_a`), `b` is `[batch, k, n]` (`[batch, n, k]`
/// if `trans_b`), `out` (and `C`) is `[batch, m, n]`. Any dimension may be zero; `k = 0` gives
/// `out = beta·C`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatmulShape {
    /// Number of independent matrices (1 for a plain GEMM).
    pub batch: usize,
    /// Rows of op(A) and of out.
    pub m: usize,
    /// Columns of op(B) and of out.
    pub n: usize,
    /// Inner (reduction) dimension.
    pub k: usize,
    /// A is stored transposed (`[k, m]`).
    pub trans_a: bool,
    /// B is stored transposed (`[n, k]`).
    pub trans_b: bool,
}

impl MatmulShape {
    /// Operation name used in errors and kernel names.
    pub const OP: &'static str = "matmul";

    /// A single non-transposed `m × k` by `k × n` product.
    pub const fn new(m: usize, n: usize, k: usize) -> Self {
        Self {
            batch: 1,
            m,
            n,
            k,
            trans_a: false,
            trans_b: false,
        }
    }

    /// Elements of `a` (all batches).
    pub fn a_len(&self) -> Result<usize, ShapeError> {
        checked_len(Self::OP, "a", &[self.batch, self.m, self.k])
    }

    /// Elements of `b` (all batches).
    pub fn b_len(&self) -> Result<usize, ShapeError> {
        checked_len(Self::OP, "b", &[self.batch, self.k, self.n])
    }

    /// Elements of `out` (and `c`) (all batches).
    pub fn out_len(&self) -> Result<usize, ShapeError> {
        checked_len(Self::OP, "out", &[self.batch, self.m, self.n])
    }

    /// Check buffer lengths and scalars. `out` doubles as C when `beta != 0`.
    pub fn validate(
        &self,
        alpha: f32,
        beta: f32,
        a_len: usize,
        b_len: usize,
        out_len: usize,
    ) -> Result<(), ShapeError> {
        if !alpha.is_finite() {
            return Err(invalid(Self::OP, "alpha", alpha, "must be finite"));
        }
        if !beta.is_finite() {
            return Err(invalid(Self::OP, "beta", beta, "must be finite"));
        }
        check_len(Self::OP, "a", self.a_len()?, a_len)?;
        check_len(Self::OP, "b", self.b_len()?, b_len)?;
        check_len(Self::OP, "out", self.out_len()?, out_len)
    }
}

/// Layer normalization over the last dimension of a `[rows, cols]` tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerNormShape {
    /// Number of normalized rows (may be 0).
    pub rows: usize,
    /// Normalized (last) dimension, at least 1.
    pub cols: usize,
}

impl LayerNormShape {
    /// Operation name used in errors.
    pub const OP: &'static str = "layernorm";

    /// Elements of `x`, `y`, `dy`, `dx`.
    pub fn x_len(&self) -> Result<usize, ShapeError> {
        checked_len(Self::OP, "x", &[self.rows, self.cols])
    }

    fn validate_common(
        &self,
        x: usize,
        weight: usize,
        mean: usize,
        rstd: usize,
    ) -> Result<(), ShapeError> {
        if self.cols == 0 {
            return Err(invalid(
                Self::OP,
                "cols",
                0,
                "must be at least 1 (the mean of nothing is undefined)",
            ));
        }
        check_len(Self::OP, "x", self.x_len()?, x)?;
        check_len(Self::OP, "weight", self.cols, weight)?;
        check_len(Self::OP, "mean", self.rows, mean)?;
        check_len(Self::OP, "rstd", self.rows, rstd)
    }

    /// Check the forward's `eps` and buffer lengths (`x`/`y` `[rows, cols]`, `weight`/`bias` `[cols]`,
    /// `mean`/`rstd` `[rows]`).
    #[allow(clippy::too_many_arguments)]
    pub fn validate_forward(
        &self,
        eps: f32,
        x: usize,
        weight: usize,
        bias: usize,
        y: usize,
        mean: usize,
        rstd: usize,
    ) -> Result<(), ShapeError> {
        if !(eps.is_finite() && eps >= 0.0) {
            return Err(invalid(
                Self::OP,
                "eps",
                eps,
                "must be finite and non-negative",
            ));
        }
        self.validate_common(x, weight, mean, rstd)?;
        check_len(Self::OP, "bias", self.cols, bias)?;
        check_len(Self::OP, "y", self.x_len()?, y)
    }

    /// Check the backward's buffer lengths (`x`, `dy`, `dx` `[rows, cols]`; `weight`, `dweight`,
    /// `dbias` `[cols]`; `mean`, `rstd` `[rows]`).
    #[allow(clippy::too_many_arguments)]
    pub fn validate_backward(
        &self,
        x: usize,
        weight: usize,
        dy: usize,
        mean: usize,
        rstd: usize,
        dx: usize,
        dweight: usize,
        dbias: usize,
    ) -> Result<(), ShapeError> {
        self.validate_common(x, weight, mean, rstd)?;
        check_len(Self::OP, "dy", self.x_len()?, dy)?;
        check_len(Self::OP, "dx", self.x_len()?, dx)?;
        check_len(Self::OP, "dweight", self.cols, dweight)?;
        check_len(Self::OP, "dbias", self.cols, dbias)
    }
}

/// Scaled dot-product attention on `[batch, heads, t, head_dim]` tensors.
///
/// Causal masking is bottom-right aligned: key `j` is visible to query `i` iff
/// `j ≤ i + tk − tq` (torch's `is_causal` when `tq = tk`). A query with no visible key (possible
/// when `tq > tk`, or `tk = 0`) gives `out = 0`, `lse = −inf` and zero gradients.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionShape {
    /// Batch size.
    pub batch: usize,
    /// Number of heads.
    pub heads: usize,
    /// Query length.
    pub tq: usize,
    /// Key/value length.
    pub tk: usize,
    /// Head dimension of q, k and v.
    pub head_dim: usize,
    /// Apply the bottom-right aligned causal mask.
    pub causal: bool,
    /// Multiplier of Q·Kᵀ, usually `1/√head_dim`.
    pub scale: f32,
}

impl AttentionShape {
    /// Operation name used in errors.
    pub const OP: &'static str = "attention";

    /// The conventional scale `1/√head_dim`, rounded to f32 (`head_dim` 0 gives infinity, which
    /// validation rejects).
    pub fn default_scale(head_dim: usize) -> f32 {
        (1.0 / (head_dim as f64).sqrt()) as f32
    }

    /// Elements of `q`, `out`, `dout`, `dq`.
    pub fn q_len(&self) -> Result<usize, ShapeError> {
        checked_len(
            Self::OP,
            "q",
            &[self.batch, self.heads, self.tq, self.head_dim],
        )
    }

    /// Elements of `k`, `v`, `dk`, `dv`.
    pub fn kv_len(&self) -> Result<usize, ShapeError> {
        checked_len(
            Self::OP,
            "k",
            &[self.batch, self.heads, self.tk, self.head_dim],
        )
    }

    /// Elements of `lse`.
    pub fn lse_len(&self) -> Result<usize, ShapeError> {
        checked_len(Self::OP, "lse", &[self.batch, self.heads, self.tq])
    }

    /// Number of keys visible to query `i` (keys `0..visible_keys(i)`).
    pub fn visible_keys(&self, i: usize) -> usize {
        if self.causal {
            // j ≤ i + tk − tq  ⇔  j < tk − (tq − i − 1); no intermediate exceeds tk or tq.
            let ahead = self.tq.saturating_sub(i).saturating_sub(1);
            self.tk.saturating_sub(ahead)
        } else {
            self.tk
        }
    }

    fn validate_qkv(&self, q: usize, k: usize, v: usize, lse: usize) -> Result<(), ShapeError> {
        if !self.scale.is_finite() {
            return Err(invalid(Self::OP, "scale", self.scale, "must be finite"));
        }
        if self.head_dim == 0 {
            return Err(invalid(Self::OP, "head_dim", 0, "must be at least 1"));
        }
        check_len(Self::OP, "q", self.q_len()?, q)?;
        check_len(Self::OP, "k", self.kv_len()?, k)?;
        check_len(Self::OP, "v", self.kv_len()?, v)?;
        check_len(Self::OP, "lse", self.lse_len()?, lse)
    }

    /// Check the forward's buffer lengths.
    pub fn validate_forward(
        &self,
        q: usize,
        k: usize,
        v: usize,
        out: usize,
        lse: usize,
    ) -> Result<(), ShapeError> {
        self.validate_qkv(q, k, v, lse)?;
        check_len(Self::OP, "out", self.q_len()?, out)
    }

    /// Check the backward's buffer lengths.
    #[allow(clippy::too_many_arguments)]
    pub fn validate_backward(
        &self,
        q: usize,
        k: usize,
        v: usize,
        out: usize,
        dout: usize,
        lse: usize,
        dq: usize,
        dk: usize,
        dv: usize,
    ) -> Result<(), ShapeError> {
        self.validate_forward(q, k, v, out, lse)?;
        check_len(Self::OP, "dout", self.q_len()?, dout)?;
        check_len(Self::OP, "dq", self.q_len()?, dq)?;
        check_len(Self::OP, "dk", self.kv_len()?, dk)?;
        check_len(Self::OP, "dv", self.kv_len()?, dv)
    }
}

/// AdamW hyper-parameters, with torch.optim.AdamW's meaning (decoupled weight decay).
///
/// Held in `f64` like torch's Python floats; kernels take them as `f32`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWConfig {
    /// Learning rate (≥ 0).
    pub lr: f64,
    /// First-moment decay, in [0, 1).
    pub beta1: f64,
    /// Second-moment decay, in [0, 1).
    pub beta2: f64,
    /// Added to the bias-corrected √v (≥ 0).
    pub eps: f64,
    /// Decoupled weight decay (≥ 0): `p ← p·(1 − lr·weight_decay)` first.
    pub weight_decay: f64,
    /// Maximize the objective (the gradient is negated).
    pub maximize: bool,
    /// Use the running maximum of `v` in the denominator (needs `max_exp_avg_sq`).
    pub amsgrad: bool,
}

impl Default for AdamWConfig {
    /// torch.optim.AdamW's defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 1e-2.
    fn default() -> Self {
        Self {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 1e-2,
            maximize: false,
            amsgrad: false,
        }
    }
}

/// Per-step inputs of AdamW.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWStep {
    /// Step number after increment (≥ 1): the first update uses 1.
    pub step: u64,
    /// Gradients are divided by this (a loss scaler's scale) before use.
    pub grad_scale: Option<f32>,
    /// A non-finite gradient was found: nothing at all is changed.
    pub found_inf: bool,
}

impl AdamWStep {
    /// A plain step without scaling.
    pub const fn new(step: u64) -> Self {
        Self {
            step,
            grad_scale: None,
            found_inf: false,
        }
    }
}

impl AdamWConfig {
    /// Operation name used in errors.
    pub const OP: &'static str = "adamw";

    /// Check hyper-parameters (torch's ranges), the step, and buffer lengths.
    ///
    /// `param` (the model copy), `grad`, `exp_avg`, `exp_avg_sq` must have equal length;
    /// `max_exp_avg_sq` is given iff `amsgrad`; `master` (f32 master weights) is optional.
    #[allow(clippy::too_many_arguments)]
    pub fn validate(
        &self,
        step: &AdamWStep,
        param: usize,
        grad: usize,
        exp_avg: usize,
        exp_avg_sq: usize,
        max_exp_avg_sq: Option<usize>,
        master: Option<usize>,
    ) -> Result<(), ShapeError> {
        let op = Self::OP;
        if !(self.lr.is_finite() && self.lr >= 0.0) {
            return Err(invalid(op, "lr", self.lr, "must be finite and >= 0"));
        }
        for (name, b) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(0.0..1.0).contains(&b) {
                return Err(invalid(op, name, b, "must be in [0, 1)"));
            }
        }
        if !(self.eps.is_finite() && self.eps >= 0.0) {
            return Err(invalid(op, "eps", self.eps, "must be finite and >= 0"));
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return Err(invalid(
                op,
                "weight_decay",
                self.weight_decay,
                "must be finite and >= 0",
            ));
        }
        if step.step == 0 {
            return Err(invalid(
                op,
                "step",
                0,
                "must be >= 1 (the step count after increment)",
            ));
        }
        if let Some(s) = step.grad_scale {
            if !(s.is_finite() && s > 0.0) {
                return Err(invalid(op, "grad_scale", s, "must be finite and > 0"));
            }
        }
        check_len(op, "grad", param, grad)?;
        check_len(op, "exp_avg", param, exp_avg)?;
        check_len(op, "exp_avg_sq", param, exp_avg_sq)?;
        match (self.amsgrad, max_exp_avg_sq) {
            (true, Some(len)) => check_len(op, "max_exp_avg_sq", param, len)?,
            (false, None) => {}
            (true, None) => {
                return Err(ShapeError::Presence {
                    op,
                    tensor: "max_exp_avg_sq",
                    required: true,
                    fix: "amsgrad needs the running maximum of exp_avg_sq",
                })
            }
            (false, Some(_)) => {
                return Err(ShapeError::Presence {
                    op,
                    tensor: "max_exp_avg_sq",
                    required: false,
                    fix: "set amsgrad = true or drop it",
                })
            }
        }
        if let Some(len) = master {
            check_len(op, "master", param, len)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causal_visibility_is_bottom_right_aligned() {
        let s = AttentionShape {
            batch: 1,
            heads: 1,
            tq: 2,
            tk: 5,
            head_dim: 4,
            causal: true,
            scale: 1.0,
        };
        assert_eq!((s.visible_keys(0), s.visible_keys(1)), (4, 5));
        let s = AttentionShape { tq: 5, tk: 2, ..s };
        assert_eq!(
            (0..5).map(|i| s.visible_keys(i)).collect::<Vec<_>>(),
            vec![0, 0, 0, 1, 2]
        );
        let s = AttentionShape { causal: false, ..s };
        assert_eq!(s.visible_keys(0), 2);
    }

    #[test]
    fn causal_visibility_does_not_overflow_for_huge_lengths() {
        let s = AttentionShape {
            batch: 1,
            heads: 1,
            tq: 1,
            tk: usize::MAX,
            head_dim: 1,
            causal: true,
            scale: 1.0,
        };
        assert_eq!(s.visible_keys(0), usize::MAX);
        let s = AttentionShape {
            tq: usize::MAX,
            ..s
        };
        assert_eq!(s.visible_keys(usize::MAX - 1), usize::MAX);
        assert_eq!(s.visible_keys(usize::MAX), usize::MAX);
        assert_eq!(s.visible_keys(0), 1);
        let s = AttentionShape { tk: 3, ..s };
        // j ≤ i + tk − tq: the last query sees all 3 keys, 3 queries earlier sees one.
        assert_eq!(s.visible_keys(usize::MAX - 1), 3);
        assert_eq!(s.visible_keys(usize::MAX - 3), 1);
        assert_eq!(s.visible_keys(usize::MAX - 4), 0);
    }

    #[test]
    fn a_zero_dimension_does_not_hide_an_overflow() {
        let half = 1usize << (usize::BITS / 2);
        let overflow = |tensor| ShapeError::Overflow {
            op: "matmul",
            tensor,
        };
        assert_eq!(
            checked_len("matmul", "out", &[0, half, half]),
            Err(overflow("out"))
        );
        assert_eq!(
            checked_len("matmul", "out", &[half, 0, half]),
            Err(overflow("out"))
        );
        assert_eq!(checked_len("matmul", "out", &[0, half, half - 1]), Ok(0));
        assert_eq!(checked_len("matmul", "out", &[3, 0]), Ok(0));
        assert_eq!(checked_len("matmul", "out", &[]), Ok(1));
        let s = MatmulShape {
            batch: 0,
            ..MatmulShape::new(half, half, 1)
        };
        assert_eq!(s.validate(1.0, 0.0, 0, 0, 0), Err(overflow("out")));
        let a = AttentionShape {
            batch: half,
            heads: half,
            tq: 0,
            tk: 0,
            head_dim: 1,
            causal: false,
            scale: 1.0,
        };
        assert!(matches!(
            a.validate_forward(0, 0, 0, 0, 0),
            Err(ShapeError::Overflow { tensor: "q", .. })
        ));
        let l = LayerNormShape {
            rows: 0,
            cols: half,
        };
        assert!(l.validate_forward(0.0, 0, half, half, 0, 0, 0).is_ok());
    }

    #[test]
    fn validation_names_the_values() {
        let s = MatmulShape {
            batch: 2,
            ..MatmulShape::new(3, 4, 5)
        };
        let e = s.validate(1.0, 0.0, 30, 39, 24).unwrap_err();
        assert_eq!(
            e,
            ShapeError::Length {
                op: "matmul",
                tensor: "b",
                expected: 40,
                got: 39
            }
        );
        assert!(e.to_string().contains("39") && e.to_string().contains("40"));
        let big = MatmulShape::new(usize::MAX, 2, 2);
        assert!(matches!(big.a_len(), Err(ShapeError::Overflow { .. })));
        let c = AdamWConfig {
            amsgrad: true,
            ..AdamWConfig::default()
        };
        let e = c
            .validate(&AdamWStep::new(1), 3, 3, 3, 3, None, None)
            .unwrap_err();
        assert!(
            e.to_string().contains("`max_exp_avg_sq` must be given"),
            "{e}"
        );
        let e = AdamWConfig::default()
            .validate(&AdamWStep::new(0), 3, 3, 3, 3, None, None)
            .unwrap_err();
        assert!(e.to_string().contains("step = 0"), "{e}");
        let e = LayerNormShape { rows: 2, cols: 0 }
            .validate_forward(1e-5, 0, 0, 0, 0, 2, 2)
            .unwrap_err();
        assert!(e.to_string().contains("cols = 0"), "{e}");
    }
}
