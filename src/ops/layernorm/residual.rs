//! Layer norm fused with the residual add (`x = a + b; y = LN(x)`, both returned, as llm.c's
//! fused residual kernel): the argument struct, the CPU reference and the launcher (one fused
//! kernel of `kernels/layernorm.hip`, run on hip-emu only, never on a GPU).

use super::{LayerNormForward, LayerNormParams};
use crate::ops::gelu::{ElementwiseParams, ResidualAdd};
use crate::ops::OpError;
use crate::params::{check_len, DeviceElement, Host, OnDevice, ShapeError, Space, TensorLen};
use hip_rt::Stream;

/// The params of [`ResidualLayerNormForward`]: layer norm's.
pub type ResidualLayerNormParams = LayerNormParams;

/// `residual = a + b` (rounded to T), then `y, mean, rstd = layer_norm(residual)`.
pub struct ResidualLayerNormForward<'a, S: Space, T: hip_rt::Element> {
    /// Rows, columns and `eps`.
    pub params: LayerNormParams,
    /// Residual stream `[rows, cols]`.
    pub a: S::In<'a, T>,
    /// Branch output `[rows, cols]` added to it.
    pub b: S::In<'a, T>,
    /// Layer-norm scale `[cols]`.
    pub weight: S::In<'a, T>,
    /// Layer-norm shift `[cols]`.
    pub bias: S::In<'a, T>,
    /// The new residual `x = a + b` `[rows, cols]` (overwritten).
    pub residual: S::Out<'a, T>,
    /// `LN(x)` `[rows, cols]` (overwritten).
    pub y: S::Out<'a, T>,
    /// Per-row mean of `x` (f32, overwritten).
    pub mean: S::Out<'a, f32>,
    /// Per-row `1/√(var + eps)` of `x` (f32, overwritten).
    pub rstd: S::Out<'a, f32>,
}

impl<S: Space, T: hip_rt::Element> ResidualLayerNormForward<'_, S, T> {
    /// Check `eps` and every length.
    pub fn validate(&self) -> Result<(), ShapeError> {
        let p = &self.params;
        p.validate_common(
            self.a.numel(),
            self.weight.numel(),
            self.mean.numel(),
            self.rstd.numel(),
        )?;
        let op = LayerNormParams::OP;
        check_len(op, "bias", p.cols, self.bias.numel())?;
        check_len(op, "b", p.x_len()?, self.b.numel())?;
        check_len(op, "residual", p.x_len()?, self.residual.numel())?;
        check_len(op, "y", p.x_len()?, self.y.numel())
    }
}

/// [`ResidualLayerNormForward`] on host slices: `x = a + b` rounded once to T and written to
/// `residual`, then [`crate::cpu::layernorm_forward`] of that stored `x`: the statistics are
/// those of the residual the next layer reads, so the fused op equals an add followed by a
/// layer norm. Every length and `eps` are checked before anything is written.
pub fn residual_layernorm_forward<T: DeviceElement>(
    a: ResidualLayerNormForward<'_, Host, T>,
) -> Result<(), ShapeError> {
    a.validate()?;
    crate::cpu::residual_add(ResidualAdd::<Host, T> {
        params: ElementwiseParams { len: a.a.len() },
        a: a.a,
        b: a.b,
        out: &mut *a.residual,
    })?;
    crate::cpu::layernorm_forward(LayerNormForward::<Host, T> {
        params: a.params,
        x: a.residual,
        weight: a.weight,
        bias: a.bias,
        y: a.y,
        mean: a.mean,
        rstd: a.rstd,
    })
}

/// [`ResidualLayerNormForward`] on `stream`: one launch (`layernorm_fwd_residual_<T>` of
/// `kernels/layernorm.hip`) that writes `residual = a + b` rounded to T and normalises that
/// rounded, stored residual (the CPU reference's semantics; f32 math, mean and rstd f32), for
/// every `cols` [`super::layernorm_forward`] takes. Queues the work; no host sync.
pub fn residual_layernorm_forward_device<T: DeviceElement>(
    stream: &Stream,
    a: ResidualLayerNormForward<'_, OnDevice, T>,
) -> Result<(), OpError> {
    a.validate()?;
    super::device::residual_forward(stream, a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::gelu::ElementwiseParams;
    use crate::params::Host;

    #[test]
    fn fused_equals_add_then_layernorm() {
        let a = [1.0f32, 2.0, 3.0, -1.0, 0.5, 4.0];
        let b = [0.25f32, -2.0, 1.0, 3.0, 0.5, -4.0];
        let (w, bi) = ([1.0f32, 2.0, 0.5], [0.0f32, 1.0, -1.0]);
        let (mut x, mut y, mut m, mut r) = ([0.0f32; 6], [0.0f32; 6], [0.0f32; 2], [0.0f32; 2]);
        residual_layernorm_forward(ResidualLayerNormForward::<Host, f32> {
            params: LayerNormParams {
                rows: 2,
                cols: 3,
                eps: 1e-5,
            },
            a: &a,
            b: &b,
            weight: &w,
            bias: &bi,
            residual: &mut x,
            y: &mut y,
            mean: &mut m,
            rstd: &mut r,
        })
        .unwrap();
        assert_eq!(x, [1.25, 0.0, 4.0, 2.0, 1.0, 0.0]);
        let (mut y2, mut m2, mut r2) = ([0.0f32; 6], [0.0f32; 2], [0.0f32; 2]);
        crate::cpu::layernorm_forward(LayerNormForward::<Host, f32> {
            params: LayerNormParams {
                rows: 2,
                cols: 3,
                eps: 1e-5,
            },
            x: &x,
            weight: &w,
            bias: &bi,
            y: &mut y2,
            mean: &mut m2,
            rstd: &mut r2,
        })
        .unwrap();
        assert_eq!((y, m, r), (y2, m2, r2));
        let e = crate::cpu::residual_add(ResidualAdd::<Host, f32> {
            params: ElementwiseParams { len: 6 },
            a: &a,
            b: &b[..5],
            out: &mut x,
        })
        .unwrap_err();
        assert!(e.to_string().contains("`b` has 5 elements"), "{e}");
    }
}
