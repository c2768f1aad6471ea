//! RMS norm over the last dimension of a `[rows, cols]` tensor (LLaMA's RMSNorm,
//! `torch.nn.functional.rms_norm`): `y = x / √(mean(x²) + eps) ∘ w`. The op's parameters and
//! argument structs ([`RmsNormForward`], [`RmsNormBackward`], [`ResidualRmsNormForward`]),
//! shared by the CPU reference ([`crate::cpu`]) and the launchers (`kernels/rmsnorm.hip`).

pub(crate) mod cpu;
mod device;
#[cfg(feature = "golden")]
mod golden;

pub use device::{residual_rmsnorm_forward, rmsnorm_backward, rmsnorm_forward};
#[cfg(feature = "golden")]
pub(crate) use golden::GOLDEN;
#[cfg(feature = "golden")]
pub use golden::{RmsNormBackwardCase, RmsNormForwardCase, RmsNormVariant};

use crate::params::{check_len, checked_len, invalid, ShapeError, Space, TensorLen};

// Each struct runs itself on its space (`ops::Run`): the CPU reference, or the launcher.
crate::ops::run::launch! {
    RmsNormForward['a] T => rmsnorm_forward, rmsnorm_forward;
    ResidualRmsNormForward['a] T => residual_rmsnorm_forward, residual_rmsnorm_forward;
    RmsNormBackward['a] T => rmsnorm_backward, rmsnorm_backward;
}

/// Dimensions and epsilon of RMS norm (forward, backward and the residual forward).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RmsNormParams {
    /// Number of normalized rows (may be 0).
    pub rows: usize,
    /// Normalized (last) dimension, at least 1.
    pub cols: usize,
    /// Epsilon inside the square root (finite, ≥ 0; LLaMA 1e-5 or 1e-6). The backward reads the
    /// saved `rstd` instead but validates it all the same.
    pub eps: f32,
}

impl RmsNormParams {
    /// Operation name used in errors.
    pub const OP: &'static str = "rmsnorm";

    /// Elements of `x`, `y`, `dy`, `dx`.
    pub fn x_len(&self) -> Result<usize, ShapeError> {
        checked_len(Self::OP, "x", &[self.rows, self.cols])
    }

    /// Check `eps`, `cols` and the lengths every RMS norm tensor shares.
    fn validate_common(&self, x: usize, weight: usize, rstd: usize) -> Result<(), ShapeError> {
        if !(self.eps.is_finite() && self.eps >= 0.0) {
            return Err(invalid(
                Self::OP,
                "eps",
                self.eps,
                "must be finite and non-negative",
            ));
        }
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
        check_len(Self::OP, "rstd", self.rows, rstd)
    }
}

/// RMS norm forward: `rstd = 1/√(mean(x²) + eps)`, `y = x·rstd·weight` per row; the per-row
/// `rstd` is saved (f32) for the backward.
pub struct RmsNormForward<'a, S: Space, T: hip_rt::Element> {
    /// Rows, columns and `eps`.
    pub params: RmsNormParams,
    /// Input `[rows, cols]`.
    pub x: S::In<'a, T>,
    /// Scale `[cols]`.
    pub weight: S::In<'a, T>,
    /// Output `[rows, cols]` (overwritten).
    pub y: S::Out<'a, T>,
    /// Per-row `1/√(mean(x²) + eps)` `[rows]` (f32, overwritten).
    pub rstd: S::Out<'a, f32>,
}

impl<S: Space, T: hip_rt::Element> RmsNormForward<'_, S, T> {
    /// Check `eps` and every length (the CPU reference and the launcher call this first).
    pub fn validate(&self) -> Result<(), ShapeError> {
        let p = &self.params;
        p.validate_common(self.x.numel(), self.weight.numel(), self.rstd.numel())?;
        check_len(RmsNormParams::OP, "y", p.x_len()?, self.y.numel())
    }
}

