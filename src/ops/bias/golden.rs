//! Golden cases of `matmul_bias` and `bias_backward`.

use super::{BiasBackward, BiasParams, MatmulBias, MatmulBiasParams};
use crate::golden::{
    download, upload, Case, CaseReader, GoldenCase, GoldenError, GoldenOp, Outputs, TensorData,
    Want,
};
use crate::ops::OpError;
use crate::params::{DType, Element, ShapeError};
use crate::tolerance::{tolerance, Rule, Tolerance};
use crate::{cpu, ops, with_dtype};
use hip_rt::{DeviceBuffer, Stream};
use std::any::Any;

/// The golden ops of this family.
pub(crate) const GOLDEN: &[GoldenOp] = &[
    GoldenOp {
        name: "matmul_bias",
        parse: parse_matmul_bias,
    },
    GoldenOp {
        name: "bias_backward",
        parse: parse_backward,
    },
];

/// Inputs of a `matmul_bias` case.
#[derive(Debug, Clone, PartialEq)]
pub struct MatmulBiasCase {
    /// GEMM and `gelu`.
    pub params: MatmulBiasParams,
    /// A.
    pub a: TensorData,
    /// B.
    pub b: TensorData,
    /// `[n]`.
    pub bias: TensorData,
}

/// Inputs of a `bias_backward` case.
#[derive(Debug, Clone, PartialEq)]
pub struct BiasBackwardCase {
    /// Dimensions and `accumulate`.
    pub params: BiasParams,
    /// `[rows, cols]`.
    pub dout: TensorData,
    /// Initial `dbias` `[cols]` (added to when `accumulate`).
    pub dbias: TensorData,
}

fn parse_matmul_bias(r: &mut CaseReader<'_>) -> Result<Case, GoldenError> {
    let (trans_a, trans_b, gelu) = (
        r.meta_bool("trans_a")?,
        r.meta_bool("trans_b")?,
        r.meta_bool("gelu")?,
    );
    let (dtype, sa) = r.primary("a")?;
    let (_, sb) = r.primary("b")?;
    let (batch, lead) = match sa.len() {
        3 => (sa[0], vec![sa[0]]),
        2 => (1, vec![]),
        _ => return Err(r.shape_err("a", "[m, k] or [batch, m, k]".into(), &sa)),
    };
    let (ra, ca) = (sa[sa.len() - 2], sa[sa.len() - 1]);
    let (m, k) = if trans_a { (ca, ra) } else { (ra, ca) };
    let n = if trans_b {
        sb[sb.len() - 2]
    } else {
        sb[sb.len() - 1]
    };
    let mut bshape = lead.clone();
    bshape.extend(if trans_b { [n, k] } else { [k, n] });
    let a = r.take("a", Want::Case, dtype, None)?.data;
    let b = r.take("b", Want::Case, dtype, Some(&bshape))?.data;
    let bias = r.take("bias", Want::Case, dtype, Some(&[n]))?.data;
    let mut oshape = lead;
    oshape.extend([m, n]);
    let mut outs = vec![("out", Want::Case, oshape.clone())];
    if gelu {
        outs.push(("pre_gelu", Want::Case, oshape));
    }
    let expected = r.expected(&outs, dtype)?;
    let params = MatmulBiasParams {
        batch,
        m,
        n,
        k,
        trans_a,
        trans_b,
        gelu,
    };
    Ok(r.finish(
        dtype,
        Box::new(MatmulBiasCase { params, a, b, bias }),
        expected,
    ))
}

fn parse_backward(r: &mut CaseReader<'_>) -> Result<Case, GoldenError> {
    let accumulate = r.meta_bool("accumulate")?;
    let (dtype, ds) = r.primary("dout")?;
    let [rows, cols] = ds[..] else {
        return Err(r.shape_err("dout", "[rows, cols]".into(), &ds));
    };
    let dout = r.take("dout", Want::Case, dtype, None)?.data;
    let dbias = r.take("dbias", Want::Case, dtype, Some(&[cols]))?.data;
    let expected = r.expected(&[("dbias", Want::Case, vec![cols])], dtype)?;
    let params = BiasParams {
        rows,
        cols,
        accumulate,
    };
    Ok(r.finish(
        dtype,
        Box::new(BiasBackwardCase {
            params,
            dout,
            dbias,
        }),
        expected,
    ))
}

