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
/// `[rows, cols]` and `dweight`, `dbias` `[cols]`, or with `accumulate` adds into them (the
/// old value widened to f64, the sum rounded once). See [`exact::layernorm_backward`].
pub fn layernorm_backward<T: DeviceElement>(
    a: LayerNormBackward<'_, Host, T>,
) -> Result<(), ShapeError> {
    let start = |v: &[T]| {
        if a.accumulate {
            widen(v)
        } else {
            vec![0.0; v.len()]
        }
    };
    let (mut dx64, mut dw64, mut db64) = (start(a.dx), start(a.dweight), start(a.dbias));
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
        accumulate: a.accumulate,
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
            accumulate: false,
        })
        .unwrap();
        assert_eq!((dx, dw, db), ([0.0, 0.0], [0.0], [3.5]));
    }

    #[test]
    fn accumulate_adds_into_every_output_and_overwrite_never_reads_them() {
        let s = LayerNormParams {
            rows: 2,
            cols: 4,
            eps: 1e-5,
        };
        let x = [1.0f32, -2.0, 0.5, 3.0, 0.25, 0.0, -1.0, 2.0];
        let w = [1.5f32, -0.5, 2.0, 1.0];
        let dys = [
            [0.5f32, 1.0, -1.0, 2.0, 1.0, -0.5, 0.25, 0.0],
            [-1.0f32, 0.5, 0.0, 1.0, 2.0, 1.0, -2.0, 0.5],
        ];
        let (mut y, mut m, mut r) = ([0.0f32; 8], [0.0f32; 2], [0.0f32; 2]);
        fwd(s, &x, &w, &w, &mut y, &mut m, &mut r).unwrap();
        let run = |dy: &[f32], out: (&mut [f32], &mut [f32], &mut [f32]), accumulate| {
            layernorm_backward(LayerNormBackward::<Host, f32> {
                params: s,
                x: &x,
                weight: &w,
                dy,
                mean: &m,
                rstd: &r,
                dx: out.0,
                dweight: out.1,
                dbias: out.2,
                accumulate,
            })
            .unwrap()
        };
        // Overwrite from NaN: the outputs are never read.
        let mut one = ([f32::NAN; 8], [f32::NAN; 4], [f32::NAN; 4]);
        let mut two = one;
        run(&dys[0], (&mut one.0, &mut one.1, &mut one.2), false);
        run(&dys[1], (&mut two.0, &mut two.1, &mut two.2), false);
        assert!(one
            .0
            .iter()
            .chain(&one.1)
            .chain(&one.2)
            .all(|v| v.is_finite()));
        // Two accumulating calls into non-zero outputs: init + g1 + g2 (each call rounds once).
        let init = ([0.5f32; 8], [-1.0f32; 4], [2.0f32; 4]);
        let mut acc = init;
        run(&dys[0], (&mut acc.0, &mut acc.1, &mut acc.2), true);
        run(&dys[1], (&mut acc.0, &mut acc.1, &mut acc.2), true);
        let sum = |i: &[f32], a: &[f32], b: &[f32]| -> Vec<f32> {
            i.iter()
                .zip(a)
                .zip(b)
                .map(|((i, a), b)| i + a + b)
                .collect()
        };
        for (got, want) in [
            (&acc.0[..], sum(&init.0, &one.0, &two.0)),
            (&acc.1[..], sum(&init.1, &one.1, &two.1)),
            (&acc.2[..], sum(&init.2, &one.2, &two.2)),
        ] {
            for (g, w) in got.iter().zip(&want) {
                assert!(
                    (g - w).abs() <= 1e-6 * w.abs().max(1.0),
                    "{got:?} vs {want:?}"
                );
            }
        }
        // dbias is Σ dy: exact in f32 here.
        assert_eq!(acc.2, [4.5, 4.0, -0.75, 5.5]);
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
            accumulate: false,
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
