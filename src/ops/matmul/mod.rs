//! Batched matmul `out = alpha·op(A)·op(B) + beta·C`: the op's parameters and argument struct
//! ([`Matmul`]), shared by the CPU reference ([`crate::cpu`]) and the launcher
//! (`kernels/matmul.hip`).

pub(crate) mod cpu;
mod device;
#[cfg(feature = "golden")]
mod golden;
mod mc;
pub mod tuning;

pub(crate) use device::{launch_gemm, BiasEpilogue};
pub use device::{matmul, matmul_with, MatmulPlan, MatmulTile, MAX_DIM, MAX_GRID_YZ};
#[cfg(feature = "golden")]
pub use golden::MatmulCase;
#[cfg(feature = "golden")]
pub(crate) use golden::GOLDEN;
pub use mc::{arch_has_matrix_cores, MatmulKernel, McPlan, MC_TILE};
pub use tuning::{
    gemm_tuner, set_gemm_tuner, GemmTuner, GemmTuningMode, TuningClock, TuningConfig, TuningError,
    TuningStats,
};

use crate::params::{check_len, checked_len, invalid, ShapeError, Space, TensorLen};

// Each struct runs itself on its space (`ops::Run`): the CPU reference, or the launcher.
crate::ops::run::launch! {
    Matmul['a] T => matmul, matmul;
}

/// Dimensions and scalars of `out = alpha·op(A)·op(B) + beta·C`, row-major.
///
/// `a` is `[batch, m, k]` (`[batch, k, m]` if `trans_a`), `b` is `[batch, k, n]` (`[batch, n, k]`
/// if `trans_b`), `out` (and `C`) is `[batch, m, n]`: packed unless [`layout`](Self::layout)
/// gives leading dimensions or batch strides ([`MatmulLayout`]). Any dimension may be zero;
/// `k = 0` gives `out = beta·C`. The fields `trans_a`, `trans_b`, `m`, `n`, `k`, `alpha`, `beta`
/// mean what they mean in [`hip_rt::Gemm`] ([`MatmulParams::gemm`] converts).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MatmulParams {
    /// Number of independent matrices (1 for a plain GEMM).
    pub batch: usize,
    /// Rows of op(A) and of out.
    pub m: usize,
    /// Columns of op(B) and of out.
    pub n: usize,
    /// Inner (reduction) dimension.
    pub k: usize,
    /// A is stored transposed (`[k, m]`).
    pub trans_a: bool,
    /// B is stored transposed (`[n, k]`).
    pub trans_b: bool,
    /// Scale of the product (finite).
    pub alpha: f32,
    /// Scale of C (finite); C is not read when 0 (a NaN there does not propagate).
    pub beta: f32,
    /// Where the rows and batch items of `a`, `b` and `out` are ([`MatmulLayout::PACKED`]:
    /// contiguous, what [`MatmulParams::new`] sets).
    pub layout: MatmulLayout,
}

/// Leading dimensions and batch strides of [`Matmul`]'s operands, in elements; `None` is the
/// packed value. Views into bigger tensors need no copy: a weight's column block, the heads of
/// a `[B, T, H, D]` activation (`ld = H·D`, batch stride `D`), one operand broadcast over the
/// batch (stride 0).
///
/// Rules ([`MatmulParams::resolve`] checks them; a violation is a [`ShapeError::Invalid`]
/// naming the field):
/// - `lda` ≥ the stored row of `a` (`k`, or `m` if `trans_a`); `ldb` ≥ that of `b` (`n`, or
///   `k` if `trans_b`); `ldc` ≥ `n` (`out`, which holds C on entry).
/// - `stride_a`, `stride_b`: any value (default: the item's rows × its leading dimension).
///   Inputs are only read, so items may overlap; 0 broadcasts one matrix to every item.
/// - `stride_c`: outputs must not overlap. Accepted when the items follow each other
///   (`stride_c ≥ (m − 1)·ldc + n`, the default `m·ldc` included) or sit side by side within
///   the rows (`stride_c ≥ n` and `(batch − 1)·stride_c + n ≤ ldc`, e.g. heads of a row).
///   Other arrangements, including 0, are rejected even when they happen not to overlap.
/// - Each buffer must reach its last element: `(batch − 1)·stride + (rows − 1)·ld + row`
///   elements at least (more is allowed with a layout; the packed layout keeps the exact
///   length check).
/// - Every value fits an `i64` (the kernels' argument type).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MatmulLayout {
    /// Elements between rows of `a` as stored.
    pub lda: Option<usize>,
    /// Elements between rows of `b` as stored.
    pub ldb: Option<usize>,
    /// Elements between rows of `out` (and C).
    pub ldc: Option<usize>,
    /// Elements between batch items of `a`.
    pub stride_a: Option<usize>,
    /// Elements between batch items of `b`.
    pub stride_b: Option<usize>,
    /// Elements between batch items of `out` (and C).
    pub stride_c: Option<usize>,
}

