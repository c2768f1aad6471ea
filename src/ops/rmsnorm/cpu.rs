//! RMS norm forward, backward and residual forward on host slices, f64 internally.

use super::{ResidualRmsNormForward, RmsNormBackward, RmsNormForward, RmsNormParams};
use crate::cpu::{narrow, widen};
use crate::ops::gelu::{ElementwiseParams, ResidualAdd};
use crate::params::{DeviceElement, Host, ShapeError};

/// The f64 rstd of every row of `x` `[rows, cols]`.
fn rstd64(p: &RmsNormParams, x: &[f64]) -> Vec<f64> {
    x.chunks_exact(p.cols)
        .map(|r| {
            1.0 / (r.iter().map(|v| v * v).sum::<f64>() / p.cols as f64 + f64::from(p.eps)).sqrt()
        })
        .collect()
}

/// [`RmsNormForward`] on host slices: writes `y` (storage type) and the per-row `rstd` (f32,
/// rounded from f64). `y` is computed from the unrounded f64 `rstd`.
pub fn rmsnorm_forward<T: DeviceElement>(a: RmsNormForward<'_, Host, T>) -> Result<(), ShapeError> {
    a.validate()?;
    let p = a.params;
    if p.rows == 0 {
        return Ok(());
    }
    let (x, w) = (widen(a.x), widen(a.weight));
    let rstd = rstd64(&p, &x);
    let y: Vec<f64> = x
        .chunks_exact(p.cols)
        .zip(&rstd)
        .flat_map(|(r, s)| r.iter().zip(&w).map(move |(v, w)| v * s * w))
        .collect();
    narrow(&y, a.y);
    narrow(&rstd, a.rstd);
    Ok(())
}

/// [`ResidualRmsNormForward`] on host slices: `residual = a + b` rounded once to T, then
/// [`rmsnorm_forward`] of that stored residual (so the fused op equals an add followed by an
/// RMS norm). Every length and `eps` are checked before anything is written.
pub fn residual_rmsnorm_forward<T: DeviceElement>(
    a: ResidualRmsNormForward<'_, Host, T>,
) -> Result<(), ShapeError> {
    a.validate()?;
    crate::cpu::residual_add(ResidualAdd::<Host, T> {
        params: ElementwiseParams { len: a.a.len() },
        a: a.a,
        b: a.b,
        out: &mut *a.residual,
    })?;
    rmsnorm_forward(RmsNormForward::<Host, T> {
        params: a.params,
        x: a.residual,
        weight: a.weight,
        y: a.y,
        rstd: a.rstd,
    })
}

