//! `out = alpha·op(A)·op(B) + beta·C` (row-major; packed or strided, see
//! [`super::MatmulLayout`]), f64 accumulation.

use super::{Matmul, MatmulLayout, MatmulParams, ResolvedLayout};
use crate::cpu::par_for_each;
use crate::params::{DeviceElement, Host, ShapeError};

/// [`Matmul`] on host slices: `out = alpha·op(A)·op(B) + beta·C`, where `out` holds C on entry.
///
/// Layouts are in [`MatmulParams`]; a strided [`MatmulLayout`] reads and writes through its
/// leading dimensions and batch strides (elements of `out` outside the layout are untouched).
/// As in BLAS and `torch.addmm`, C is not read when `beta == 0`
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
    let epilogue = |_, acc, o: &mut T| {
        let c = if beta == 0.0 { 0.0 } else { beta * o.to_f64() };
        *o = T::from_f64(alpha * acc + c);
    };
    if shape.layout == MatmulLayout::PACKED {
        products(&shape, a, b, out, epilogue);
        return Ok(());
    }
    // Strided: gather every operand packed, run the packed product, scatter `out` back.
    let r = shape.resolve()?;
    let [sa, sb, so] = shape.stored();
    let (pa, pb) = (
        gather(a, &r, 0, sa, shape.batch),
        gather(b, &r, 1, sb, shape.batch),
    );
    let mut po = gather(out, &r, 2, so, shape.batch);
    let packed = MatmulParams {
        layout: MatmulLayout::PACKED,
        ..shape
    };
    products(&packed, &pa, &pb, &mut po, epilogue);
    for_each_row(&r, 2, so, shape.batch, |packed_at, at, len| {
        out[at..at + len].copy_from_slice(&po[packed_at..packed_at + len]);
    });
    Ok(())
}

/// `f(packed offset, strided offset, row length)` for every stored row of operand `which`
/// (0 a, 1 b, 2 out) of `batch` items of `rows × row` elements.
fn for_each_row(
    r: &ResolvedLayout,
    which: usize,
    (rows, row): (usize, usize),
    batch: usize,
    mut f: impl FnMut(usize, usize, usize),
) {
    if row == 0 {
        return;
    }
    for bi in 0..batch {
        for ri in 0..rows {
            f(
                (bi * rows + ri) * row,
                bi * r.stride[which] + ri * r.ld[which],
                row,
            );
        }
    }
}

/// Operand `which` copied out of its strided layout into a packed `[batch, rows, row]` vector.
fn gather<T: Copy>(
    src: &[T],
    r: &ResolvedLayout,
    which: usize,
    dims: (usize, usize),
    batch: usize,
) -> Vec<T> {
    let mut out = Vec::with_capacity(batch * dims.0 * dims.1);
    for_each_row(r, which, dims, batch, |_, at, len| {
        out.extend_from_slice(&src[at..at + len])
    });
    out
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
    use crate::ops::MatmulLayout;
    use half::bf16;

    fn mm<T: DeviceElement>(
        params: MatmulParams,
        a: &[T],
        b: &[T],
        out: &mut [T],
    ) -> Result<(), ShapeError> {
        matmul(Matmul::<Host, T> { params, a, b, out })
    }

    /// Strided operands (padded rows and items of a, b broadcast with stride 0, out items side by
    /// side in each row) give the packed product bit for bit, and leave the padding alone.
    #[test]
    fn strided_operands_equal_the_packed_product() {
        let (batch, m, n, k) = (2usize, 3usize, 2usize, 4usize);
        for (trans_a, trans_b) in [(false, false), (true, true)] {
            let packed = MatmulParams {
                batch,
                trans_a,
                trans_b,
                alpha: 1.5,
                beta: 0.5,
                ..MatmulParams::new(m, n, k)
            };
            let val = |i: usize| ((i * 37 + 11) % 17) as f32 - 8.0;
            let a: Vec<f32> = (0..batch * m * k).map(val).collect();
            let b1: Vec<f32> = (0..k * n).map(|i| val(i + 5)).collect();
            let b: Vec<f32> = [b1.clone(), b1.clone()].concat();
            let c: Vec<f32> = (0..batch * m * n).map(|i| val(i + 9)).collect();
            let mut want = c.clone();
            mm(packed, &a, &b, &mut want).unwrap();
            let [(ar, ac), (br, bc), _] = packed.stored();
            let (lda, ldb, ldc) = (ac + 1, bc + 2, batch * n + 1);
            let strided = MatmulParams {
                layout: MatmulLayout {
                    lda: Some(lda),
                    ldb: Some(ldb),
                    ldc: Some(ldc),
                    stride_a: Some(ar * lda + 3),
                    stride_b: Some(0),
                    stride_c: Some(n),
                },
                ..packed
            };
            let r = strided.resolve().unwrap();
            let place = |src: &[f32], (rows, row): (usize, usize), which: usize, items, len| {
                let mut v = vec![-99.0f32; len];
                for bi in 0..items {
                    for ri in 0..rows {
                        let at = bi * r.stride[which] + ri * r.ld[which];
                        let from = (bi * rows + ri) * row;
                        v[at..at + row].copy_from_slice(&src[from..from + row]);
                    }
                }
                v
            };
            let sa = place(&a, (ar, ac), 0, batch, r.reach[0] + 1);
            let sb = place(&b1, (br, bc), 1, 1, r.reach[1]);
            let mut out = place(&c, (m, n), 2, batch, r.reach[2] + 2);
            mm(strided, &sa, &sb, &mut out).unwrap();
            assert_eq!(out, place(&want, (m, n), 2, batch, r.reach[2] + 2));
        }
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
