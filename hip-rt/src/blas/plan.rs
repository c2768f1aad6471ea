//! Row-major GEMM shapes → the column-major BLAS call, validated. Pure logic, tested without a GPU.
//!
//! BLAS is column-major. A row-major `C (m×n) = op(A) · op(B)` has the same bytes as the
//! column-major `Cᵀ (n×m) = op(B)ᵀ · op(A)ᵀ`, so hip-rt calls BLAS with the operands swapped:
//! `gemm(op_b, op_a, n, m, k, B, ldb, A, lda, C, ldc = n)`. No data moves.

use crate::error::{Error, Result};

/// A row-major GEMM: `C (m×n) = alpha · op(A) · op(B) + beta · C`, where `op(A)` is `m×k`
/// (`A` is stored `m×k`, or `k×m` when `trans_a`) and `op(B)` is `k×n` (`B` stored `k×n`, or
/// `n×k` when `trans_b`). All matrices are dense and row-major.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gemm {
    /// Use `Aᵀ`.
    pub trans_a: bool,
    /// Use `Bᵀ`.
    pub trans_b: bool,
    /// Rows of C.
    pub m: usize,
    /// Columns of C.
    pub n: usize,
    /// The shared dimension.
    pub k: usize,
    /// Scale of the product.
    pub alpha: f32,
    /// Scale of the old C (0 = overwrite; C's old content is then ignored, even NaN).
    pub beta: f32,
}

impl Gemm {
    /// `C = A · B` with no transposes, `alpha = 1`, `beta = 0`.
    pub fn new(m: usize, n: usize, k: usize) -> Gemm {
        Gemm {
            trans_a: false,
            trans_b: false,
            m,
            n,
            k,
            alpha: 1.0,
            beta: 0.0,
        }
    }
}

/// Element strides between consecutive matrices of a strided-batched GEMM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batch {
    /// Number of GEMMs.
    pub count: usize,
    /// Elements from one A to the next (0 broadcasts one A to every GEMM).
    pub stride_a: usize,
    /// Elements from one B to the next (0 broadcasts one B).
    pub stride_b: usize,
    /// Elements from one C to the next (at least `m·n`: outputs must not overlap).
    pub stride_c: usize,
}

impl Batch {
    /// `count` densely packed matrices: strides `m·k`, `k·n`, `m·n`.
    pub fn packed(gemm: &Gemm, count: usize) -> Batch {
        Batch {
            count,
            stride_a: gemm.m.saturating_mul(gemm.k),
            stride_b: gemm.k.saturating_mul(gemm.n),
            stride_c: gemm.m.saturating_mul(gemm.n),
        }
    }
}

/// The column-major call, with BLAS's integer types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ColMajorCall {
    /// Transpose the first BLAS operand (the row-major B).
    pub trans_first: bool,
    /// Transpose the second BLAS operand (the row-major A).
    pub trans_second: bool,
    /// BLAS m (= row-major n).
    pub m: i32,
    /// BLAS n (= row-major m).
    pub n: i32,
    /// BLAS k.
    pub k: i32,
    /// Leading dimension of the first operand (B).
    pub ld_first: i32,
    /// Leading dimension of the second operand (A).
    pub ld_second: i32,
    /// Leading dimension of C.
    pub ldc: i32,
    /// Stride of the first operand (B).
    pub stride_first: i64,
    /// Stride of the second operand (A).
    pub stride_second: i64,
    /// Stride of C.
    pub stride_c: i64,
    /// Batch count (1 for a plain GEMM).
    pub batch: i32,
}

fn shape_err(msg: String) -> Error {
    Error::BlasShape(msg)
}

fn int(name: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| {
        shape_err(format!(
            "{name} = {v} exceeds BLAS's 32-bit int; split the GEMM"
        ))
    })
}

fn long(name: &str, v: usize) -> Result<i64> {
    i64::try_from(v).map_err(|_| shape_err(format!("{name} = {v} exceeds a 64-bit stride")))
}

/// Elements a strided operand needs: `stride · (count − 1) + size`.
fn needed(stride: usize, count: usize, size: usize) -> Option<usize> {
    stride.checked_mul(count.checked_sub(1)?)?.checked_add(size)
}

