//! Matmul with a bias (and optionally GELU) in the epilogue, and the bias gradient: parameters
//! and argument structs ([`MatmulBias`], [`BiasBackward`]), shared by the CPU reference
//! ([`crate::cpu`]) and the launchers (the GEMM of `kernels/matmul.hip` with the bias epilogue
//! fused into its store, and the gradient of `kernels/bias.hip`).

pub(crate) mod cpu;
mod device;
#[cfg(feature = "golden")]
mod golden;

pub use device::{bias_backward, matmul_bias, matmul_bias_with, BiasPlan};
#[cfg(feature = "golden")]
pub(crate) use golden::GOLDEN;
#[cfg(feature = "golden")]
pub use golden::{BiasBackwardCase, MatmulBiasCase};

use crate::ops::matmul::MatmulParams;
use crate::params::{check_len, checked_len, ShapeError, Space, TensorLen};

// Each struct runs itself on its space (`ops::Run`): the CPU reference, or the launcher.
crate::ops::run::launch! {
    MatmulBias['a] T => matmul_bias, matmul_bias;
    BiasBackward['a] T => bias_backward, bias_backward;
}

/// Dimensions, transposes and activation of [`MatmulBias`] (the GEMM's as in
/// [`MatmulParams`], with alpha 1 and beta 0: the epilogue adds the bias instead of beta·C).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatmulBiasParams {
    /// Number of independent products (1 for a plain GEMM); the bias is shared.
    pub batch: usize,
    /// Rows of op(A) and of out.
    pub m: usize,
    /// Columns of op(B), of out and of the bias.
    pub n: usize,
    /// Inner (reduction) dimension.
    pub k: usize,
    /// A is stored transposed (`[k, m]`).
    pub trans_a: bool,
    /// B is stored transposed (`[n, k]`).
    pub trans_b: bool,
    /// Apply GELU (tanh approximation) after the bias.
    pub gelu: bool,
}

impl MatmulBiasParams {
    /// `out[m, n] = a[m, k]·b[k, n] + bias[n]`: one product, nothing transposed, no GELU (set
    /// the other fields with the builder methods or struct update syntax).
    pub fn new(m: usize, n: usize, k: usize) -> Self {
        Self {
            batch: 1,
            m,
            n,
            k,
            trans_a: false,
            trans_b: false,
            gelu: false,
        }
    }

    /// The same with `batch` independent products sharing the bias.
    pub fn batched(self, batch: usize) -> Self {
        Self { batch, ..self }
    }

    /// The same with A and/or B stored transposed.
    pub fn transposed(self, trans_a: bool, trans_b: bool) -> Self {
        Self {
            trans_a,
            trans_b,
            ..self
        }
    }

    /// The same with GELU (tanh approximation) applied after the bias.
    pub fn with_gelu(self) -> Self {
        Self { gelu: true, ..self }
    }

    /// The GEMM part (alpha 1, beta 0).
    pub fn matmul(&self) -> MatmulParams {
        MatmulParams {
            batch: self.batch,
            trans_a: self.trans_a,
            trans_b: self.trans_b,
            ..MatmulParams::new(self.m, self.n, self.k)
        }
    }
}

/// `out = op(A)·op(B) + bias` (bias `[n]` broadcast over rows), or `gelu_tanh` of it.
pub struct MatmulBias<'a, S: Space, T: hip_rt::Element> {
    /// GEMM and `gelu`.
    pub params: MatmulBiasParams,
    /// `[batch, m, k]` (`[batch, k, m]` if `trans_a`).
    pub a: S::In<'a, T>,
    /// `[batch, k, n]` (`[batch, n, k]` if `trans_b`).
    pub b: S::In<'a, T>,
    /// `[n]`, added to every row.
    pub bias: S::In<'a, T>,
    /// `[batch, m, n]`, overwritten.
    pub out: S::Out<'a, T>,
    /// With `gelu`, optionally the pre-activation `op(A)·op(B) + bias` (what GELU's backward
    /// needs); must be `None` without `gelu`.
    pub pre_gelu: Option<S::Out<'a, T>>,
}

