//! Golden cases of `layernorm_forward` and `layernorm_backward`: parsing and running them.

use super::{LayerNormBackward, LayerNormForward, LayerNormParams};
use crate::golden::{
    download, download_f32, f32s, upload, Case, CaseReader, GoldenCase, GoldenError, GoldenOp,
    Outputs, TensorData, Want,
};
use crate::ops::OpError;
use crate::params::{DType, ShapeError};
use crate::tolerance::{tolerance, Rule, Tolerance};
use crate::{cpu, ops, with_dtype};
use hip_rt::{DeviceBuffer, Stream};
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

impl GoldenCase for LayerNormForwardCase {
    fn op(&self) -> &'static str {
        "layernorm_forward"
    }

    fn run_cpu(&self) -> Result<Outputs, ShapeError> {
        let rows = self.params.rows;
        with_dtype!(self.x.dtype(), T => {
            let x = self.x.typed::<T>(OP, "x")?;
            let mut y = x.to_vec();
            let (mut mean, mut rstd) = (vec![0.0; rows], vec![0.0; rows]);
            cpu::layernorm_forward(LayerNormForward::<_, T> {
                params: self.params,
                x,
                weight: self.weight.typed::<T>(OP, "weight")?,
                bias: self.bias.typed::<T>(OP, "bias")?,
                y: &mut y,
                mean: &mut mean,
                rstd: &mut rstd,
            })?;
            Ok(vec![
                ("y", TensorData::from_slice(&y)),
                ("mean", TensorData::F32(mean)),
                ("rstd", TensorData::F32(rstd)),
            ])
        })
    }

    fn run_device(&self, s: &Stream) -> Result<Outputs, OpError> {
        let rows = self.params.rows;
        with_dtype!(self.x.dtype(), T => {
            let x = self.x.typed::<T>(OP, "x")?;
            let (w, b) = (self.weight.typed::<T>(OP, "weight")?, self.bias.typed::<T>(OP, "bias")?);
            let (dx, dw, db) = (upload(s, x)?, upload(s, w)?, upload(s, b)?);
            let mut y = DeviceBuffer::<T>::zeroed(s, x.len())?;
            let mut mean = DeviceBuffer::<f32>::zeroed(s, rows)?;
            let mut rstd = DeviceBuffer::<f32>::zeroed(s, rows)?;
            ops::layernorm_forward(s, LayerNormForward {
                params: self.params,
                x: &dx,
                weight: &dw,
                bias: &db,
                y: &mut y,
                mean: &mut mean,
                rstd: &mut rstd,
            })?;
            Ok(vec![
                ("y", download(s, &y)?),
                ("mean", TensorData::F32(download_f32(s, &mean)?)),
                ("rstd", TensorData::F32(download_f32(s, &rstd)?)),
            ])
        })
    }

    fn tolerance(&self, output: &str, dtype: DType) -> Tolerance {
        let input = self.x.dtype();
        tolerance(Rule::Reduction, output, dtype, input, self.params.cols)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl GoldenCase for LayerNormBackwardCase {
    fn op(&self) -> &'static str {
        "layernorm_backward"
    }

    fn run_cpu(&self) -> Result<Outputs, ShapeError> {
        with_dtype!(self.x.dtype(), T => {
            let (x, w) = (self.x.typed::<T>(OP, "x")?, self.weight.typed::<T>(OP, "weight")?);
            let (mut dx, mut dw, mut db) = (x.to_vec(), w.to_vec(), w.to_vec());
            cpu::layernorm_backward(LayerNormBackward::<_, T> {
                params: self.params,
                x,
                weight: w,
                dy: self.dy.typed::<T>(OP, "dy")?,
                mean: &self.mean,
                rstd: &self.rstd,
                dx: &mut dx,
                dweight: &mut dw,
                dbias: &mut db,
                accumulate: false,
            })?;
            Ok(vec![
                ("dx", TensorData::from_slice(&dx)),
                ("dweight", TensorData::from_slice(&dw)),
                ("dbias", TensorData::from_slice(&db)),
            ])
        })
    }

    fn run_device(&self, s: &Stream) -> Result<Outputs, OpError> {
        with_dtype!(self.x.dtype(), T => {
            let (x, w) = (self.x.typed::<T>(OP, "x")?, self.weight.typed::<T>(OP, "weight")?);
            let (bx, bw, bdy) = (upload(s, x)?, upload(s, w)?, upload(s, self.dy.typed::<T>(OP, "dy")?)?);
            let (bm, br) = (upload(s, &self.mean)?, upload(s, &self.rstd)?);
            // Outputs start as NaN: the overwriting backward must never read them.
            let nan = |n| upload(s, &vec![<T as crate::params::Element>::from_f64(f64::NAN); n]);
            let (mut dx, mut dw, mut db) = (nan(x.len())?, nan(w.len())?, nan(w.len())?);
            ops::layernorm_backward(s, LayerNormBackward {
                params: self.params,
                x: &bx,
                weight: &bw,
                dy: &bdy,
                mean: &bm,
                rstd: &br,
                dx: &mut dx,
                dweight: &mut dw,
                dbias: &mut db,
                accumulate: false,
            })?;
            Ok(vec![
                ("dx", download(s, &dx)?),
                ("dweight", download(s, &dw)?),
                ("dbias", download(s, &db)?),
            ])
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
