//! Golden cases of `layernorm_forward` and `layernorm_backward`: parsing and running them.

use super::{LayerNormBackward, LayerNormForward, LayerNormParams};
use crate::golden::{
    f32s, Case, CaseReader, GoldenCase, GoldenError, GoldenOp, GoldenSpace, Outputs, TensorData,
    Want,
};
use crate::ops::{OpError, Run};
use crate::params::DType;
use crate::tolerance::{tolerance, Rule, Tolerance};
use crate::{golden_runs, with_dtype};
use std::any::Any;

/// The golden ops of this family.
pub(crate) const GOLDEN: &[GoldenOp] = &[
    GoldenOp {
        name: "layernorm_forward",
        parse: parse_forward,
    },
    GoldenOp {
        name: "layernorm_backward",
        parse: parse_backward,
    },
    GoldenOp {
        name: "residual_layernorm_forward",
        parse: super::golden_residual::parse,
    },
];

/// Inputs of a `layernorm_forward` case.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerNormForwardCase {
    /// Rows, columns and eps.
    pub params: LayerNormParams,
    /// `[rows, cols]`.
    pub x: TensorData,
    /// `[cols]`.
    pub weight: TensorData,
    /// `[cols]`.
    pub bias: TensorData,
}

/// Inputs of a `layernorm_backward` case.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerNormBackwardCase {
    /// Rows, columns and the forward's eps (the backward uses the saved `rstd`).
    pub params: LayerNormParams,
    /// `[rows, cols]`.
    pub x: TensorData,
    /// `[cols]`.
    pub weight: TensorData,
    /// `[rows, cols]`.
    pub dy: TensorData,
    /// Saved per-row mean `[rows]`.
    pub mean: Vec<f32>,
    /// Saved per-row `1/√(var + eps)` `[rows]`.
    pub rstd: Vec<f32>,
}

const OP: &str = LayerNormParams::OP;

/// The inputs both directions share: params, dtype, `x` and `weight`.
fn common(
    r: &mut CaseReader<'_>,
) -> Result<(LayerNormParams, DType, Vec<usize>, TensorData, TensorData), GoldenError> {
    let eps = r.meta_f32("eps")?;
    let (dtype, x_shape) = r.primary("x")?;
    let [rows, cols] = x_shape[..] else {
        return Err(r.shape_err("x", "[N, C]".into(), &x_shape));
    };
    let params = LayerNormParams { rows, cols, eps };
    let x = r.take("x", Want::Case, dtype, None)?.data;
    let weight = r.take("weight", Want::Case, dtype, Some(&[cols]))?.data;
    Ok((params, dtype, x_shape, x, weight))
}

fn parse_forward(r: &mut CaseReader<'_>) -> Result<Case, GoldenError> {
    let (params, dtype, x_shape, x, weight) = common(r)?;
    let cols = params.cols;
    let bias = r.take("bias", Want::Case, dtype, Some(&[cols]))?.data;
    let expected = r.expected(
        &[
            ("y", Want::Case, x_shape),
            ("mean", Want::F32, vec![params.rows]),
            ("rstd", Want::F32, vec![params.rows]),
        ],
        dtype,
    )?;
    let case = LayerNormForwardCase {
        params,
        x,
        weight,
        bias,
    };
    Ok(r.finish(dtype, Box::new(case), expected))
}

fn parse_backward(r: &mut CaseReader<'_>) -> Result<Case, GoldenError> {
    let (params, dtype, x_shape, x, weight) = common(r)?;
    let rows = params.rows;
    let dy = r.take("dy", Want::Case, dtype, Some(&x_shape))?.data;
    let mean = f32s(r.take("mean", Want::F32, dtype, Some(&[rows]))?);
    let rstd = f32s(r.take("rstd", Want::F32, dtype, Some(&[rows]))?);
    let expected = r.expected(
        &[
            ("dx", Want::Case, x_shape),
            ("dweight", Want::Case, vec![params.cols]),
            ("dbias", Want::Case, vec![params.cols]),
        ],
        dtype,
    )?;
    let case = LayerNormBackwardCase {
        params,
        x,
        weight,
        dy,
        mean,
        rstd,
    };
    Ok(r.finish(dtype, Box::new(case), expected))
}

impl LayerNormForwardCase {
    fn run<S: GoldenSpace>(&self, q: S::Queue<'_>) -> Result<Outputs, OpError> {
        let rows = self.params.rows;
        with_dtype!(self.x.dtype(), T => {
            let x = S::typed::<T>(q, &self.x, OP, "x")?;
            let weight = S::typed::<T>(q, &self.weight, OP, "weight")?;
            let bias = S::typed::<T>(q, &self.bias, OP, "bias")?;
            let mut y = S::zeros::<T>(q, self.x.len())?;
            let (mut mean, mut rstd) = (S::zeros::<f32>(q, rows)?, S::zeros::<f32>(q, rows)?);
            LayerNormForward::<S, T> {
                params: self.params,
                x: S::input(&x),
                weight: S::input(&weight),
                bias: S::input(&bias),
                y: S::output(&mut y),
                mean: S::output(&mut mean),
                rstd: S::output(&mut rstd),
            }
            .run(q)?;
            Ok(vec![
                ("y", S::tensor(q, &y)?),
                ("mean", S::tensor(q, &mean)?),
                ("rstd", S::tensor(q, &rstd)?),
            ])
        })
    }
}

impl GoldenCase for LayerNormForwardCase {
    fn op(&self) -> &'static str {
        "layernorm_forward"
    }

    golden_runs!();

    fn tolerance(&self, output: &str, dtype: DType) -> Tolerance {
        let input = self.x.dtype();
        tolerance(Rule::Reduction, output, dtype, input, self.params.cols)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl LayerNormBackwardCase {
    fn run<S: GoldenSpace>(&self, q: S::Queue<'_>) -> Result<Outputs, OpError> {
        with_dtype!(self.x.dtype(), T => {
            let x = S::typed::<T>(q, &self.x, OP, "x")?;
            let weight = S::typed::<T>(q, &self.weight, OP, "weight")?;
            let dy = S::typed::<T>(q, &self.dy, OP, "dy")?;
            let (mean, rstd) = (S::upload(q, &self.mean)?, S::upload(q, &self.rstd)?);
            // Outputs start as NaN: the overwriting backward must never read them.
            let (cols, n) = (self.params.cols, self.x.len());
            let (mut dx, mut dw, mut db) = (S::nan::<T>(q, n)?, S::nan::<T>(q, cols)?, S::nan::<T>(q, cols)?);
            LayerNormBackward::<S, T> {
                params: self.params,
                x: S::input(&x),
                weight: S::input(&weight),
                dy: S::input(&dy),
                mean: S::input(&mean),
                rstd: S::input(&rstd),
                dx: S::output(&mut dx),
                dweight: S::output(&mut dw),
                dbias: S::output(&mut db),
                accumulate: false,
            }
            .run(q)?;
            Ok(vec![
                ("dx", S::tensor(q, &dx)?),
                ("dweight", S::tensor(q, &dw)?),
                ("dbias", S::tensor(q, &db)?),
            ])
        })
    }
}

impl GoldenCase for LayerNormBackwardCase {
    fn op(&self) -> &'static str {
        "layernorm_backward"
    }

    golden_runs!();

    fn tolerance(&self, output: &str, dtype: DType) -> Tolerance {
        let len = if output == "dx" {
            self.params.cols
        } else {
            self.params.rows
        };
        tolerance(Rule::Reduction, output, dtype, self.x.dtype(), len)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
