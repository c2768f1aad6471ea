//! Rotary position embedding (RoPE), in place on q or k where the projection wrote them: the
//! op's parameters and argument struct ([`Rope`], one struct for the forward and the backward),
//! the frequency table ([`rope_frequencies`], θ and llama3 scaling), shared by the CPU reference
//! ([`crate::cpu`]) and the launchers (`kernels/rope.hip`).
//!
//! A view is described with attention's vocabulary ([`AttentionLayout`]: row `(b, h, t)` of
//! `head_dim` elements starts at `offset + b·batch_stride + h·head_stride + t·seq_stride`), so q
//! and k are rotated inside a fused QKV projection (`AttentionLayout::fused_qkv`), a
//! `[B, T, H, D]` projection (`AttentionLayout::bthd`) or packed `[B, H, T, D]` with no copy.
//! Call the op once for q and once for k (their head counts differ with grouped-query attention).

pub(crate) mod cpu;
mod device;
mod freqs;
#[cfg(feature = "golden")]
mod golden;

pub use device::{rope_backward, rope_forward, rope_vector_layout_ok};
pub use freqs::{rope_frequencies, RopeScaling};
#[cfg(feature = "golden")]
pub use golden::RopeCase;
#[cfg(feature = "golden")]
pub(crate) use golden::GOLDEN;

use crate::ops::AttentionLayout;
use crate::params::{check_len, checked_len, invalid, ShapeError, Space, TensorLen};

// Each struct runs itself on its space (`ops::Run`): the CPU reference, or the launcher.
crate::ops::run::launch! {
    Rope['a] T => rope_forward, rope_forward;
    RopeBackward['a] T => rope_backward, rope_backward;
}

/// The largest head dimension the op takes.
pub const ROPE_MAX_HEAD_DIM: usize = 256;

/// Dimensions and layout flags of a rotary embedding (forward and backward).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RopeParams {
    /// Sequences (may be 0).
    pub batch: usize,
    /// Positions per sequence row (a packed row of several sequences is one row; may be 0).
    pub seq: usize,
    /// Heads of the view (query heads for q, key/value heads for k).
    pub heads: usize,
    /// Elements per head, 1..=256.
    pub head_dim: usize,
    /// Rotated dims R at the start of each head (even, 2..=head_dim; `head_dim` for LLaMA, a
    /// fraction of it for GLM/ChatGLM's partial rotary). Dims R.. are left as they are.
    pub rotary_dim: usize,
    /// Pairs are `(2i, 2i+1)` (GPT-J, ChatGLM, GLM) instead of HF's rotate_half `(i, i + R/2)`.
    pub interleaved: bool,
}

impl RopeParams {
    /// Operation name used in errors.
    pub const OP: &'static str = "rope";

    /// Rotated pairs per head: `R/2`, the length of the frequency table.
    pub fn pairs(&self) -> usize {
        self.rotary_dim / 2
    }

    /// Tokens: `batch·seq`, the length of `positions`.
    pub fn tokens(&self) -> Result<usize, ShapeError> {
        checked_len(Self::OP, "positions", &[self.batch, self.seq])
    }

    fn validate(&self) -> Result<(), ShapeError> {
        let op = Self::OP;
        if !(1..=ROPE_MAX_HEAD_DIM).contains(&self.head_dim) {
            return Err(invalid(op, "head_dim", self.head_dim, "must be 1..=256"));
        }
        if self.rotary_dim < 2 || self.rotary_dim % 2 != 0 || self.rotary_dim > self.head_dim {
            return Err(invalid(
                op,
                "rotary_dim",
                self.rotary_dim,
                "must be even and in 2..=head_dim (the rotated dims come in pairs)",
            ));
        }
        Ok(())
    }
}

/// Rotate every pair of the first `rotary_dim` dims of every row `(b, h, t)` of the view of `x`
/// by the angle `positions[b·seq + t]·freqs[i]`: `(x1, x2) → (x1·cos a − x2·sin a,
/// x2·cos a + x1·sin a)` ([`crate::cpu::rope_forward`]); the backward rotates the gradient by
/// `−a` ([`crate::cpu::rope_backward`]). In place: only the rotated elements of the view are
/// read and written; its rows must not overlap.
pub struct Rope<'a, S: Space, T: hip_rt::Element> {
    /// Dimensions and layout flags.
    pub params: RopeParams,
    /// The buffer holding the view (q, k, their gradients, or the fused projection).
    pub x: S::Out<'a, T>,
    /// Where row `(b, h, t)` of the view starts in `x`.
    pub layout: AttentionLayout,
    /// Position of each token `[batch, seq]` (int32; packed sequences restart at 0; exact in
    /// the kernels' f32 up to 2^24).
    pub positions: S::In<'a, i32>,
    /// The frequency table `[rotary_dim / 2]` ([`rope_frequencies`]).
    pub freqs: S::In<'a, f32>,
}

