//! Golden cases of `matmul`: parsing and running them.

use super::{Matmul, MatmulParams};
use crate::golden::{
    Case, CaseReader, GoldenCase, GoldenError, GoldenOp, GoldenSpace, Outputs, TensorData, Want,
};
use crate::ops::{OpError, Run};
use crate::params::{DType, DeviceElement, Element, ShapeError};
use crate::tolerance::{tolerance, Rule, Tolerance};
use crate::{golden_runs, with_dtype};
use std::any::Any;

/// The golden ops of this family.
pub(crate) const GOLDEN: &[GoldenOp] = &[GoldenOp {
    name: "matmul",
    parse,
}];

/// Inputs of a `matmul` case (`out` on entry holds `c` when present).
#[derive(Debug, Clone, PartialEq)]
pub struct MatmulCase {
    /// Shape, transposes, alpha and beta.
    pub params: MatmulParams,
    /// `a` (see [`MatmulParams`] for the layout).
    pub a: TensorData,
    /// `b`.
    pub b: TensorData,
    /// `c`, present iff `beta != 0`.
    pub c: Option<TensorData>,
}

const OP: &str = MatmulParams::OP;

fn parse(r: &mut CaseReader<'_>) -> Result<Case, GoldenError> {
    let (trans_a, trans_b) = (r.meta_bool("trans_a")?, r.meta_bool("trans_b")?);
    let (alpha, beta) = (r.meta_f32("alpha")?, r.meta_f32("beta")?);
    let (dtype, a_shape) = r.primary("a")?;
    let (_, b_shape) = r.primary("b")?;
    let split = |s: &[usize], name: &str| match *s {
        [r, c] => Ok((None, r, c)),
        [bt, r, c] => Ok((Some(bt), r, c)),
        _ => Err(r.shape_err(name, "[(batch,) rows, cols]".into(), s)),
    };
    let (batch, a0, a1) = split(&a_shape, "a")?;
    let (m, k) = if trans_a { (a1, a0) } else { (a0, a1) };
    let lead: Vec<usize> = batch.into_iter().collect();
    let (_, b0, b1) = split(&b_shape, "b")?;
    let n = if trans_b { b0 } else { b1 };
    let b_want: Vec<usize> = lead
        .iter()
        .copied()
        .chain(if trans_b { [n, k] } else { [k, n] })
        .collect();
    let out_shape: Vec<usize> = lead.iter().copied().chain([m, n]).collect();
    let a = r.take("a", Want::Case, dtype, None)?.data;
    let b = r.take("b", Want::Case, dtype, Some(&b_want))?.data;
    let c = r
        .take_opt("c", Want::Case, dtype, Some(&out_shape))?
        .map(|t| t.data);
    r.presence("c", c.is_some(), beta != 0.0)?;
    let params = MatmulParams {
        batch: batch.unwrap_or(1),
        m,
        n,
        k,
        trans_a,
        trans_b,
        alpha,
        beta,
        layout: crate::ops::MatmulLayout::PACKED,
    };
    let expected = r.expected(&[("out", Want::Case, out_shape)], dtype)?;
    let case = MatmulCase { params, a, b, c };
    Ok(r.finish(dtype, Box::new(case), expected))
}

impl MatmulCase {
    /// `out` on entry: `c`, or `fill` everywhere when there is no `c` (beta = 0).
    fn initial_out<T: DeviceElement>(&self, fill: f64) -> Result<Vec<T>, ShapeError> {
        Ok(match &self.c {
            Some(c) => c.typed::<T>(OP, "c")?.to_vec(),
            None => vec![<T as Element>::from_f64(fill); self.params.out_len()?],
        })
    }
}

impl MatmulCase {
    fn run<S: GoldenSpace>(&self, q: S::Queue<'_>) -> Result<Outputs, OpError> {
        with_dtype!(self.a.dtype(), T => {
            // NaN where beta = 0: C must not be read.
            let mut out = S::upload(q, &self.initial_out::<T>(f64::NAN)?)?;
            let (a, b) = (S::typed::<T>(q, &self.a, OP, "a")?, S::typed::<T>(q, &self.b, OP, "b")?);
            Matmul::<S, T> {
                params: self.params,
                a: S::input(&a),
                b: S::input(&b),
                out: S::output(&mut out),
            }
            .run(q)?;
            Ok(vec![("out", S::tensor(q, &out)?)])
        })
    }
}

impl GoldenCase for MatmulCase {
    fn op(&self) -> &'static str {
        OP
    }

    golden_runs!();

    fn tolerance(&self, output: &str, dtype: DType) -> Tolerance {
        tolerance(
            Rule::Reduction,
            output,
            dtype,
            self.a.dtype(),
            self.params.k,
        )
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
