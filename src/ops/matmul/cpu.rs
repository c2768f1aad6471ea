//! `out = alpha·op(A)·op(B) + beta·C` (row-major, packed batches), f64 accumulation.

use super::{Matmul, MatmulParams};
use crate::cpu::par_for_each;
use crate::params::{DeviceElement, Host, ShapeError};

/// [`Matmul`] on host slices: `out = alpha·op(A)·op(B) + beta·C`, where `out` holds C on entry.
///
/// Layouts are in [`MatmulParams`]. As in BLAS and `torch.addmm`, C is not read when `beta == 0`
/// (a NaN there does not propagate). Products and sums are exact-widened to f64; each output is
/// rounded once.
pub fn matmul<T: DeviceElement>(args: Matmul<'_, Host, T>) -> Result<(), ShapeError> {
    args.validate()?;
    let Matmul {
        params: shape,
        a,
        b,
        out,
    } = args;
    let (alpha, beta) = (f64::from(shape.alpha), f64::from(shape.beta));
    products(&shape, a, b, out, |_, acc, o: &mut T| {
        let c = if beta == 0.0 { 0.0 } else { beta * o.to_f64() };
        *o = T::from_f64(alpha * acc + c);
    });
    Ok(())
}

/// The f64 products `op(A)·op(B)` of validated params (alpha and beta not applied), handed per
/// output element to `epilogue(column, product, slot)` (`out` is `[batch, m, n]` of any slot
/// type). Shared with the bias epilogue's reference ([`crate::cpu::matmul_bias`]).
pub(crate) fn products<T: DeviceElement, U: Send>(
    shape: &MatmulParams,
    a: &[T],
    b: &[T],
    out: &mut [U],
    epilogue: impl Fn(usize, f64, &mut U) + Sync,
) {
    let MatmulParams {
        m,
        n,
        k,
        trans_a,
        trans_b,
        ..
    } = *shape;
    if m == 0 || n == 0 {
        return;
    }
    let a_at = |mat: &[T], i: usize, p: usize| {
        if trans_a {
            mat[p * m + i]
        } else {
            mat[i * k + p]
        }
    };
    let b_at = |mat: &[T], p: usize, j: usize| {
        if trans_b {
            mat[j * k + p]
        } else {
            mat[p * n + j]
        }
    };
    // One item per output matrix; within it, op(A) rows and op(B) columns are widened once.
    let items: Vec<_> = out.chunks_mut(m * n).enumerate().collect();
    let work = shape
        .batch
        .saturating_mul(m)
        .saturating_mul(n)
        .saturating_mul(k);
    par_for_each(items, work, |(bi, out)| {
        let a = &a[bi * m * k..(bi + 1) * m * k];
        let b = &b[bi * k * n..(bi + 1) * k * n];
        let bt: Vec<f64> = (0..n)
            .flat_map(|j| (0..k).map(move |p| b_at(b, p, j).to_f64()))
            .collect();
        let mut row = vec![0.0f64; k];
        for (i, out_row) in out.chunks_mut(n).enumerate() {
            for (p, r) in row.iter_mut().enumerate() {
                *r = a_at(a, i, p).to_f64();
            }
            for (j, o) in out_row.iter_mut().enumerate() {
                let acc: f64 = row
                    .iter()
                    .zip(&bt[j * k..(j + 1) * k])
                    .map(|(x, y)| x * y)
                    .sum();
                epilogue(j, acc, o);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    fn mm<T: DeviceElement>(
        params: MatmulParams,
        a: &[T],
        b: &[T],
        out: &mut [T],
    ) -> Result<(), ShapeError> {
        matmul(Matmul::<Host, T> { params, a, b, out })
    }

    #[test]
    fn small_product_with_transposes_and_beta() {
        // A = [[1,2,3],[4,5,6]] (2×3), B = [[1,0],[0,1],[1,1]] (3×2): A·B = [[4,5],[10,11]].
        let a = [1.0f32, 2., 3., 4., 5., 6.];
        let b = [1.0f32, 0., 0., 1., 1., 1.];
        let mut out = [1.0f32, 1., 1., 1.];
        let p = MatmulParams {
            alpha: 2.0,
            beta: 0.5,
            ..MatmulParams::new(2, 2, 3)
        };
        mm(p, &a, &b, &mut out).unwrap();
        assert_eq!(out, [8.5, 10.5, 20.5, 22.5]);
        let at = [1.0f32, 4., 2., 5., 3., 6.];
        let bt = [1.0f32, 0., 1., 0., 1., 1.];
        let mut out2 = [f32::NAN; 4];
        let s = MatmulParams {
            trans_a: true,
            trans_b: true,
            ..MatmulParams::new(2, 2, 3)
        };
        mm(s, &at, &bt, &mut out2).unwrap();
        assert_eq!(out2, [4.0, 5.0, 10.0, 11.0]);
    }

    #[test]
    fn batches_are_independent_and_k0_scales_c() {
        let s = MatmulParams {
            batch: 2,
            ..MatmulParams::new(1, 1, 2)
        };
        let a = [
            bf16::from_f32(1.0),
            bf16::from_f32(2.0),
            bf16::from_f32(3.0),
            bf16::from_f32(4.0),
        ];
        let mut out = [bf16::ZERO; 2];
        mm(s, &a, &a, &mut out).unwrap();
        assert_eq!([out[0].to_f32(), out[1].to_f32()], [5.0, 25.0]);
        let mut c = [3.0f32, 4.0];
        let k0 = MatmulParams {
            batch: 2,
            beta: 2.0,
            ..MatmulParams::new(1, 1, 0)
        };
        mm(k0, &[], &[], &mut c).unwrap();
        assert_eq!(c, [6.0, 8.0]);
    }

    #[test]
    fn an_empty_batch_of_huge_matrices_is_an_overflow_not_a_panic() {
        let half = 1usize << (usize::BITS / 2);
        let shape = MatmulParams {
            batch: 0,
            ..MatmulParams::new(half, half, 1)
        };
        let e = mm::<f32>(shape, &[], &[], &mut []).unwrap_err();
        assert_eq!(
            e,
            ShapeError::Overflow {
                op: "matmul",
                tensor: "out"
            }
        );
    }

    #[test]
    fn rejects_wrong_lengths() {
        let e = mm(
            MatmulParams::new(2, 2, 2),
            &[0.0f32; 4],
            &[0.0; 4],
            &mut [0.0; 3],
        )
        .unwrap_err();
        assert_eq!(
            e,
            ShapeError::Length {
                op: "matmul",
                tensor: "out",
                expected: 4,
                got: 3
            }
        );
    }
}
