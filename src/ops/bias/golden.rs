//! Golden cases of `matmul_bias` and `bias_backward`.

use super::{BiasBackward, BiasParams, MatmulBias, MatmulBiasParams};
use crate::golden::{
    Case, CaseReader, GoldenCase, GoldenError, GoldenOp, GoldenSpace, Outputs, TensorData, Want,
};
use crate::ops::{OpError, Run};
use crate::params::DType;
use crate::tolerance::{tolerance, Rule, Tolerance};
use crate::{golden_runs, with_dtype};
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

impl MatmulBiasCase {
    fn run<S: GoldenSpace>(&self, q: S::Queue<'_>) -> Result<Outputs, OpError> {
        let p = self.params;
        let len = p.batch * p.m * p.n;
        with_dtype!(self.a.dtype(), T => {
            let (a, b) = (S::typed::<T>(q, &self.a, OP, "a")?, S::typed::<T>(q, &self.b, OP, "b")?);
            let bias = S::typed::<T>(q, &self.bias, OP, "bias")?;
            let mut out = S::zeros::<T>(q, len)?;
            let mut pre = if p.gelu { Some(S::zeros::<T>(q, len)?) } else { None };
            MatmulBias::<S, T> {
                params: p,
                a: S::input(&a),
                b: S::input(&b),
                bias: S::input(&bias),
                out: S::output(&mut out),
                pre_gelu: pre.as_mut().map(S::output),
            }
            .run(q)?;
            let mut o = vec![("out", S::tensor(q, &out)?)];
            if let Some(pb) = &pre {
                o.push(("pre_gelu", S::tensor(q, pb)?));
            }
            Ok(o)
        })
    }
}

impl GoldenCase for MatmulBiasCase {
    fn op(&self) -> &'static str {
        "matmul_bias"
    }

    golden_runs!();

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

impl BiasBackwardCase {
    fn run<S: GoldenSpace>(&self, q: S::Queue<'_>) -> Result<Outputs, OpError> {
        with_dtype!(self.dout.dtype(), T => {
            let dout = S::typed::<T>(q, &self.dout, BiasParams::OP, "dout")?;
            let mut dbias = S::typed::<T>(q, &self.dbias, BiasParams::OP, "dbias")?;
            BiasBackward::<S, T> {
                params: self.params,
                dout: S::input(&dout),
                dbias: S::output(&mut dbias),
            }
            .run(q)?;
            Ok(vec![("dbias", S::tensor(q, &dbias)?)])
        })
    }
}

impl GoldenCase for BiasBackwardCase {
    fn op(&self) -> &'static str {
        "bias_backward"
    }

    golden_runs!();

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
