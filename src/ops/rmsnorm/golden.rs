//! Golden cases of `rmsnorm_forward`, `residual_rmsnorm_forward` and `rmsnorm_backward`.

use super::{ResidualRmsNormForward, RmsNormBackward, RmsNormForward, RmsNormParams};
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
        name: "rmsnorm_forward",
        parse: parse_forward,
    },
    GoldenOp {
        name: "residual_rmsnorm_forward",
        parse: parse_residual,
    },
    GoldenOp {
        name: "rmsnorm_backward",
        parse: parse_backward,
    },
];

/// Which forward a [`RmsNormForwardCase`] runs.
#[derive(Debug, Clone, PartialEq)]
pub enum RmsNormVariant {
    /// `y = rms_norm(x)`.
    Plain {
        /// `[rows, cols]`.
        x: TensorData,
    },
    /// `residual = a + b; y = rms_norm(residual)`.
    Residual {
        /// `[rows, cols]`.
        a: TensorData,
        /// `[rows, cols]`.
        b: TensorData,
    },
}

/// Inputs of a `rmsnorm_forward` or `residual_rmsnorm_forward` case.
#[derive(Debug, Clone, PartialEq)]
pub struct RmsNormForwardCase {
    /// Rows, columns and eps.
    pub params: RmsNormParams,
    /// The input(s).
    pub variant: RmsNormVariant,
    /// `[cols]`.
    pub weight: TensorData,
}

/// Inputs of a `rmsnorm_backward` case.
#[derive(Debug, Clone, PartialEq)]
pub struct RmsNormBackwardCase {
    /// Rows, columns and the forward's eps.
    pub params: RmsNormParams,
    /// `[rows, cols]`.
    pub x: TensorData,
    /// `[cols]`.
    pub weight: TensorData,
    /// `[rows, cols]`.
    pub dy: TensorData,
    /// Saved per-row `rstd` `[rows]`.
    pub rstd: Vec<f32>,
}

const OP: &str = RmsNormParams::OP;

/// eps, the dtype and shape of `primary`, and the params.
fn head(
    r: &mut CaseReader<'_>,
    primary: &str,
) -> Result<(RmsNormParams, DType, Vec<usize>), GoldenError> {
    let eps = r.meta_f32("eps")?;
    let (dtype, shape) = r.primary(primary)?;
    let [rows, cols] = shape[..] else {
        return Err(r.shape_err(primary, "[N, C]".into(), &shape));
    };
    Ok((RmsNormParams { rows, cols, eps }, dtype, shape))
}

fn parse_forward(r: &mut CaseReader<'_>) -> Result<Case, GoldenError> {
    let (params, dtype, shape) = head(r, "x")?;
    let x = r.take("x", Want::Case, dtype, None)?.data;
    let weight = r
        .take("weight", Want::Case, dtype, Some(&[params.cols]))?
        .data;
    let expected = r.expected(
        &[
            ("y", Want::Case, shape),
            ("rstd", Want::F32, vec![params.rows]),
        ],
        dtype,
    )?;
    let variant = RmsNormVariant::Plain { x };
    let case = RmsNormForwardCase {
        params,
        variant,
        weight,
    };
    Ok(r.finish(dtype, Box::new(case), expected))
}

fn parse_residual(r: &mut CaseReader<'_>) -> Result<Case, GoldenError> {
    let (params, dtype, shape) = head(r, "a")?;
    let a = r.take("a", Want::Case, dtype, None)?.data;
    let b = r.take("b", Want::Case, dtype, Some(&shape))?.data;
    let weight = r
        .take("weight", Want::Case, dtype, Some(&[params.cols]))?
        .data;
    let expected = r.expected(
        &[
            ("residual", Want::Case, shape.clone()),
            ("y", Want::Case, shape),
            ("rstd", Want::F32, vec![params.rows]),
        ],
        dtype,
    )?;
    let variant = RmsNormVariant::Residual { a, b };
    let case = RmsNormForwardCase {
        params,
        variant,
        weight,
    };
    Ok(r.finish(dtype, Box::new(case), expected))
}