impl MatmulLayout {
    /// Every operand packed (the default).
    pub const PACKED: MatmulLayout = MatmulLayout {
        lda: None,
        ldb: None,
        ldc: None,
        stride_a: None,
        stride_b: None,
        stride_c: None,
    };
}

/// A [`MatmulLayout`] with every value filled in and checked ([`MatmulParams::resolve`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResolvedLayout {
    /// Leading dimensions of a, b, out.
    pub ld: [usize; 3],
    /// Batch strides of a, b, out.
    pub stride: [usize; 3],
    /// Elements each of a, b, out must hold at least (0 when it has no element).
    pub reach: [usize; 3],
}

impl MatmulParams {
    /// Operation name used in errors and kernel names.
    pub const OP: &'static str = "matmul";

    /// A single non-transposed `m × k` by `k × n` product, `alpha = 1`, `beta = 0`.
    pub const fn new(m: usize, n: usize, k: usize) -> Self {
        Self {
            batch: 1,
            m,
            n,
            k,
            trans_a: false,
            trans_b: false,
            alpha: 1.0,
            beta: 0.0,
            layout: MatmulLayout::PACKED,
        }
    }

    /// Stored `(rows, row length)` of a, b and out.
    pub fn stored(&self) -> [(usize, usize); 3] {
        let (m, n, k) = (self.m, self.n, self.k);
        [
            if self.trans_a { (k, m) } else { (m, k) },
            if self.trans_b { (n, k) } else { (k, n) },
            (m, n),
        ]
    }

    /// The layout's values with the packed defaults filled in, checked against the rules of
    /// [`MatmulLayout`] (not against buffer lengths: [`Matmul::validate`] does that).
    pub fn resolve(&self) -> Result<ResolvedLayout, ShapeError> {
        const OP: &str = MatmulParams::OP;
        let l = &self.layout;
        let names = [
            ("lda", "stride_a", "a"),
            ("ldb", "stride_b", "b"),
            ("ldc", "stride_c", "out"),
        ];
        let given = [
            (l.lda, l.stride_a),
            (l.ldb, l.stride_b),
            (l.ldc, l.stride_c),
        ];
        let mut r = ResolvedLayout {
            ld: [0; 3],
            stride: [0; 3],
            reach: [0; 3],
        };
        for (i, ((rows, row), (ld, stride))) in self.stored().into_iter().zip(given).enumerate() {
            let (ld_name, stride_name, tensor) = names[i];
            let ld = ld.unwrap_or(row);
            if ld < row {
                return Err(invalid(
                    OP,
                    ld_name,
                    ld,
                    "must be at least the stored row length (a: k, or m if trans_a; b: n, or k if trans_b; out: n)",
                ));
            }
            let fits = |name, v: usize| match i64::try_from(v) {
                Ok(_) => Ok(v),
                Err(_) => Err(invalid(OP, name, v, "must fit in i64 (the kernels' type)")),
            };
            let ld = fits(ld_name, ld)?;
            let stride = match stride {
                Some(s) => s,
                None => rows
                    .checked_mul(ld)
                    .ok_or(ShapeError::Overflow { op: OP, tensor })?,
            };
            let stride = fits(stride_name, stride)?;
            r.ld[i] = ld;
            r.stride[i] = stride;
            r.reach[i] = if self.batch == 0 || rows == 0 || row == 0 {
                0
            } else {
                (self.batch - 1)
                    .checked_mul(stride)
                    .and_then(|x| x.checked_add((rows - 1).checked_mul(ld)?))
                    .and_then(|x| x.checked_add(row))
                    .ok_or(ShapeError::Overflow { op: OP, tensor })?
            };
        }
        let (m, n, ldc, sc) = (self.m, self.n, r.ld[2], r.stride[2]);
        if self.batch > 1 && m > 0 && n > 0 {
            let stacked = (m - 1)
                .checked_mul(ldc)
                .and_then(|x| x.checked_add(n))
                .is_some_and(|span| sc >= span);
            let side_by_side = sc >= n
                && (self.batch - 1)
                    .checked_mul(sc)
                    .and_then(|x| x.checked_add(n))
                    .is_some_and(|end| end <= ldc);
            if !(stacked || side_by_side) {
                return Err(invalid(
                    OP,
                    "stride_c",
                    sc,
                    "batch items of out would overlap: use stride_c >= (m - 1)·ldc + n (items one after another) or stride_c >= n with (batch - 1)·stride_c + n <= ldc (items side by side in each row)",
                ));
            }
        }
        Ok(r)
    }