impl<S: Space, T: hip_rt::Element> MatmulBias<'_, S, T> {
    /// Check the GEMM (alpha 1, beta 0), the bias and `pre_gelu`.
    pub fn validate(&self) -> Result<(), ShapeError> {
        const OP: &str = "matmul_bias";
        let m = self.params.matmul();
        check_len(OP, "a", m.a_len()?, self.a.numel())?;
        check_len(OP, "b", m.b_len()?, self.b.numel())?;
        check_len(OP, "out", m.out_len()?, self.out.numel())?;
        check_len(OP, "bias", m.n, self.bias.numel())?;
        match (&self.pre_gelu, self.params.gelu) {
            (Some(p), true) => check_len(OP, "pre_gelu", self.out.numel(), p.numel()),
            (Some(_), false) => Err(ShapeError::Presence {
                op: OP,
                tensor: "pre_gelu",
                required: false,
                fix: "set gelu = true or pass None",
            }),
            (None, _) => Ok(()),
        }
    }
}

/// A `[rows, cols]` gradient whose column sums are the bias gradient `[cols]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BiasParams {
    /// Rows (all batch and sequence positions), may be 0.
    pub rows: usize,
    /// Columns (the bias length).
    pub cols: usize,
    /// Add into `dbias` (gradient accumulation) instead of overwriting it.
    pub accumulate: bool,
}

impl BiasParams {
    /// Operation name used in errors.
    pub const OP: &'static str = "bias_backward";

    /// `dbias[cols] = Σ over rows of dout[rows, cols]`, overwriting `dbias`.
    pub fn new(rows: usize, cols: usize) -> Self {
        Self {
            rows,
            cols,
            accumulate: false,
        }
    }

    /// The same, adding into `dbias` (gradient accumulation) instead of overwriting it.
    pub fn accumulating(self) -> Self {
        Self {
            accumulate: true,
            ..self
        }
    }
}

/// `dbias[j] (+)= Σ_i dout[i, j]`.
pub struct BiasBackward<'a, S: Space, T: hip_rt::Element> {
    /// Dimensions and `accumulate`.
    pub params: BiasParams,
    /// Gradient of the biased output, `[rows, cols]`.
    pub dout: S::In<'a, T>,
    /// Bias gradient `[cols]`.
    pub dbias: S::Out<'a, T>,
}

impl<S: Space, T: hip_rt::Element> BiasBackward<'_, S, T> {
    /// Check both lengths.
    pub fn validate(&self) -> Result<(), ShapeError> {
        let p = &self.params;
        let n = checked_len(BiasParams::OP, "dout", &[p.rows, p.cols])?;
        check_len(BiasParams::OP, "dout", n, self.dout.numel())?;
        check_len(BiasParams::OP, "dbias", p.cols, self.dbias.numel())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constructors_give_the_plain_case_and_builders_change_one_thing() {
        let p = MatmulBiasParams::new(4, 8, 16);
        assert_eq!(
            (p.batch, p.m, p.n, p.k, p.trans_a, p.trans_b, p.gelu),
            (1, 4, 8, 16, false, false, false)
        );
        let q = p.batched(3).transposed(false, true).with_gelu();
        assert_eq!(
            (q.batch, q.trans_a, q.trans_b, q.gelu),
            (3, false, true, true)
        );
        let g = q.matmul();
        assert_eq!(
            (g.batch, g.m, g.n, g.k, g.trans_b, g.alpha, g.beta),
            (3, 4, 8, 16, true, 1.0, 0.0)
        );
        let b = BiasParams::new(5, 7);
        assert_eq!((b.rows, b.cols, b.accumulate), (5, 7, false));
        assert!(b.accumulating().accumulate);
    }
}
