//! Layer norm forward and backward over the last dimension, f64 internally.

use super::{LayerNormBackward, LayerNormForward};
use crate::cpu::{exact, narrow, widen};
use crate::params::{DeviceElement, Exact, Host, ShapeError};

pub use super::residual::residual_layernorm_forward;

/// [`LayerNormForward`] on host slices: writes `y` (storage type) and the per-row `mean` and
/// `rstd` (f32, rounded from f64). `y` is computed from the unrounded f64 statistics.
pub fn layernorm_forward<T: DeviceElement>(
    a: LayerNormForward<'_, Host, T>,
) -> Result<(), ShapeError> {
    let (mut y64, mut m64, mut r64) = (
        vec![0.0; a.y.len()],
        vec![0.0; a.mean.len()],
        vec![0.0; a.rstd.len()],
    );
    exact::layernorm_forward(LayerNormForward::<Exact, f64> {
        params: a.params,
        x: &widen(a.x),
        weight: &widen(a.weight),
        bias: &widen(a.bias),
        y: &mut y64,
        mean: &mut m64,
        rstd: &mut r64,
    })?;
    narrow(&y64, a.y);
    narrow(&m64, a.mean);
    narrow(&r64, a.rstd);
    Ok(())
}

/// [`LayerNormBackward`] on host slices, from the saved f32 `mean` and `rstd`: writes `dx`
/// `[rows, cols]` and `dweight`, `dbias` `[cols]` (overwritten, not accumulated). See
/// [`exact::layernorm_backward`].
pub fn layernorm_backward<T: DeviceElement>(
    a: LayerNormBackward<'_, Host, T>,
) -> Result<(), ShapeError> {
    let (mut dx64, mut dw64, mut db64) = (
        vec![0.0; a.dx.len()],
        vec![0.0; a.dweight.len()],
        vec![0.0; a.dbias.len()],
    );
    exact::layernorm_backward(LayerNormBackward::<Exact, f64> {
        params: a.params,
        x: &widen(a.x),
        weight: &widen(a.weight),
        dy: &widen(a.dy),
        mean: &widen(a.mean),
        rstd: &widen(a.rstd),
        dx: &mut dx64,
        dweight: &mut dw64,
        dbias: &mut db64,
    })?;
    narrow(&dx64, a.dx);
    narrow(&dw64, a.dweight);
    narrow(&db64, a.dbias);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::LayerNormParams;

    fn fwd(
        p: LayerNormParams,
        x: &[f32],
        weight: &[f32],
        bias: &[f32],
        y: &mut [f32],
        mean: &mut [f32],
        rstd: &mut [f32],
    ) -> Result<(), ShapeError> {
        layernorm_forward(LayerNormForward::<Host, f32> {
            params: p,
            x,
            weight,
            bias,
            y,
            mean,
            rstd,
        })
    }

    #[test]
    fn normalizes_a_row_and_handles_one_column() {
        let s = LayerNormParams {
            rows: 1,
            cols: 4,
            eps: 0.0,
        };
        let x = [1.0f32, 2., 3., 4.];
        let (mut y, mut m, mut r) = ([0.0f32; 4], [0.0f32], [0.0f32]);
        fwd(s, &x, &[2.0; 4], &[1.0; 4], &mut y, &mut m, &mut r).unwrap();
        let rs = 1.0 / 1.25f64.sqrt();
        assert_eq!((m[0], r[0]), (2.5, rs as f32));
        assert_eq!(
            y,
            [
                (1.0 - 3.0 * rs) as f32,
                (1.0 - rs) as f32,
                (1.0 + rs) as f32,
                (1.0 + 3.0 * rs) as f32
            ]
        );
        // C = 1: x̂ = 0, so y = bias and dx = 0, dbias = dy.
        let s1 = LayerNormParams {
            rows: 2,
            cols: 1,
            eps: 1e-5,
        };
        let (mut y, mut m, mut r) = ([9.0f32; 2], [0.0f32; 2], [0.0f32; 2]);
        fwd(s1, &[3.0, -7.0], &[2.0], &[0.5], &mut y, &mut m, &mut r).unwrap();
        assert_eq!(y, [0.5, 0.5]);
        let (mut dx, mut dw, mut db) = ([1.0f32; 2], [1.0f32], [1.0f32]);
        layernorm_backward(LayerNormBackward::<Host, f32> {
            params: s1,
            x: &[3.0, -7.0],
            weight: &[2.0],
            dy: &[1.5, 2.0],
            mean: &m,
            rstd: &r,
            dx: &mut dx,
            dweight: &mut dw,
            dbias: &mut db,
        })
        .unwrap();
        assert_eq!((dx, dw, db), ([0.0, 0.0], [0.0], [3.5]));
    }

    #[test]
    fn rejects_bad_eps_and_lengths() {
        let s = LayerNormParams {
            rows: 2,
            cols: 3,
            eps: -1.0,
        };
        let e = fwd(
            s,
            &[0.0f32; 6],
            &[0.0; 3],
            &[0.0; 3],
            &mut [0.0; 6],
            &mut [0.0; 2],
            &mut [0.0; 2],
        )
        .unwrap_err();
        assert!(e.to_string().contains("eps = -1"), "{e}");
        let e = layernorm_backward(LayerNormBackward::<Host, f32> {
            params: LayerNormParams { eps: 1e-5, ..s },
            x: &[0.0f32; 6],
            weight: &[0.0; 3],
            dy: &[0.0; 6],
            mean: &[0.0; 2],
            rstd: &[0.0; 1],
            dx: &mut [0.0; 6],
            dweight: &mut [0.0; 3],
            dbias: &mut [0.0; 3],
        })
        .unwrap_err();
        assert_eq!(
            e,
            ShapeError::Length {
                op: "layernorm",
                tensor: "rstd",
                expected: 2,
                got: 1
            }
        );
    }
}