const OP: &str = "matmul_bias";

impl GoldenCase for MatmulBiasCase {
    fn op(&self) -> &'static str {
        "matmul_bias"
    }

    fn run_cpu(&self) -> Result<Outputs, ShapeError> {
        let p = self.params;
        let len = p.batch * p.m * p.n;
        with_dtype!(self.a.dtype(), T => {
            let mut out = vec![T::from_f64(0.0); len];
            let mut pre = p.gelu.then(|| out.clone());
            cpu::matmul_bias(MatmulBias::<_, T> {
                params: p,
                a: self.a.typed::<T>(OP, "a")?,
                b: self.b.typed::<T>(OP, "b")?,
                bias: self.bias.typed::<T>(OP, "bias")?,
                out: &mut out,
                pre_gelu: pre.as_deref_mut(),
            })?;
            let mut o = vec![("out", TensorData::from_slice(&out))];
            if let Some(p) = &pre {
                o.push(("pre_gelu", TensorData::from_slice(p)));
            }
            Ok(o)
        })
    }

    fn run_device(&self, s: &Stream) -> Result<Outputs, OpError> {
        let p = self.params;
        let len = p.batch * p.m * p.n;
        with_dtype!(self.a.dtype(), T => {
            let (a, b) = (upload(s, self.a.typed::<T>(OP, "a")?)?, upload(s, self.b.typed::<T>(OP, "b")?)?);
            let bias = upload(s, self.bias.typed::<T>(OP, "bias")?)?;
            let mut out = DeviceBuffer::<T>::zeroed(s, len)?;
            let mut pre = if p.gelu { Some(DeviceBuffer::<T>::zeroed(s, len)?) } else { None };
            ops::matmul_bias(s, MatmulBias {
                params: p,
                a: &a,
                b: &b,
                bias: &bias,
                out: &mut out,
                pre_gelu: pre.as_mut().map(|x| x as _),
            })?;
            let mut o = vec![("out", download(s, &out)?)];
            if let Some(pb) = &pre {
                o.push(("pre_gelu", download(s, pb)?));
            }
            Ok(o)
        })
    }

    fn tolerance(&self, output: &str, dtype: DType) -> Tolerance {
        // The device's fused epilogue adds the bias to the f32 accumulator and rounds once,
        // as the reference does: a k-term reduction plus the bias.
        tolerance(
            Rule::Reduction,
            output,
            dtype,
            self.a.dtype(),
            self.params.k + 1,
        )
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl GoldenCase for BiasBackwardCase {
    fn op(&self) -> &'static str {
        "bias_backward"
    }

    fn run_cpu(&self) -> Result<Outputs, ShapeError> {
        with_dtype!(self.dout.dtype(), T => {
            let mut dbias = self.dbias.typed::<T>(BiasParams::OP, "dbias")?.to_vec();
            cpu::bias_backward(BiasBackward::<_, T> {
                params: self.params,
                dout: self.dout.typed::<T>(BiasParams::OP, "dout")?,
                dbias: &mut dbias,
            })?;
            Ok(vec![("dbias", TensorData::from_slice(&dbias))])
        })
    }

    fn run_device(&self, s: &Stream) -> Result<Outputs, OpError> {
        with_dtype!(self.dout.dtype(), T => {
            let dout = upload(s, self.dout.typed::<T>(BiasParams::OP, "dout")?)?;
            let mut dbias = upload(s, self.dbias.typed::<T>(BiasParams::OP, "dbias")?)?;
            ops::bias_backward(s, BiasBackward { params: self.params, dout: &dout, dbias: &mut dbias })?;
            Ok(vec![("dbias", download(s, &dbias)?)])
        })
    }

    fn tolerance(&self, output: &str, dtype: DType) -> Tolerance {
        tolerance(
            Rule::Reduction,
            output,
            dtype,
            self.dout.dtype(),
            self.params.rows + 1,
        )
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
