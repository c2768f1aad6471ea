//! Scaled dot-product attention on `[batch, heads, t, head_dim]` tensors: the op's parameters
//! and argument structs ([`AttentionForward`], [`AttentionBackward`] on packed tensors;
//! [`AttentionForwardStrided`], [`AttentionBackwardStrided`] on any [`AttentionLayout`], e.g.
//! straight from the fused QKV projection `[B, T, 3, H, D]`), shared by the CPU reference
//! ([`crate::cpu`]) and the launchers (`kernels/attention.hip`: one set of kernels reading
//! through element strides). The device paths ran on hip-emu (the CPU emulation of a device),
//! never on a GPU.

pub(crate) mod cpu;
mod device;
#[cfg(feature = "golden")]
mod golden;
#[cfg(feature = "golden")]
mod golden_strided;
mod mc;
mod strided;
pub(crate) mod varlen;

pub use device::{
    attention_backward, attention_backward_strided, attention_backward_strided_with,
    attention_backward_with, attention_forward, attention_forward_strided,
    attention_forward_strided_with, attention_forward_with, AttentionPlan, AttentionStage,
    MAX_HEADS_PER_LAUNCH, MAX_HEAD_DIM, MAX_T,
};
#[cfg(feature = "golden")]
pub(crate) use golden::GOLDEN;
#[cfg(feature = "golden")]
pub use golden::{AttentionBackwardCase, AttentionForwardCase};
#[cfg(feature = "golden")]
pub use golden_strided::AttentionStridedCase;
pub use mc::{AttentionKernel, McAttentionPlan, MC_BWD_ROWS};
pub use strided::{
    AttentionBackwardStrided, AttentionForwardStrided, AttentionLayout, Qkv, Strided,
};
pub use varlen::{check_cu_seqlens, visible_key_range};

use crate::params::{check_len, checked_len, invalid, ShapeError, Space, TensorLen};