impl<S: Space, T: hip_rt::Element> Rope<'_, S, T> {
    /// Check the dimensions, the view against the buffer and every length.
    pub fn validate(&self) -> Result<(), ShapeError> {
        let p = &self.params;
        p.validate()?;
        self.layout.validate(
            RopeParams::OP,
            "x",
            [p.batch, p.heads, p.seq, p.head_dim],
            self.x.numel(),
        )?;
        check_len(
            RopeParams::OP,
            "positions",
            p.tokens()?,
            self.positions.numel(),
        )?;
        check_len(RopeParams::OP, "freqs", p.pairs(), self.freqs.numel())
    }
}

/// The backward of [`Rope`] as its own struct, so that it runs itself ([`crate::ops::Run`]):
/// rotates the gradient view in `grad.x` by `−a` ([`crate::cpu::rope_backward`]).
pub struct RopeBackward<'a, S: Space, T: hip_rt::Element> {
    /// The gradient's view, positions and frequencies, as the forward's.
    pub grad: Rope<'a, S, T>,
}

impl<'a, S: Space, T: hip_rt::Element> From<RopeBackward<'a, S, T>> for Rope<'a, S, T> {
    fn from(b: RopeBackward<'a, S, T>) -> Self {
        b.grad
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::Host;

    fn params() -> RopeParams {
        RopeParams {
            batch: 1,
            seq: 2,
            heads: 1,
            head_dim: 4,
            rotary_dim: 4,
            interleaved: false,
        }
    }

    #[test]
    fn validation_names_the_values() {
        let mut x = [0.0f32; 8];
        let check = |p: RopeParams, x: &mut [f32], layout, pos: &[i32], f: &[f32]| {
            Rope::<Host, f32> {
                params: p,
                x,
                layout,
                positions: pos,
                freqs: f,
            }
            .validate()
            .unwrap_err()
            .to_string()
        };
        let packed = AttentionLayout::packed(1, 2, 4);
        let e = check(
            RopeParams {
                rotary_dim: 3,
                ..params()
            },
            &mut x,
            packed,
            &[0, 1],
            &[1.0],
        );
        assert!(e.contains("rotary_dim = 3"), "{e}");
        let e = check(
            RopeParams {
                head_dim: 257,
                ..params()
            },
            &mut x,
            packed,
            &[0, 1],
            &[1.0],
        );
        assert!(e.contains("head_dim = 257"), "{e}");
        let e = check(params(), &mut x[..7], packed, &[0, 1], &[1.0, 1.0]);
        assert!(e.contains("past the end"), "{e}");
        let e = check(params(), &mut x, packed, &[0], &[1.0, 1.0]);
        assert!(e.contains("`positions` has 1"), "{e}");
        let e = check(params(), &mut x, packed, &[0, 1], &[1.0]);
        assert!(e.contains("`freqs` has 1"), "{e}");
    }
}
