//! The residual stream: elementwise add, and layer norm fused with the residual add.

use super::gelu::ElementwiseParams;
use super::{layernorm_forward, Element, LayerNormShape, ShapeError};
use crate::params::check_len;

/// Arguments of [`residual_add`].
#[derive(Debug)]
pub struct ResidualAdd<'a, T> {
    /// Length.
    pub params: ElementwiseParams,
    /// First addend.
    pub a: &'a [T],
    /// Second addend, same length.
    pub b: &'a [T],
    /// `a + b`, same length (overwritten).
    pub out: &'a mut [T],
}

/// `out = a + b` elementwise, each sum rounded once.
pub fn residual_add<T: Element>(args: ResidualAdd<'_, T>) -> Result<(), ShapeError> {
    args.params.validate(
        "residual_add",
        &[
            ("a", args.a.len()),
            ("b", args.b.len()),
            ("out", args.out.len()),
        ],
    )?;
    for ((o, a), b) in args.out.iter_mut().zip(args.a).zip(args.b) {
        *o = T::from_f64(a.to_f64() + b.to_f64());
    }
    Ok(())
}

/// Dimensions and `eps` of [`residual_layernorm_forward`] (those of layer norm).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ResidualLayerNormParams {
    /// Rows (may be 0).
    pub rows: usize,
    /// Normalized (last) dimension, at least 1.
    pub cols: usize,
    /// Added to the variance inside the square root (finite, ≥ 0).
    pub eps: f32,
}

/// Arguments of [`residual_layernorm_forward`].
#[derive(Debug)]
pub struct ResidualLayerNormForward<'a, T> {
    /// Rows, columns and `eps`.
    pub params: ResidualLayerNormParams,
    /// Residual stream `[rows, cols]`.
    pub a: &'a [T],
    /// Branch output `[rows, cols]` added to it.
    pub b: &'a [T],
    /// Layer-norm scale `[cols]`.
    pub weight: &'a [T],
    /// Layer-norm shift `[cols]`.
    pub bias: &'a [T],
    /// The new residual `x = a + b` `[rows, cols]` (overwritten).
    pub residual: &'a mut [T],
    /// `LN(x)` `[rows, cols]` (overwritten).
    pub y: &'a mut [T],
    /// Per-row mean of `x` (f32, overwritten).
    pub mean: &'a mut [f32],
    /// Per-row `1/√(var + eps)` of `x` (f32, overwritten).
    pub rstd: &'a mut [f32],
}

/// `x = a + b` (rounded once to the storage type, written to `residual`), then
/// [`layernorm_forward`] of that stored `x`, as llm.c's fused residual kernel does: the
/// statistics are those of the residual the next layer reads, so the fused op equals an add
/// followed by a layer norm. Every length and `eps` are checked before anything is written.
pub fn residual_layernorm_forward<T: Element>(
    args: ResidualLayerNormForward<'_, T>,
) -> Result<(), ShapeError> {
    let ResidualLayerNormForward {
        params,
        a,
        b,
        weight,
        bias,
        residual,
        y,
        mean,
        rstd,
    } = args;
    let (shape, eps) = (
        LayerNormShape {
            rows: params.rows,
            cols: params.cols,
        },
        params.eps,
    );
    shape.validate_forward(
        eps,
        a.len(),
        weight.len(),
        bias.len(),
        y.len(),
        mean.len(),
        rstd.len(),
    )?;
    check_len(LayerNormShape::OP, "b", a.len(), b.len())?;
    check_len(LayerNormShape::OP, "residual", a.len(), residual.len())?;
    residual_add(ResidualAdd {
        params: ElementwiseParams { len: a.len() },
        a,
        b,
        out: residual,
    })?;
    layernorm_forward(&shape, eps, residual, weight, bias, y, mean, rstd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fused_equals_add_then_layernorm() {
        let s = LayerNormShape { rows: 2, cols: 3 };
        let a = [1.0f32, 2.0, 3.0, -1.0, 0.5, 4.0];
        let b = [0.25f32, -2.0, 1.0, 3.0, 0.5, -4.0];
        let (w, bi) = ([1.0f32, 2.0, 0.5], [0.0f32, 1.0, -1.0]);
        let (mut x, mut y, mut m, mut r) = ([0.0f32; 6], [0.0f32; 6], [0.0f32; 2], [0.0f32; 2]);
        residual_layernorm_forward(ResidualLayerNormForward {
            params: ResidualLayerNormParams {
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
        layernorm_forward(&s, 1e-5, &x, &w, &bi, &mut y2, &mut m2, &mut r2).unwrap();
        assert_eq!((y, m, r), (y2, m2, r2));
        let e = residual_add(ResidualAdd {
            params: ElementwiseParams { len: 6 },
            a: &a,
            b: &b[..5],
            out: &mut x,
        })
        .unwrap_err();
        assert!(e.to_string().contains("`b` has 5 elements"), "{e}");
    }
}