    /// The same product as a [`hip_rt::Gemm`] (hipBLAS) and its packed [`hip_rt::Batch`]
    /// (the packed layout: [`MatmulParams::layout`] is not carried over).
    pub fn gemm(&self) -> (hip_rt::Gemm, hip_rt::Batch) {
        let g = hip_rt::Gemm {
            trans_a: self.trans_a,
            trans_b: self.trans_b,
            m: self.m,
            n: self.n,
            k: self.k,
            alpha: self.alpha,
            beta: self.beta,
        };
        (g, hip_rt::Batch::packed(&g, self.batch))
    }

    /// Elements of `a` (all batches).
    pub fn a_len(&self) -> Result<usize, ShapeError> {
        checked_len(Self::OP, "a", &[self.batch, self.m, self.k])
    }

    /// Elements of `b` (all batches).
    pub fn b_len(&self) -> Result<usize, ShapeError> {
        checked_len(Self::OP, "b", &[self.batch, self.k, self.n])
    }

    /// Elements of `out` (and `c`) (all batches).
    pub fn out_len(&self) -> Result<usize, ShapeError> {
        checked_len(Self::OP, "out", &[self.batch, self.m, self.n])
    }
}

/// `out = alpha·op(a)·op(b) + beta·out`: `out` holds C on entry (read only when `beta != 0`).
pub struct Matmul<'a, S: Space, T: hip_rt::Element> {
    /// Dimensions, transposes, alpha and beta.
    pub params: MatmulParams,
    /// `[batch, m, k]` (`[batch, k, m]` if `trans_a`).
    pub a: S::In<'a, T>,
    /// `[batch, k, n]` (`[batch, n, k]` if `trans_b`).
    pub b: S::In<'a, T>,
    /// `[batch, m, n]`: C on entry, the result on exit.
    pub out: S::Out<'a, T>,
}

