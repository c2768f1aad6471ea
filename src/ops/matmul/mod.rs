//! Batched matmul `out = alpha·op(A)·op(B) + beta·C`: the op's parameters and argument struct
//! ([`Matmul`]), shared by the CPU reference ([`crate::cpu`]) and the launcher
//! (`kernels/matmul.hip`).

pub(crate) mod cpu;
mod device;
#[cfg(feature = "golden")]
mod golden;

pub(crate) use device::{launch_gemm, BiasEpilogue};
pub use device::{matmul, MatmulPlan, MatmulTile, MAX_DIM, MAX_GRID_YZ};
#[cfg(feature = "golden")]
pub use golden::MatmulCase;
#[cfg(feature = "golden")]
pub(crate) use golden::GOLDEN;

use crate::params::{check_len, checked_len, invalid, ShapeError, Space, TensorLen};

/// Dimensions and scalars of `out = alpha·op(A)·op(B) + beta·C`, row-major, packed batches.
///
/// `a` is `[batch, m, k]` (`[batch, k, m]` if `trans_a`), `b` is `[batch, k, n]` (`[batch, n, k]`
/// if `trans_b`), `out` (and `C`) is `[batch, m, n]`. Any dimension may be zero; `k = 0` gives
/// `out = beta·C`. The fields `trans_a`, `trans_b`, `m`, `n`, `k`, `alpha`, `beta` mean what
/// they mean in [`hip_rt::Gemm`] ([`MatmulParams::gemm`] converts).
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
        }
    }

    /// The same product as a [`hip_rt::Gemm`] (hipBLAS) and its packed [`hip_rt::Batch`].
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
        check_len(op, "a", p.a_len()?, self.a.numel())?;
        check_len(op, "b", p.b_len()?, self.b.numel())?;
        check_len(op, "out", p.out_len()?, self.out.numel())
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