/// `residual = a + b` (rounded to T), then `y, rstd = rms_norm(residual)`: the pattern of every
/// LLaMA layer (the residual stream and the next norm's input in one pass).
pub struct ResidualRmsNormForward<'a, S: Space, T: hip_rt::Element> {
    /// Rows, columns and `eps`.
    pub params: RmsNormParams,
    /// Residual stream `[rows, cols]`.
    pub a: S::In<'a, T>,
    /// Branch output `[rows, cols]` added to it.
    pub b: S::In<'a, T>,
    /// Scale `[cols]`.
    pub weight: S::In<'a, T>,
    /// The new residual `a + b` `[rows, cols]` (overwritten).
    pub residual: S::Out<'a, T>,
    /// `rms_norm(residual)` `[rows, cols]` (overwritten).
    pub y: S::Out<'a, T>,
    /// Per-row `rstd` of the residual (f32, overwritten).
    pub rstd: S::Out<'a, f32>,
}

impl<S: Space, T: hip_rt::Element> ResidualRmsNormForward<'_, S, T> {
    /// Check `eps` and every length.
    pub fn validate(&self) -> Result<(), ShapeError> {
        let p = &self.params;
        let op = RmsNormParams::OP;
        p.validate_common(self.a.numel(), self.weight.numel(), self.rstd.numel())?;
        check_len(op, "b", p.x_len()?, self.b.numel())?;
        check_len(op, "residual", p.x_len()?, self.residual.numel())?;
        check_len(op, "y", p.x_len()?, self.y.numel())
    }
}

/// RMS norm backward from the saved `rstd`: with `x̂ = x·rstd` and `g = dy·weight`,
/// `dx (+)= rstd·(g − x̂·mean(g·x̂))`, `dweight (+)= Σ_rows dy·x̂`.
///
/// With [`accumulate`](Self::accumulate) both outputs are added into (the contract of
/// [`crate::ops::LayerNormBackward::accumulate`]): `dx` into the residual stream's gradient,
/// `dweight` across micro-batches; the sum is formed at full precision and rounded to `T` once.
/// Without it the outputs are overwritten and never read.
pub struct RmsNormBackward<'a, S: Space, T: hip_rt::Element> {
    /// Rows, columns (and the forward's `eps`, validated but unused).
    pub params: RmsNormParams,
    /// The forward's input `[rows, cols]`.
    pub x: S::In<'a, T>,
    /// The forward's scale `[cols]`.
    pub weight: S::In<'a, T>,
    /// Gradient of `y` `[rows, cols]`.
    pub dy: S::In<'a, T>,
    /// Saved per-row `rstd` `[rows]`.
    pub rstd: S::In<'a, f32>,
    /// Gradient of `x` `[rows, cols]`.
    pub dx: S::Out<'a, T>,
    /// Gradient of `weight` `[cols]`.
    pub dweight: S::Out<'a, T>,
    /// Add into `dx` and `dweight` instead of overwriting them.
    pub accumulate: bool,
}

impl<S: Space, T: hip_rt::Element> RmsNormBackward<'_, S, T> {
    /// Check every length (the CPU reference and the launcher call this first).
    pub fn validate(&self) -> Result<(), ShapeError> {
        let p = &self.params;
        let op = RmsNormParams::OP;
        p.validate_common(self.x.numel(), self.weight.numel(), self.rstd.numel())?;
        check_len(op, "dy", p.x_len()?, self.dy.numel())?;
        check_len(op, "dx", p.x_len()?, self.dx.numel())?;
        check_len(op, "dweight", p.cols, self.dweight.numel())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::Host;

    #[test]
    fn validation_names_the_values() {
        let (x, w) = ([0.0f32; 0], [0.0f32; 0]);
        let (mut y, mut r) = ([0.0f32; 0], [0.0f32; 2]);
        let p = RmsNormParams {
            rows: 2,
            cols: 0,
            eps: 1e-5,
        };
        let a = RmsNormForward::<Host, f32> {
            params: p,
            x: &x,
            weight: &w,
            y: &mut y,
            rstd: &mut r,
        };
        let e = a.validate().unwrap_err();
        assert!(e.to_string().contains("cols = 0"), "{e}");
        let a = RmsNormForward::<Host, f32> {
            params: RmsNormParams {
                cols: 1,
                eps: f32::NAN,
                ..p
            },
            x: &[0.0; 2],
            weight: &[1.0],
            y: &mut [0.0; 2],
            rstd: &mut r,
        };
        let e = a.validate().unwrap_err();
        assert!(e.to_string().contains("eps = NaN"), "{e}");
    }
}