/// [`RmsNormBackward`] on host slices, from the saved f32 `rstd`: writes `dx` `[rows, cols]` and
/// `dweight` `[cols]`, or with `accumulate` adds into them (the old value widened to f64, the sum
/// rounded once).
pub fn rmsnorm_backward<T: DeviceElement>(
    a: RmsNormBackward<'_, Host, T>,
) -> Result<(), ShapeError> {
    a.validate()?;
    let p = a.params;
    let start = |v: &[T]| {
        if a.accumulate {
            widen(v)
        } else {
            vec![0.0; v.len()]
        }
    };
    let (mut dx, mut dw) = (start(a.dx), start(a.dweight));
    let (x, w, dy) = (widen(a.x), widen(a.weight), widen(a.dy));
    let inv_c = 1.0 / p.cols as f64;
    for (row, &rstd) in a.rstd.iter().enumerate() {
        let rstd = f64::from(rstd);
        let span = row * p.cols..(row + 1) * p.cols;
        let (xr, dyr) = (&x[span.clone()], &dy[span.clone()]);
        let m = xr
            .iter()
            .zip(dyr)
            .zip(&w)
            .map(|((x, dy), w)| dy * w * x * rstd)
            .sum::<f64>()
            * inv_c;
        for (j, out) in dx[span].iter_mut().enumerate() {
            let xh = xr[j] * rstd;
            *out += rstd * (dyr[j] * w[j] - xh * m);
            dw[j] += dyr[j] * xh;
        }
    }
    narrow(&dx, a.dx);
    narrow(&dw, a.dweight);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(rows: usize, cols: usize) -> RmsNormParams {
        RmsNormParams {
            rows,
            cols,
            eps: 1e-6,
        }
    }

    #[test]
    fn normalizes_by_the_root_mean_square() {
        let x = [3.0f32, 4.0, -1.0, 1.0];
        let (mut y, mut r) = ([0.0f32; 4], [0.0f32; 2]);
        rmsnorm_forward(RmsNormForward::<Host, f32> {
            params: RmsNormParams {
                eps: 0.0,
                ..p(2, 2)
            },
            x: &x,
            weight: &[2.0, 1.0],
            y: &mut y,
            rstd: &mut r,
        })
        .unwrap();
        let s = 1.0 / 12.5f64.sqrt();
        assert_eq!(r, [s as f32, 1.0]);
        assert_eq!(y, [(6.0 * s) as f32, (4.0 * s) as f32, -2.0, 1.0]);
    }

    /// The backward against central differences of the f64 forward, and accumulate = init + g.
    #[test]
    fn backward_matches_finite_differences_and_accumulates() {
        let (rows, cols) = (2, 5);
        let x: Vec<f32> = (0..10).map(|i| ((i * 7 % 11) as f32 - 5.0) / 3.0).collect();
        let w: Vec<f32> = (0..5).map(|i| 0.5 + i as f32 / 4.0).collect();
        let dy: Vec<f32> = (0..10).map(|i| ((i * 3 % 7) as f32 - 3.0) / 2.0).collect();
        let loss = |x: &[f64], w: &[f64]| -> f64 {
            let r = rstd64(&p(rows, cols), x);
            (0..rows * cols)
                .map(|i| x[i] * r[i / cols] * w[i % cols] * f64::from(dy[i]))
                .sum()
        };
        let (mut y, mut r) = (vec![0.0f32; 10], vec![0.0f32; 2]);
        rmsnorm_forward(RmsNormForward::<Host, f32> {
            params: p(rows, cols),
            x: &x,
            weight: &w,
            y: &mut y,
            rstd: &mut r,
        })
        .unwrap();
        let (mut dx, mut dw) = (vec![f32::NAN; 10], vec![f32::NAN; 5]);
        let run = |dx: &mut [f32], dw: &mut [f32], accumulate| {
            rmsnorm_backward(RmsNormBackward::<Host, f32> {
                params: p(rows, cols),
                x: &x,
                weight: &w,
                dy: &dy,
                rstd: &r,
                dx,
                dweight: dw,
                accumulate,
            })
            .unwrap()
        };
        run(&mut dx, &mut dw, false);
        let (x64, w64) = (widen(&x), widen(&w));
        let h = 1e-6;
        for i in 0..10 {
            let (mut a, mut b) = (x64.clone(), x64.clone());
            a[i] += h;
            b[i] -= h;
            let fd = (loss(&a, &w64) - loss(&b, &w64)) / (2.0 * h);
            assert!(
                (f64::from(dx[i]) - fd).abs() < 1e-5,
                "dx[{i}] {} vs {fd}",
                dx[i]
            );
        }
        for j in 0..5 {
            let (mut a, mut b) = (w64.clone(), w64.clone());
            a[j] += h;
            b[j] -= h;
            let fd = (loss(&x64, &a) - loss(&x64, &b)) / (2.0 * h);
            assert!(
                (f64::from(dw[j]) - fd).abs() < 1e-5,
                "dw[{j}] {} vs {fd}",
                dw[j]
            );
        }
        let (mut adx, mut adw) = (vec![1.0f32; 10], vec![-2.0f32; 5]);
        run(&mut adx, &mut adw, true);
        for (g, d) in adx.iter().zip(&dx) {
            assert!((g - (1.0 + d)).abs() <= 1e-6, "{g} vs 1 + {d}");
        }
        for (g, d) in adw.iter().zip(&dw) {
            assert!((g - (-2.0 + d)).abs() <= 1e-6, "{g} vs -2 + {d}");
        }
    }

    #[test]
    fn residual_equals_add_then_norm_and_checks_lengths_first() {
        let (a, b, w) = (
            [1.0f32, 2.0, 3.0, -1.0],
            [0.5f32, -2.0, 1.0, 3.0],
            [1.0f32, 0.5],
        );
        let (mut res, mut y, mut r) = ([9.0f32; 4], [0.0f32; 4], [0.0f32; 2]);
        residual_rmsnorm_forward(ResidualRmsNormForward::<Host, f32> {
            params: p(2, 2),
            a: &a,
            b: &b,
            weight: &w,
            residual: &mut res,
            y: &mut y,
            rstd: &mut r,
        })
        .unwrap();
        assert_eq!(res, [1.5, 0.0, 4.0, 2.0]);
        let (mut y2, mut r2) = ([0.0f32; 4], [0.0f32; 2]);
        rmsnorm_forward(RmsNormForward::<Host, f32> {
            params: p(2, 2),
            x: &res,
            weight: &w,
            y: &mut y2,
            rstd: &mut r2,
        })
        .unwrap();
        assert_eq!((y, r), (y2, r2));
        let mut untouched = [7.0f32; 4];
        let e = residual_rmsnorm_forward(ResidualRmsNormForward::<Host, f32> {
            params: p(2, 2),
            a: &a,
            b: &b[..3],
            weight: &w,
            residual: &mut untouched,
            y: &mut y,
            rstd: &mut r,
        })
        .unwrap_err();
        assert!(e.to_string().contains("`b` has 3 elements"), "{e}");
        assert_eq!(untouched, [7.0; 4]);
    }
}