// Each struct runs itself on its space (`ops::Run`): the CPU reference, or the launcher.
crate::ops::run::launch! {
    AttentionForward['a] T => attention_forward, attention_forward;
    AttentionBackward['a] T => attention_backward, attention_backward;
    AttentionForwardStrided['a] T => attention_forward_strided, attention_forward_strided;
    AttentionBackwardStrided['a] T => attention_backward_strided, attention_backward_strided;
}

/// Dimensions and hyper-parameters of attention (forward and backward).
///
/// Causal masking is bottom-right aligned: key `j` is visible to query `i` iff
/// `j ≤ i + tk − tq` (torch's `is_causal` when `tq = tk`). A query with no visible key (possible
/// when `tq > tk`, or `tk = 0`) gives `out = 0`, `lse = −inf` and zero gradients.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionParams {
    /// Batch size.
    pub batch: usize,
    /// Number of query heads H.
    pub heads: usize,
    /// Number of key/value heads K (grouped-query attention): `heads % n_kv_heads == 0` and
    /// query head `h` reads key/value head `h / (heads / n_kv_heads)`. `n_kv_heads = heads` is
    /// multi-head attention, 1 multi-query.
    pub n_kv_heads: usize,
    /// Query length.
    pub tq: usize,
    /// Key/value length.
    pub tk: usize,
    /// Head dimension of q, k and v.
    pub head_dim: usize,
    /// Apply the bottom-right aligned causal mask.
    pub causal: bool,
    /// Multiplier of Q·Kᵀ, usually [`AttentionParams::default_scale`].
    pub scale: f32,
}

impl AttentionParams {
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

    /// Elements of `k`, `v`, `dk`, `dv` (`[batch, n_kv_heads, tk, head_dim]`).
    pub fn kv_len(&self) -> Result<usize, ShapeError> {
        checked_len(
            Self::OP,
            "k",
            &[self.batch, self.n_kv_heads, self.tk, self.head_dim],
        )
    }

    /// Query heads per key/value head, `heads / n_kv_heads` (1 when `n_kv_heads` is 0, which
    /// validation rejects unless `heads` is 0 too).
    pub fn group(&self) -> usize {
        self.heads.checked_div(self.n_kv_heads).unwrap_or(1).max(1)
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

    /// Check the length of `cu_seqlens` (when given); returns its entries per row.
    pub(crate) fn validate_cu_seqlens(&self, len: Option<usize>) -> Result<usize, ShapeError> {
        len.map_or(Ok(0), |n| varlen::entries_per_row(self, n))
    }

    fn validate_qkv(&self, q: usize, k: usize, v: usize, lse: usize) -> Result<(), ShapeError> {
        if !self.scale.is_finite() {
            return Err(invalid(Self::OP, "scale", self.scale, "must be finite"));
        }
        if self.head_dim == 0 {
            return Err(invalid(Self::OP, "head_dim", 0, "must be at least 1"));
        }
        let (h, kv) = (self.heads, self.n_kv_heads);
        if (kv == 0 && h != 0) || (kv != 0 && h % kv != 0) {
            return Err(invalid(
                Self::OP,
                "n_kv_heads",
                format!("{kv} (heads = {h})"),
                "must divide heads (heads % n_kv_heads == 0), e.g. n_kv_heads = heads for multi-head or 1 for multi-query attention",
            ));
        }
        check_len(Self::OP, "q", self.q_len()?, q)?;
        check_len(Self::OP, "k", self.kv_len()?, k)?;
        check_len(Self::OP, "v", self.kv_len()?, v)?;
        check_len(Self::OP, "lse", self.lse_len()?, lse)
    }
}

/// Attention forward: `out = softmax(scale·Q·Kᵀ + mask)·V` and `lse` `[batch, heads, tq]` (f32),
/// the natural log-sum-exp of the scaled visible scores (saved for the backward).
pub struct AttentionForward<'a, S: Space, T: hip_rt::Element> {
    /// Dimensions, mask and scale.
    pub params: AttentionParams,
    /// Queries `[batch, heads, tq, head_dim]`.
    pub q: S::In<'a, T>,
    /// Keys `[batch, n_kv_heads, tk, head_dim]`.
    pub k: S::In<'a, T>,
    /// Values `[batch, n_kv_heads, tk, head_dim]`.
    pub v: S::In<'a, T>,
    /// Output `[batch, heads, tq, head_dim]`.
    pub out: S::Out<'a, T>,
    /// Log-sum-exp per query `[batch, heads, tq]`.
    pub lse: S::Out<'a, f32>,
    /// Variable-length sequences: `batch × (n + 1)` sequence starts (see
    /// [`check_cu_seqlens`]); attention stays inside each sequence, padding positions give 0.
    /// `None`: every row is one sequence of `tq` queries and `tk` keys.
    pub cu_seqlens: Option<S::In<'a, i32>>,
}

impl<S: Space, T: hip_rt::Element> AttentionForward<'_, S, T> {
    /// Check the scale, head_dim and every length (the CPU reference and the launchers call this
    /// first).
    pub fn validate(&self) -> Result<(), ShapeError> {
        let p = &self.params;
        p.validate_qkv(
            self.q.numel(),
            self.k.numel(),
            self.v.numel(),
            self.lse.numel(),
        )?;
        check_len(AttentionParams::OP, "out", p.q_len()?, self.out.numel())?;
        p.validate_cu_seqlens(self.cu_seqlens.as_ref().map(|c| c.numel()))?;
        Ok(())
    }
}

/// Attention backward from the saved `out` and `lse`, as FlashAttention defines it:
/// `P = exp(scale·q·kᵀ − lse)`, `D = rowsum(dout ∘ out)`, `dS = P ∘ (dout·vᵀ − D)`,
/// `dq = scale·dS·k`, `dk = scale·dSᵀ·q`, `dv = Pᵀ·dout` (overwritten).
pub struct AttentionBackward<'a, S: Space, T: hip_rt::Element> {
    /// Dimensions, mask and scale (those of the forward).
    pub params: AttentionParams,
    /// Queries `[batch, heads, tq, head_dim]`.
    pub q: S::In<'a, T>,
    /// Keys `[batch, n_kv_heads, tk, head_dim]`.
    pub k: S::In<'a, T>,
    /// Values `[batch, n_kv_heads, tk, head_dim]`.
    pub v: S::In<'a, T>,
    /// The forward's output `[batch, heads, tq, head_dim]`.
    pub out: S::In<'a, T>,
    /// Gradient of `out`.
    pub dout: S::In<'a, T>,
    /// The forward's log-sum-exp `[batch, heads, tq]`.
    pub lse: S::In<'a, f32>,
    /// Gradient of `q`.
    pub dq: S::Out<'a, T>,
    /// Gradient of `k`.
    pub dk: S::Out<'a, T>,
    /// Gradient of `v`.
    pub dv: S::Out<'a, T>,
    /// Variable-length sequences: `batch × (n + 1)` sequence starts (see
    /// [`check_cu_seqlens`]); attention stays inside each sequence, padding positions give 0.
    /// The forward's; `None`: every row is one sequence of `tq` queries and `tk` keys.
    pub cu_seqlens: Option<S::In<'a, i32>>,
}

impl<S: Space, T: hip_rt::Element> AttentionBackward<'_, S, T> {
    /// Check the scale, head_dim and every length (the CPU reference and the launchers call this
    /// first).
    pub fn validate(&self) -> Result<(), ShapeError> {
        let p = &self.params;
        let op = AttentionParams::OP;
        p.validate_qkv(
            self.q.numel(),
            self.k.numel(),
            self.v.numel(),
            self.lse.numel(),
        )?;
        check_len(op, "out", p.q_len()?, self.out.numel())?;
        check_len(op, "dout", p.q_len()?, self.dout.numel())?;
        check_len(op, "dq", p.q_len()?, self.dq.numel())?;
        check_len(op, "dk", p.kv_len()?, self.dk.numel())?;
        check_len(op, "dv", p.kv_len()?, self.dv.numel())?;
        p.validate_cu_seqlens(self.cu_seqlens.as_ref().map(|c| c.numel()))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causal_visibility_is_bottom_right_aligned() {
        let s = AttentionParams {
            batch: 1,
            heads: 1,
            n_kv_heads: 1,
            tq: 2,
            tk: 5,
            head_dim: 4,
            causal: true,
            scale: 1.0,
        };
        assert_eq!((s.visible_keys(0), s.visible_keys(1)), (4, 5));
        let s = AttentionParams { tq: 5, tk: 2, ..s };
        assert_eq!(
            (0..5).map(|i| s.visible_keys(i)).collect::<Vec<_>>(),
            vec![0, 0, 0, 1, 2]
        );
        let s = AttentionParams { causal: false, ..s };
        assert_eq!(s.visible_keys(0), 2);
    }

    #[test]
    fn causal_visibility_does_not_overflow_for_huge_lengths() {
        let s = AttentionParams {
            batch: 1,
            heads: 1,
            n_kv_heads: 1,
            tq: 1,
            tk: usize::MAX,
            head_dim: 1,
            causal: true,
            scale: 1.0,
        };
        assert_eq!(s.visible_keys(0), usize::MAX);
        let s = AttentionParams {
            tq: usize::MAX,
            ..s
        };
        assert_eq!(s.visible_keys(usize::MAX - 1), usize::MAX);
        assert_eq!(s.visible_keys(usize::MAX), usize::MAX);
        assert_eq!(s.visible_keys(0), 1);
        let s = AttentionParams { tk: 3, ..s };
        // j ≤ i + tk − tq: the last query sees all 3 keys, 3 queries earlier sees one.
        assert_eq!(s.visible_keys(usize::MAX - 1), 3);
        assert_eq!(s.visible_keys(usize::MAX - 3), 1);
        assert_eq!(s.visible_keys(usize::MAX - 4), 0);
    }

    #[test]
    fn a_zero_batch_does_not_hide_an_overflow() {
        let half = 1usize << (usize::BITS / 2);
        let a = AttentionParams {
            batch: half,
            heads: half,
            n_kv_heads: half,
            tq: 0,
            tk: 0,
            head_dim: 1,
            causal: false,
            scale: 1.0,
        };
        assert!(matches!(
            a.q_len(),
            Err(ShapeError::Overflow { tensor: "q", .. })
        ));
    }
}