impl<S: Space, T: hip_rt::Element> Matmul<'_, S, T> {
    /// Check the scalars and every length (the CPU reference and the launcher call this first).
    pub fn validate(&self) -> Result<(), ShapeError> {
        let p = &self.params;
        let op = MatmulParams::OP;
        if !p.alpha.is_finite() {
            return Err(invalid(op, "alpha", p.alpha, "must be finite"));
        }
        if !p.beta.is_finite() {
            return Err(invalid(op, "beta", p.beta, "must be finite"));
        }
        let r = p.resolve()?;
        if p.layout == MatmulLayout::PACKED {
            check_len(op, "a", p.a_len()?, self.a.numel())?;
            check_len(op, "b", p.b_len()?, self.b.numel())?;
            return check_len(op, "out", p.out_len()?, self.out.numel());
        }
        let lens = [self.a.numel(), self.b.numel(), self.out.numel()];
        for ((tensor, reach), len) in ["a", "b", "out"].into_iter().zip(r.reach).zip(lens) {
            if len < reach {
                return Err(ShapeError::Invalid {
                    op,
                    name: tensor,
                    value: format!("{len} elements (the layout {:?} reaches {reach})", p.layout),
                    reason: "the buffer ends before the layout's last element; pass a longer view or fix the leading dimension / batch stride",
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::Host;

    #[test]
    fn validation_names_the_values() {
        let p = MatmulParams {
            batch: 2,
            ..MatmulParams::new(3, 4, 5)
        };
        let (a, b, mut out) = ([0.0f32; 30], [0.0f32; 39], [0.0f32; 24]);
        let e = Matmul::<Host, f32> {
            params: p,
            a: &a,
            b: &b,
            out: &mut out,
        }
        .validate()
        .unwrap_err();
        assert_eq!(
            e,
            ShapeError::Length {
                op: "matmul",
                tensor: "b",
                expected: 40,
                got: 39
            }
        );
        assert!(e.to_string().contains("39") && e.to_string().contains("40"));
        let big = MatmulParams::new(usize::MAX, 2, 2);
        assert!(matches!(big.a_len(), Err(ShapeError::Overflow { .. })));
        // batch = 0 does not hide an m·n overflow (cpu::matmul indexes with m·n).
        let half = 1usize << (usize::BITS / 2);
        let p = MatmulParams {
            batch: 0,
            ..MatmulParams::new(half, half, 1)
        };
        assert!(matches!(
            p.out_len(),
            Err(ShapeError::Overflow { tensor: "out", .. })
        ));
    }

    #[test]
    fn layouts_resolve_with_packed_defaults_and_reject_bad_fields() {
        let p = MatmulParams {
            batch: 4,
            trans_a: true,
            ..MatmulParams::new(3, 5, 2)
        };
        // Packed: a is [k, m] = 2×3, b [k, n] = 2×5, out 3×5.
        let r = p.resolve().unwrap();
        assert_eq!(
            (r.ld, r.stride, r.reach),
            ([3, 5, 5], [6, 10, 15], [24, 40, 60])
        );
        // Heads side by side: out [m, 4·5 + 1], item i at column 5·i; b broadcast.
        let heads = MatmulParams {
            layout: MatmulLayout {
                ldc: Some(21),
                stride_c: Some(5),
                stride_b: Some(0),
                lda: Some(4),
                ..MatmulLayout::PACKED
            },
            ..p
        };
        let r = heads.resolve().unwrap();
        assert_eq!(r.stride, [8, 0, 5]);
        assert_eq!(r.reach, [3 * 8 + 4 + 3, 10, 3 * 5 + 2 * 21 + 5]);
        let bad = |layout: MatmulLayout| match (MatmulParams { layout, ..p }).resolve().unwrap_err()
        {
            ShapeError::Invalid { name, .. } => name,
            e => panic!("{e}"),
        };
        let l = MatmulLayout::PACKED;
        assert_eq!(bad(MatmulLayout { lda: Some(2), ..l }), "lda"); // < m (trans_a)
        assert_eq!(bad(MatmulLayout { ldb: Some(4), ..l }), "ldb");
        assert_eq!(bad(MatmulLayout { ldc: Some(4), ..l }), "ldc");
        // Items overlapping: stacked too close, side by side past ldc, zero.
        assert_eq!(
            bad(MatmulLayout {
                stride_c: Some(14),
                ..l
            }),
            "stride_c"
        );
        let side = MatmulLayout {
            ldc: Some(19),
            stride_c: Some(5),
            ..l
        };
        assert_eq!(bad(side), "stride_c");
        assert_eq!(
            bad(MatmulLayout {
                stride_c: Some(0),
                ..l
            }),
            "stride_c"
        );
        let huge = MatmulLayout {
            lda: Some(usize::MAX),
            ..l
        };
        assert_eq!(bad(huge), "lda"); // does not fit an i64
                                      // A short buffer names the tensor; a longer one is fine with a layout.
        let (a, b) = ([0.0f32; 31], [0.0f32; 40]);
        let mut out = [0.0f32; 63];
        let e = Matmul::<Host, f32> {
            params: heads,
            a: &a[..30],
            b: &b,
            out: &mut out,
        }
        .validate()
        .unwrap_err();
        assert!(
            matches!(&e, ShapeError::Invalid { name: "a", .. })
                && e.to_string().contains("reaches 31"),
            "{e}"
        );
        Matmul::<Host, f32> {
            params: heads,
            a: &a,
            b: &b,
            out: &mut out,
        }
        .validate()
        .unwrap();
    }

    #[test]
    fn gemm_carries_the_same_product() {
        let p = MatmulParams {
            batch: 3,
            trans_b: true,
            alpha: 2.0,
            beta: 0.5,
            ..MatmulParams::new(4, 5, 6)
        };
        let (g, b) = p.gemm();
        assert_eq!(
            (g.m, g.n, g.k, g.trans_a, g.trans_b, g.alpha, g.beta),
            (4, 5, 6, false, true, 2.0, 0.5)
        );
        assert_eq!(
            (b.count, b.stride_a, b.stride_b, b.stride_c),
            (3, 24, 30, 20)
        );
    }
}
