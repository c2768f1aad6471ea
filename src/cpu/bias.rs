//! Matmul with a bias (and optionally GELU) in the epilogue, and the bias gradient; f64
//! internally.

use super::gelu::gelu_tanh;
use super::matmul::products;
use super::{Element, MatmulShape, ShapeError};
use crate::params::{check_len, checked_len};

/// Dimensions, transposes and activation of [`matmul_bias`] (the GEMM's as in
/// [`MatmulShape`]).
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
    /// The GEMM part.
    pub const fn matmul(&self) -> MatmulShape {
        MatmulShape {
            batch: self.batch,
            m: self.m,
            n: self.n,
            k: self.k,
            trans_a: self.trans_a,
            trans_b: self.trans_b,
        }
    }
}

impl From<MatmulShape> for MatmulBiasParams {
    /// The GEMM's dimensions, no GELU.
    fn from(s: MatmulShape) -> Self {
        Self {
            batch: s.batch,
            m: s.m,
            n: s.n,
            k: s.k,
            trans_a: s.trans_a,
            trans_b: s.trans_b,
            gelu: false,
        }
    }
}

/// Arguments of [`matmul_bias`].
#[derive(Debug)]
pub struct MatmulBias<'a, T> {
    /// Dimensions, transposes and `gelu`.
    pub params: MatmulBiasParams,
    /// `[batch, m, k]` (`[batch, k, m]` if `trans_a`).
    pub a: &'a [T],
    /// `[batch, k, n]` (`[batch, n, k]` if `trans_b`).
    pub b: &'a [T],
    /// `[n]`, added to every row.
    pub bias: &'a [T],
    /// `[batch, m, n]`, overwritten (not read).
    pub out: &'a mut [T],
    /// With `gelu`, optionally also store the pre-activation `op(A)·op(B) + bias` here
    /// (`[batch, m, n]`, what GELU's backward needs). Must be `None` without `gelu`.
    pub pre_gelu: Option<&'a mut [T]>,
}

/// `out = op(A)·op(B) + bias` (bias broadcast over rows), or `gelu_tanh` of it with `gelu`.
///
/// The product and the bias are summed in f64; `out` is `gelu` of that unrounded sum, and
/// `pre_gelu` its rounding, each rounded once (a device kernel likewise applies GELU to its f32
/// accumulator, not to the stored pre-activation).
pub fn matmul_bias<T: Element>(args: MatmulBias<'_, T>) -> Result<(), ShapeError> {
    let MatmulBias {
        params,
        a,
        b,
        bias,
        out,
        pre_gelu,
    } = args;
    let (shape, gelu) = (params.matmul(), params.gelu);
    const OP: &str = "matmul_bias";
    shape.validate(1.0, 0.0, a.len(), b.len(), out.len())?;
    check_len(OP, "bias", shape.n, bias.len())?;
    match (&pre_gelu, gelu) {
        (Some(p), true) => check_len(OP, "pre_gelu", out.len(), p.len())?,
        (Some(_), false) => {
            return Err(ShapeError::Presence {
                op: OP,
                tensor: "pre_gelu",
                required: false,
                fix: "set gelu = true or pass None",
            })
        }
        (None, _) => {}
    }
    let bias: Vec<f64> = bias.iter().map(|x| x.to_f64()).collect();
    let mut pre = vec![0.0f64; out.len()];
    products(&shape, a, b, &mut pre, |j, acc, o| *o = acc + bias[j]);
    for (o, p) in out.iter_mut().zip(&pre) {
        *o = T::from_f64(if gelu { gelu_tanh(*p) } else { *p });
    }
    if let Some(dst) = pre_gelu {
        for (d, p) in dst.iter_mut().zip(&pre) {
            *d = T::from_f64(*p);
        }
    }
    Ok(())
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
    /// Operation name used in errors and kernel names.
    pub const OP: &'static str = "bias_backward";

    /// Check the lengths of `dout` (`[rows, cols]`) and `dbias` (`[cols]`).
    pub fn validate(&self, dout: usize, dbias: usize) -> Result<(), ShapeError> {
        check_len(
            Self::OP,
            "dout",
            checked_len(Self::OP, "dout", &[self.rows, self.cols])?,
            dout,
        )?;
        check_len(Self::OP, "dbias", self.cols, dbias)
    }
}