fn parse_backward(r: &mut CaseReader<'_>) -> Result<Case, GoldenError> {
    let (params, dtype, shape) = head(r, "x")?;
    let x = r.take("x", Want::Case, dtype, None)?.data;
    let weight = r
        .take("weight", Want::Case, dtype, Some(&[params.cols]))?
        .data;
    let dy = r.take("dy", Want::Case, dtype, Some(&shape))?.data;
    let rstd = f32s(r.take("rstd", Want::F32, dtype, Some(&[params.rows]))?);
    let expected = r.expected(
        &[
            ("dx", Want::Case, shape),
            ("dweight", Want::Case, vec![params.cols]),
        ],
        dtype,
    )?;
    let case = RmsNormBackwardCase {
        params,
        x,
        weight,
        dy,
        rstd,
    };
    Ok(r.finish(dtype, Box::new(case), expected))
}

impl RmsNormForwardCase {
    fn dtype(&self) -> DType {
        self.weight.dtype()
    }
}

impl RmsNormForwardCase {
    fn run<S: GoldenSpace>(&self, q: S::Queue<'_>) -> Result<Outputs, OpError> {
        let (params, n) = (self.params, self.params.rows * self.params.cols);
        with_dtype!(self.dtype(), T => {
            let weight = S::typed::<T>(q, &self.weight, OP, "weight")?;
            let mut y = S::zeros::<T>(q, n)?;
            let mut rstd = S::zeros::<f32>(q, params.rows)?;
            let mut out = Vec::new();
            match &self.variant {
                RmsNormVariant::Plain { x } => {
                    let x = S::typed::<T>(q, x, OP, "x")?;
                    RmsNormForward::<S, T> {
                        params,
                        x: S::input(&x),
                        weight: S::input(&weight),
                        y: S::output(&mut y),
                        rstd: S::output(&mut rstd),
                    }
                    .run(q)?
                }
                RmsNormVariant::Residual { a, b } => {
                    let (a, b) = (S::typed::<T>(q, a, OP, "a")?, S::typed::<T>(q, b, OP, "b")?);
                    let mut res = S::zeros::<T>(q, n)?;
                    ResidualRmsNormForward::<S, T> {
                        params,
                        a: S::input(&a),
                        b: S::input(&b),
                        weight: S::input(&weight),
                        residual: S::output(&mut res),
                        y: S::output(&mut y),
                        rstd: S::output(&mut rstd),
                    }
                    .run(q)?;
                    out.push(("residual", S::tensor(q, &res)?));
                }
            }
            out.push(("y", S::tensor(q, &y)?));
            out.push(("rstd", S::tensor(q, &rstd)?));
            Ok(out)
        })
    }
}

impl GoldenCase for RmsNormForwardCase {
    fn op(&self) -> &'static str {
        match self.variant {
            RmsNormVariant::Plain { .. } => "rmsnorm_forward",
            RmsNormVariant::Residual { .. } => "residual_rmsnorm_forward",
        }
    }

    golden_runs!();

    fn tolerance(&self, output: &str, dtype: DType) -> Tolerance {
        let len = if output == "residual" {
            2
        } else {
            self.params.cols
        };
        tolerance(Rule::Reduction, output, dtype, self.dtype(), len)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl RmsNormBackwardCase {
    fn run<S: GoldenSpace>(&self, q: S::Queue<'_>) -> Result<Outputs, OpError> {
        with_dtype!(self.x.dtype(), T => {
            let x = S::typed::<T>(q, &self.x, OP, "x")?;
            let w = S::typed::<T>(q, &self.weight, OP, "weight")?;
            let dy = S::typed::<T>(q, &self.dy, OP, "dy")?;
            let rstd = S::upload(q, &self.rstd)?;
            // Outputs start as NaN: the overwriting backward must never read them.
            let (mut dx, mut dw) = (S::nan::<T>(q, self.x.len())?, S::nan::<T>(q, self.params.cols)?);
            RmsNormBackward::<S, T> {
                params: self.params,
                x: S::input(&x),
                weight: S::input(&w),
                dy: S::input(&dy),
                rstd: S::input(&rstd),
                dx: S::output(&mut dx),
                dweight: S::output(&mut dw),
                accumulate: false,
            }
            .run(q)?;
            Ok(vec![("dx", S::tensor(q, &dx)?), ("dweight", S::tensor(q, &dw)?)])
        })
    }
}

impl GoldenCase for RmsNormBackwardCase {
    fn op(&self) -> &'static str {
        "rmsnorm_backward"
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
