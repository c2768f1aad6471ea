//! Layer normalization over the last dimension of a `[rows, cols]` tensor: the op's parameters
//! and argument structs ([`LayerNormForward`], [`LayerNormBackward`]), shared by the CPU
//! reference ([`crate::cpu`]) and the launchers (`kernels/layernorm.hip`).

pub(crate) mod cpu;
mod device;
#[cfg(feature = "golden")]
mod golden;
#[cfg(feature = "golden")]
mod golden_residual;
mod residual;

pub use device::{layernorm_backward, layernorm_forward, wide_layout_ok, RowPlan, MAX_COLS};
#[cfg(feature = "golden")]
pub use golden::{LayerNormBackwardCase, LayerNormForwardCase};
#[cfg(feature = "golden")]
pub use golden_residual::ResidualLayerNormCase;
pub use residual::{
    residual_layernorm_forward_device as residual_layernorm_forward, ResidualLayerNormForward,
    ResidualLayerNormParams,
};

use crate::params::{check_len, checked_len, invalid, ShapeError, Space, TensorLen};

// Each struct runs itself on its space (`ops::Run`): the CPU reference, or the launcher.
crate::ops::run::launch! {
    LayerNormForward['a] T => layernorm_forward, layernorm_forward;
    LayerNormBackward['a] T => layernorm_backward, layernorm_backward;
    ResidualLayerNormForward['a] T => residual_layernorm_forward, residual_layernorm_forward;
}

/// Dimensions and hyper-parameters of layer norm (forward and backward).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerNormParams {
    /// Number of normalized rows (may be 0).
    pub rows: usize,
    /// Normalized (last) dimension, at least 1.
    pub cols: usize,
    /// Variance epsilon, inside the square root (finite, ≥ 0). The backward does not use it (it
    /// reads the saved `rstd`) but validates it all the same.
    pub eps: f32,
}

impl LayerNormParams {
    /// Operation name used in errors.
    pub const OP: &'static str = "layernorm";

    /// Elements of `x`, `y`, `dy`, `dx`.
    pub fn x_len(&self) -> Result<usize, ShapeError> {
        checked_len(Self::OP, "x", &[self.rows, self.cols])
    }

    /// Check `eps`, `cols` and the lengths every layer norm tensor shares.
    fn validate_common(
        &self,
        x: usize,
        weight: usize,
        mean: usize,
        rstd: usize,
    ) -> Result<(), ShapeError> {
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
        check_len(Self::OP, "mean", self.rows, mean)?;
        check_len(Self::OP, "rstd", self.rows, rstd)
    }
}

/// Layer norm forward: `y = (x − mean)·rstd·weight + bias` per row, biased variance,
/// `rstd = 1/√(var + eps)`; the per-row `mean` and `rstd` are saved (f32) for the backward.
pub struct LayerNormForward<'a, S: Space, T: hip_rt::Element> {
    /// Rows, columns and `eps`.
    pub params: LayerNormParams,
    /// Input `[rows, cols]`.
    pub x: S::In<'a, T>,
    /// Scale `[cols]`.
    pub weight: S::In<'a, T>,
    /// Shift `[cols]`.
    pub bias: S::In<'a, T>,
    /// Output `[rows, cols]`.
    pub y: S::Out<'a, T>,
    /// Per-row mean `[rows]`.
    pub mean: S::Out<'a, f32>,
    /// Per-row `1/√(var + eps)` `[rows]`.
    pub rstd: S::Out<'a, f32>,
}

impl<S: Space, T: hip_rt::Element> LayerNormForward<'_, S, T> {
    /// Check `eps` and every length (the CPU reference and the launcher call this first).
    pub fn validate(&self) -> Result<(), ShapeError> {
        let p = &self.params;
        p.validate_common(
            self.x.numel(),
            self.weight.numel(),
            self.mean.numel(),
            self.rstd.numel(),
        )?;
        check_len(LayerNormParams::OP, "bias", p.cols, self.bias.numel())?;
        check_len(LayerNormParams::OP, "y", p.x_len()?, self.y.numel())
    }
}

/// Layer norm backward from the saved `mean` and `rstd`: with `x̂ = (x − mean)·rstd` and
/// `g = dy·weight`, `dx (+)= rstd·(g − mean(g) − x̂·mean(g·x̂))`, `dweight (+)= Σ_rows dy·x̂`,
/// `dbias (+)= Σ_rows dy`.
///
/// With [`accumulate`](Self::accumulate) all three outputs are added into (the contract of
/// [`BiasParams::accumulate`](crate::ops::BiasParams::accumulate) and the encoder backward's):
/// `dx` into the gradient already there (a residual stream's), `dweight`/`dbias` across
/// micro-batches. The sum is formed at full precision (f32 on the device, f64 in the CPU
/// reference) and rounded to `T` once. Without it the outputs are overwritten and never read,
/// so they need no initialisation.
pub struct LayerNormBackward<'a, S: Space, T: hip_rt::Element> {
    /// Rows, columns (and the forward's `eps`, validated but unused).
    pub params: LayerNormParams,
    /// The forward's input `[rows, cols]`.
    pub x: S::In<'a, T>,
    /// The forward's scale `[cols]`.
    pub weight: S::In<'a, T>,
    /// Gradient of `y` `[rows, cols]`.
    pub dy: S::In<'a, T>,
    /// Saved per-row mean `[rows]`.
    pub mean: S::In<'a, f32>,
    /// Saved per-row `rstd` `[rows]`.
    pub rstd: S::In<'a, f32>,
    /// Gradient of `x` `[rows, cols]`.
    pub dx: S::Out<'a, T>,
    /// Gradient of `weight` `[cols]`.
    pub dweight: S::Out<'a, T>,
    /// Gradient of `bias` `[cols]`.
    pub dbias: S::Out<'a, T>,
    /// Add into `dx`, `dweight` and `dbias` instead of overwriting them.
    pub accumulate: bool,
}

impl<S: Space, T: hip_rt::Element> LayerNormBackward<'_, S, T> {
    /// Check every length (the CPU reference and the launcher call this first).
    pub fn validate(&self) -> Result<(), ShapeError> {
        let p = &self.params;
        let op = LayerNormParams::OP;
        p.validate_common(
            self.x.numel(),
            self.weight.numel(),
            self.mean.numel(),
            self.rstd.numel(),
        )?;
        check_len(op, "dy", p.x_len()?, self.dy.numel())?;
        check_len(op, "dx", p.x_len()?, self.dx.numel())?;
        check_len(op, "dweight", p.cols, self.dweight.numel())?;
        check_len(op, "dbias", p.cols, self.dbias.numel())
    }
}

#[cfg(feature = "golden")]
pub(crate) use golden::GOLDEN;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::Host;

    #[test]
    fn validation_names_the_values() {
        let (x, w, b) = ([0.0f32; 0], [0.0f32; 0], [0.0f32; 0]);
        let (mut y, mut m, mut r) = ([0.0f32; 0], [0.0f32; 2], [0.0f32; 2]);
        let a = LayerNormForward::<Host, f32> {
            params: LayerNormParams {
                rows: 2,
                cols: 0,
                eps: 1e-5,
            },
            x: &x,
            weight: &w,
            bias: &b,
            y: &mut y,
            mean: &mut m,
            rstd: &mut r,
        };
        let e = a.validate().unwrap_err();
        assert!(e.to_string().contains("cols = 0"), "{e}");
    }
}
