//! Golden cases of `residual_layernorm_forward`.

use super::{LayerNormParams, ResidualLayerNormForward};
use crate::golden::{
    Case, CaseReader, GoldenCase, GoldenError, GoldenSpace, Outputs, TensorData, Want,
};
use crate::ops::{OpError, Run};
use crate::params::DType;
use crate::tolerance::{tolerance, Rule, Tolerance};
use crate::{golden_runs, with_dtype};
use std::any::Any;

/// Inputs of a `residual_layernorm_forward` case.
#[derive(Debug, Clone, PartialEq)]
pub struct ResidualLayerNormCase {
    /// Rows, columns and eps.
    pub params: LayerNormParams,
    /// `[rows, cols]`.
    pub a: TensorData,
    /// `[rows, cols]`.
    pub b: TensorData,
    /// `[cols]`.
    pub weight: TensorData,
    /// `[cols]`.
    pub bias: TensorData,
}

const OP: &str = LayerNormParams::OP;

pub(super) fn parse(r: &mut CaseReader<'_>) -> Result<Case, GoldenError> {
    let eps = r.meta_f32("eps")?;
    let (dtype, s) = r.primary("a")?;
    let [rows, cols] = s[..] else {
        return Err(r.shape_err("a", "[N, C]".into(), &s));
    };
    let a = r.take("a", Want::Case, dtype, None)?.data;
    let b = r.take("b", Want::Case, dtype, Some(&s))?.data;
    let weight = r.take("weight", Want::Case, dtype, Some(&[cols]))?.data;
    let bias = r.take("bias", Want::Case, dtype, Some(&[cols]))?.data;
    let expected = r.expected(
        &[
            ("residual", Want::Case, s.clone()),
            ("y", Want::Case, s.clone()),
            ("mean", Want::F32, vec![rows]),
            ("rstd", Want::F32, vec![rows]),
        ],
        dtype,
    )?;
    let params = LayerNormParams { rows, cols, eps };
    let case = ResidualLayerNormCase {
        params,
        a,
        b,
        weight,
        bias,
    };
    Ok(r.finish(dtype, Box::new(case), expected))
}

impl ResidualLayerNormCase {
    fn run<S: GoldenSpace>(&self, q: S::Queue<'_>) -> Result<Outputs, OpError> {
        let rows = self.params.rows;
        with_dtype!(self.a.dtype(), T => {
            let (a, b) = (S::typed::<T>(q, &self.a, OP, "a")?, S::typed::<T>(q, &self.b, OP, "b")?);
            let weight = S::typed::<T>(q, &self.weight, OP, "weight")?;
            let bias = S::typed::<T>(q, &self.bias, OP, "bias")?;
            let (mut x, mut y) = (S::zeros::<T>(q, self.a.len())?, S::zeros::<T>(q, self.a.len())?);
            let (mut mean, mut rstd) = (S::zeros::<f32>(q, rows)?, S::zeros::<f32>(q, rows)?);
            ResidualLayerNormForward::<S, T> {
                params: self.params,
                a: S::input(&a),
                b: S::input(&b),
                weight: S::input(&weight),
                bias: S::input(&bias),
                residual: S::output(&mut x),
                y: S::output(&mut y),
                mean: S::output(&mut mean),
                rstd: S::output(&mut rstd),
            }
            .run(q)?;
            Ok(vec![
                ("residual", S::tensor(q, &x)?),
                ("y", S::tensor(q, &y)?),
                ("mean", S::tensor(q, &mean)?),
                ("rstd", S::tensor(q, &rstd)?),
            ])
        })
    }
}

impl GoldenCase for ResidualLayerNormCase {
    fn op(&self) -> &'static str {
        "residual_layernorm_forward"
    }

    golden_runs!();

    fn tolerance(&self, output: &str, dtype: DType) -> Tolerance {
        let len = if output == "residual" {
            2
        } else {
            self.params.cols
        };
        tolerance(Rule::Reduction, output, dtype, self.a.dtype(), len)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