/// Arguments of [`bias_backward`].
#[derive(Debug)]
pub struct BiasBackward<'a, T> {
    /// Dimensions and `accumulate`.
    pub params: BiasParams,
    /// Gradient of the biased output, `[rows, cols]`.
    pub dout: &'a [T],
    /// Bias gradient `[cols]`.
    pub dbias: &'a mut [T],
}

/// `dbias[j] (+)= Σ_i dout[i, j]`, summed in f64 in row order and rounded once per column
/// (with `accumulate`, the old value is part of that one rounding).
pub fn bias_backward<T: Element>(args: BiasBackward<'_, T>) -> Result<(), ShapeError> {
    let BiasBackward {
        params,
        dout,
        dbias,
    } = args;
    params.validate(dout.len(), dbias.len())?;
    let mut sums = vec![0.0f64; params.cols];
    for row in dout.chunks(params.cols.max(1)) {
        for (s, g) in sums.iter_mut().zip(row) {
            *s += g.to_f64();
        }
    }
    for (d, s) in dbias.iter_mut().zip(&sums) {
        let old = if params.accumulate { d.to_f64() } else { 0.0 };
        *d = T::from_f64(old + s);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bias_is_broadcast_and_gelu_uses_the_unrounded_sum() {
        let p = |gelu| MatmulBiasParams {
            gelu,
            ..MatmulBiasParams::from(MatmulShape::new(1, 3, 2))
        };
        // [1, 2] · [[1, 0, 2], [0, 1, -1]] = [1, 2, 0]; + bias [0.5, -2, 0].
        let (a, b, bias) = (
            [1.0f32, 2.0],
            [1.0f32, 0., 2., 0., 1., -1.],
            [0.5f32, -2.0, 0.0],
        );
        let mut out = [0.0f32; 3];
        matmul_bias(MatmulBias {
            params: p(false),
            a: &a,
            b: &b,
            bias: &bias,
            out: &mut out,
            pre_gelu: None,
        })
        .unwrap();
        assert_eq!(out, [1.5, 0.0, 0.0]);
        let mut pre = [9.0f32; 3];
        matmul_bias(MatmulBias {
            params: p(true),
            a: &a,
            b: &b,
            bias: &bias,
            out: &mut out,
            pre_gelu: Some(&mut pre),
        })
        .unwrap();
        assert_eq!(pre, [1.5, 0.0, 0.0]);
        assert_eq!(out, [gelu_tanh(1.5) as f32, 0.0, 0.0]);
        let e = matmul_bias(MatmulBias {
            params: p(false),
            a: &a,
            b: &b,
            bias: &bias,
            out: &mut out,
            pre_gelu: Some(&mut pre),
        })
        .unwrap_err();
        assert!(e.to_string().contains("`pre_gelu` must be absent"), "{e}");
    }

    #[test]
    fn column_sums_overwrite_or_accumulate() {
        let dout = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let mut db = [10.0f32, 20.0];
        let params = BiasParams {
            rows: 3,
            cols: 2,
            accumulate: false,
        };
        bias_backward(BiasBackward {
            params,
            dout: &dout,
            dbias: &mut db,
        })
        .unwrap();
        assert_eq!(db, [9.0, 12.0]);
        let params = BiasParams {
            accumulate: true,
            ..params
        };
        bias_backward(BiasBackward {
            params,
            dout: &dout,
            dbias: &mut db,
        })
        .unwrap();
        assert_eq!(db, [18.0, 24.0]);
        let e = bias_backward(BiasBackward {
            params,
            dout: &dout[..5],
            dbias: &mut db,
        })
        .unwrap_err();
        assert!(e.to_string().contains("`dout` has 5 elements"), "{e}");
    }
}