/// Validate `gemm` (and `batch`) against the buffer lengths and build the BLAS call.
/// `Ok(None)` means there is nothing to compute (m, n or the batch count is 0).
///
/// A plain GEMM needs exact lengths (`m·k`, `k·n`, `m·n`); a batched one at least
/// `stride·(count−1) + size` elements per operand.
pub fn plan(
    gemm: &Gemm,
    batch: Option<&Batch>,
    a_len: usize,
    b_len: usize,
    c_len: usize,
) -> Result<Option<ColMajorCall>> {
    let Gemm {
        trans_a,
        trans_b,
        m,
        n,
        k,
        ..
    } = *gemm;
    let overflow = || shape_err(format!("m·n·k sizes overflow for m={m} n={n} k={k}"));
    let (size_a, size_b, size_c) = (
        m.checked_mul(k).ok_or_else(overflow)?,
        k.checked_mul(n).ok_or_else(overflow)?,
        m.checked_mul(n).ok_or_else(overflow)?,
    );
    let single = Batch {
        count: 1,
        stride_a: size_a,
        stride_b: size_b,
        stride_c: size_c,
    };
    let b = batch.copied().unwrap_or(single);
    if b.count > 1 && b.stride_c < size_c {
        return Err(shape_err(format!(
            "stride_c = {} is smaller than one C ({m}×{n} = {size_c}): the batch's outputs would overlap",
            b.stride_c
        )));
    }
    for (name, len, stride, size) in [
        ("A", a_len, b.stride_a, size_a),
        ("B", b_len, b.stride_b, size_b),
        ("C", c_len, b.stride_c, size_c),
    ] {
        match (batch, needed(stride, b.count, size)) {
            (None, _) if len != size => {
                let dims = match name {
                    "A" if trans_a => format!("{k}×{m}"),
                    "A" => format!("{m}×{k}"),
                    "B" if trans_b => format!("{n}×{k}"),
                    "B" => format!("{k}×{n}"),
                    _ => format!("{m}×{n}"),
                };
                return Err(shape_err(format!(
                    "{name} holds {len} elements but m={m} n={n} k={k} needs {dims} = {size}"
                )));
            }
            (Some(_), Some(need)) if len < need => {
                return Err(shape_err(format!(
                    "{name} holds {len} elements but {} matrices of {size} at stride {stride} need {need}",
                    b.count
                )));
            }
            (Some(_), None) if b.count > 0 => return Err(overflow()),
            _ => {}
        }
    }
    if m == 0 || n == 0 || b.count == 0 {
        return Ok(None);
    }
    Ok(Some(ColMajorCall {
        trans_first: trans_b,
        trans_second: trans_a,
        m: int("n", n)?,
        n: int("m", m)?,
        k: int("k", k)?,
        ld_first: int("ldb", if trans_b { k } else { n }.max(1))?,
        ld_second: int("lda", if trans_a { m } else { k }.max(1))?,
        ldc: int("ldc", n.max(1))?,
        stride_first: long("stride_b", b.stride_b)?,
        stride_second: long("stride_a", b.stride_a)?,
        stride_c: long("stride_c", b.stride_c)?,
        batch: int("batch count", b.count)?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Column-major reference GEMM on the call's parameters, to check the swap end to end.
    fn col_major_gemm(call: &ColMajorCall, first: &[f64], second: &[f64], c: &mut [f64]) {
        let (m, n, k) = (call.m as usize, call.n as usize, call.k as usize);
        let at = |mat: &[f64], ld: usize, trans: bool, r: usize, col: usize| {
            if trans {
                mat[col + r * ld]
            } else {
                mat[r + col * ld]
            }
        };
        for j in 0..n {
            for i in 0..m {
                let s: f64 = (0..k)
                    .map(|p| {
                        at(first, call.ld_first as usize, call.trans_first, i, p)
                            * at(second, call.ld_second as usize, call.trans_second, p, j)
                    })
                    .sum();
                c[i + j * call.ldc as usize] = s;
            }
        }
    }

    /// Row-major reference: C[i][j] = Σ op(A)[i][p] · op(B)[p][j].
    fn row_major_gemm(g: &Gemm, a: &[f64], b: &[f64]) -> Vec<f64> {
        let (m, n, k) = (g.m, g.n, g.k);
        let opa = |i: usize, p: usize| {
            if g.trans_a {
                a[p * m + i]
            } else {
                a[i * k + p]
            }
        };
        let opb = |p: usize, j: usize| {
            if g.trans_b {
                b[j * k + p]
            } else {
                b[p * n + j]
            }
        };
        (0..m * n)
            .map(|idx| (0..k).map(|p| opa(idx / n, p) * opb(p, idx % n)).sum())
            .collect()
    }

    #[test]
    fn swap_reproduces_row_major_product_for_every_transpose() {
        for (trans_a, trans_b) in [(false, false), (true, false), (false, true), (true, true)] {
            let g = Gemm {
                trans_a,
                trans_b,
                ..Gemm::new(3, 5, 4)
            };
            let a: Vec<f64> = (0..12).map(|v| v as f64 * 0.5 - 2.0).collect();
            let b: Vec<f64> = (0..20).map(|v| (v * 7 % 11) as f64 - 4.0).collect();
            let call = plan(&g, None, 12, 20, 15).unwrap().unwrap();
            assert_eq!((call.m, call.n, call.k, call.ldc), (5, 3, 4, 5));
            let mut c = vec![0.0; 15];
            col_major_gemm(&call, &b, &a, &mut c);
            assert_eq!(
                c,
                row_major_gemm(&g, &a, &b),
                "trans_a={trans_a} trans_b={trans_b}"
            );
        }
    }

    #[test]
    fn lengths_must_match_exactly_for_plain_gemm() {
        let g = Gemm::new(2, 3, 4);
        let e = plan(&g, None, 7, 12, 6).unwrap_err().to_string();
        assert!(e.contains("A holds 7") && e.contains("2×4 = 8"), "{e}");
        let gt = Gemm { trans_b: true, ..g };
        let e = plan(&gt, None, 8, 13, 6).unwrap_err().to_string();
        assert!(e.contains("B holds 13") && e.contains("3×4 = 12"), "{e}");
        assert!(plan(&g, None, 8, 12, 7).is_err());
        assert!(plan(&g, None, 8, 12, 6).unwrap().is_some());
    }

    #[test]
    fn empty_products_make_no_call() {
        assert_eq!(plan(&Gemm::new(0, 3, 4), None, 0, 12, 0).unwrap(), None);
        assert_eq!(plan(&Gemm::new(2, 0, 4), None, 8, 0, 0).unwrap(), None);
        let g = Gemm::new(2, 3, 4);
        assert_eq!(
            plan(&g, Some(&Batch::packed(&g, 0)), 0, 0, 0).unwrap(),
            None
        );
        // k = 0 still scales C by beta: a real call with leading dimensions of at least 1.
        let call = plan(&Gemm::new(2, 3, 0), None, 0, 0, 6).unwrap().unwrap();
        assert_eq!((call.k, call.ld_second), (0, 1));
    }

    #[test]
    fn batched_strides_are_checked() {
        let g = Gemm::new(2, 3, 4);
        let packed = Batch::packed(&g, 5);
        assert_eq!(
            (packed.stride_a, packed.stride_b, packed.stride_c),
            (8, 12, 6)
        );
        let call = plan(&g, Some(&packed), 40, 60, 30).unwrap().unwrap();
        assert_eq!(
            (
                call.batch,
                call.stride_first,
                call.stride_second,
                call.stride_c
            ),
            (5, 12, 8, 6)
        );
        assert!(plan(&g, Some(&packed), 39, 60, 30)
            .unwrap_err()
            .to_string()
            .contains("need 40"));
        // Broadcasting one B to every GEMM.
        let shared_b = Batch {
            stride_b: 0,
            ..packed
        };
        assert!(plan(&g, Some(&shared_b), 40, 12, 30).unwrap().is_some());
        let overlapping = Batch {
            stride_c: 5,
            ..packed
        };
        assert!(plan(&g, Some(&overlapping), 40, 60, 30)
            .unwrap_err()
            .to_string()
            .contains("overlap"));
        let huge = Batch {
            stride_a: usize::MAX,
            ..packed
        };
        assert!(plan(&g, Some(&huge), 40, 60, 30).is_err());
    }

    #[test]
    fn dimensions_beyond_i32_are_rejected() {
        let g = Gemm::new(1, 1 << 31, 1);
        let e = plan(&g, None, 1, 1 << 31, 1 << 31).unwrap_err().to_string();
        assert!(e.contains("32-bit"), "{e}");
    }
}
