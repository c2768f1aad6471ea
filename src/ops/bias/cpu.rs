//! Matmul + bias (+ GELU) and the bias gradient on the CPU: f64 sums, one rounding per value.

use super::{BiasBackward, MatmulBias};
use crate::ops::gelu::cpu::gelu_tanh;
use crate::ops::matmul::cpu::products;
use crate::params::{DeviceElement, Host, ShapeError};

/// `out = op(A)·op(B) + bias` (bias broadcast over rows), or `gelu_tanh` of it with `gelu`.
///
/// The product and the bias are summed in f64; `out` is `gelu` of that unrounded sum, and
/// `pre_gelu` its rounding, each rounded once (a fused device epilogue likewise applies GELU to
/// its f32 accumulator, not to the stored pre-activation).
pub fn matmul_bias<T: DeviceElement>(a: MatmulBias<'_, Host, T>) -> Result<(), ShapeError> {
    a.validate()?;
    let gelu = a.params.gelu;
    let bias: Vec<f64> = a.bias.iter().map(|x| x.to_f64()).collect();
    let mut pre = vec![0.0f64; a.out.len()];
    products(&a.params.matmul(), a.a, a.b, &mut pre, |j, acc, o| {
        *o = acc + bias[j]
    });
    for (o, p) in a.out.iter_mut().zip(&pre) {
        *o = T::from_f64(if gelu { gelu_tanh(*p) } else { *p });
    }
    if let Some(dst) = a.pre_gelu {
        for (d, p) in dst.iter_mut().zip(&pre) {
            *d = T::from_f64(*p);
        }
    }
    Ok(())
}

/// `dbias[j] (+)= Σ_i dout[i, j]`, summed in f64 in row order and rounded once per column
/// (with `accumulate`, the old value is part of that one rounding).
pub fn bias_backward<T: DeviceElement>(a: BiasBackward<'_, Host, T>) -> Result<(), ShapeError> {
    a.validate()?;
    let p = a.params;
    let mut sums = vec![0.0f64; p.cols];
    for row in a.dout.chunks(p.cols.max(1)) {
        for (s, g) in sums.iter_mut().zip(row) {
            *s += g.to_f64();
        }
    }
    for (d, s) in a.dbias.iter_mut().zip(&sums) {
        let old = if p.accumulate { d.to_f64() } else { 0.0 };
        *d = T::from_f64(old + s);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::bias::{BiasParams, MatmulBiasParams};

    #[test]
    fn bias_is_broadcast_and_gelu_uses_the_unrounded_sum() {
        let p = |gelu| MatmulBiasParams {
            batch: 1,
            m: 1,
            n: 3,
            k: 2,
            trans_a: false,
            trans_b: false,
            gelu,
        };
        // [1, 2] · [[1, 0, 2], [0, 1, -1]] = [1, 2, 0]; + bias [0.5, -2, 0].
        let (a, b, bias) = (
            [1.0f32, 2.0],
            [1.0f32, 0., 2., 0., 1., -1.],
            [0.5f32, -2.0, 0.0],
        );
        let mut out = [0.0f32; 3];
        matmul_bias(MatmulBias::<Host, f32> {
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
        matmul_bias(MatmulBias::<Host, f32> {
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
        let e = matmul_bias(MatmulBias::<Host, f32> {
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
        bias_backward(BiasBackward::<Host, f32> {
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
        bias_backward(BiasBackward::<Host, f32> {
            params,
            dout: &dout,
            dbias: &mut db,
        })
        .unwrap();
        assert_eq!(db, [18.0, 24.0]);
        let e = bias_backward(BiasBackward::<Host, f32> {
            params,
            dout: &dout[..5],
            dbias: &mut db,
        })
        .unwrap_err();
        assert!(e.to_string().contains("`dout` has 5 elements"), "{e}");
    }
}
