//! Golden cases of `rmsnorm_forward`, `residual_rmsnorm_forward` and `rmsnorm_backward`.

use super::{ResidualRmsNormForward, RmsNormBackward, RmsNormForward, RmsNormParams};
use crate::golden::{
    download, download_f32, f32s, upload, Case, CaseReader, GoldenCase, GoldenError, GoldenOp,
    Outputs, TensorData, Want,
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

impl GoldenCase for RmsNormForwardCase {
    fn op(&self) -> &'static str {
        match self.variant {
            RmsNormVariant::Plain { .. } => "rmsnorm_forward",
            RmsNormVariant::Residual { .. } => "residual_rmsnorm_forward",
        }
    }

    fn run_cpu(&self) -> Result<Outputs, ShapeError> {
        let (params, n) = (self.params, self.params.rows * self.params.cols);
        with_dtype!(self.dtype(), T => {
            let weight = self.weight.typed::<T>(OP, "weight")?;
            let mut y = vec![T::from_f64(0.0); n];
            let mut rstd = vec![0.0f32; params.rows];
            let mut out = Vec::new();
            match &self.variant {
                RmsNormVariant::Plain { x } => cpu::rmsnorm_forward(RmsNormForward::<_, T> {
                    params, x: x.typed::<T>(OP, "x")?, weight, y: &mut y, rstd: &mut rstd,
                })?,
                RmsNormVariant::Residual { a, b } => {
                    let mut res = vec![T::from_f64(0.0); n];
                    cpu::residual_rmsnorm_forward(ResidualRmsNormForward::<_, T> {
                        params, a: a.typed::<T>(OP, "a")?, b: b.typed::<T>(OP, "b")?, weight,
                        residual: &mut res, y: &mut y, rstd: &mut rstd,
                    })?;
                    out.push(("residual", TensorData::from_slice(&res)));
                }
            }
            out.push(("y", TensorData::from_slice(&y)));
            out.push(("rstd", TensorData::F32(rstd)));
            Ok(out)
        })
    }

    fn run_device(&self, s: &Stream) -> Result<Outputs, OpError> {
        let (params, n) = (self.params, self.params.rows * self.params.cols);
        with_dtype!(self.dtype(), T => {
            let weight = upload(s, self.weight.typed::<T>(OP, "weight")?)?;
            let mut y = DeviceBuffer::<T>::zeroed(s, n)?;
            let mut rstd = DeviceBuffer::<f32>::zeroed(s, params.rows)?;
            let mut out = Vec::new();
            match &self.variant {
                RmsNormVariant::Plain { x } => {
                    let x = upload(s, x.typed::<T>(OP, "x")?)?;
                    ops::rmsnorm_forward(s, RmsNormForward {
                        params, x: &x, weight: &weight, y: &mut y, rstd: &mut rstd,
                    })?
                }
                RmsNormVariant::Residual { a, b } => {
                    let (a, b) = (upload(s, a.typed::<T>(OP, "a")?)?, upload(s, b.typed::<T>(OP, "b")?)?);
                    let mut res = DeviceBuffer::<T>::zeroed(s, n)?;
                    ops::residual_rmsnorm_forward(s, ResidualRmsNormForward {
                        params, a: &a, b: &b, weight: &weight, residual: &mut res, y: &mut y,
                        rstd: &mut rstd,
                    })?;
                    out.push(("residual", download(s, &res)?));
                }
            }
            out.push(("y", download(s, &y)?));
            out.push(("rstd", TensorData::F32(download_f32(s, &rstd)?)));
            Ok(out)
        })
    }

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

impl GoldenCase for RmsNormBackwardCase {
    fn op(&self) -> &'static str {
        "rmsnorm_backward"
    }

    fn run_cpu(&self) -> Result<Outputs, ShapeError> {
        with_dtype!(self.x.dtype(), T => {
            let (x, w) = (self.x.typed::<T>(OP, "x")?, self.weight.typed::<T>(OP, "weight")?);
            let (mut dx, mut dw) = (x.to_vec(), w.to_vec());
            cpu::rmsnorm_backward(RmsNormBackward::<_, T> {
                params: self.params,
                x,
                weight: w,
                dy: self.dy.typed::<T>(OP, "dy")?,
                rstd: &self.rstd,
                dx: &mut dx,
                dweight: &mut dw,
                accumulate: false,
            })?;
            Ok(vec![
                ("dx", TensorData::from_slice(&dx)),
                ("dweight", TensorData::from_slice(&dw)),
            ])
        })
    }

    fn run_device(&self, s: &Stream) -> Result<Outputs, OpError> {
        with_dtype!(self.x.dtype(), T => {
            let (x, w) = (self.x.typed::<T>(OP, "x")?, self.weight.typed::<T>(OP, "weight")?);
            let (bx, bw, bdy) = (upload(s, x)?, upload(s, w)?, upload(s, self.dy.typed::<T>(OP, "dy")?)?);
            let br = upload(s, &self.rstd)?;
            // Outputs start as NaN: the overwriting backward must never read them.
            let nan = |n| upload(s, &vec![T::from_f64(f64::NAN); n]);
            let (mut dx, mut dw) = (nan(x.len())?, nan(w.len())?);
            ops::rmsnorm_backward(s, RmsNormBackward {
                params: self.params,
                x: &bx,
                weight: &bw,
                dy: &bdy,
                rstd: &br,
                dx: &mut dx,
                dweight: &mut dw,
                accumulate: false,
            })?;
            Ok(vec![("dx", download(s, &dx)?), ("dweight", download(s, &dw)?)])
        })
    }

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
