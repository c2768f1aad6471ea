//! Golden cases of `residual_layernorm_forward`.

use super::{LayerNormParams, ResidualLayerNormForward};
use crate::golden::{
    download, download_f32, upload, Case, CaseReader, GoldenCase, GoldenError, Outputs, TensorData,
    Want,
};
use crate::ops::OpError;
use crate::params::{DType, ShapeError};
use crate::tolerance::{tolerance, Rule, Tolerance};
use crate::{cpu, ops, with_dtype};
use hip_rt::{DeviceBuffer, Stream};
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

impl GoldenCase for ResidualLayerNormCase {
    fn op(&self) -> &'static str {
        "residual_layernorm_forward"
    }

    fn run_cpu(&self) -> Result<Outputs, ShapeError> {
        let rows = self.params.rows;
        with_dtype!(self.a.dtype(), T => {
            let a = self.a.typed::<T>(OP, "a")?;
            let (mut x, mut y) = (a.to_vec(), a.to_vec());
            let (mut mean, mut rstd) = (vec![0.0; rows], vec![0.0; rows]);
            cpu::residual_layernorm_forward(ResidualLayerNormForward::<_, T> {
                params: self.params,
                a,
                b: self.b.typed::<T>(OP, "b")?,
                weight: self.weight.typed::<T>(OP, "weight")?,
                bias: self.bias.typed::<T>(OP, "bias")?,
                residual: &mut x,
                y: &mut y,
                mean: &mut mean,
                rstd: &mut rstd,
            })?;
            Ok(vec![
                ("residual", TensorData::from_slice(&x)),
                ("y", TensorData::from_slice(&y)),
                ("mean", TensorData::F32(mean)),
                ("rstd", TensorData::F32(rstd)),
            ])
        })
    }

    fn run_device(&self, s: &Stream) -> Result<Outputs, OpError> {
        let rows = self.params.rows;
        with_dtype!(self.a.dtype(), T => {
            let a = self.a.typed::<T>(OP, "a")?;
            let (da, db) = (upload(s, a)?, upload(s, self.b.typed::<T>(OP, "b")?)?);
            let (dw, dbias) = (upload(s, self.weight.typed::<T>(OP, "weight")?)?, upload(s, self.bias.typed::<T>(OP, "bias")?)?);
            let mut x = DeviceBuffer::<T>::zeroed(s, a.len())?;
            let mut y = DeviceBuffer::<T>::zeroed(s, a.len())?;
            let mut mean = DeviceBuffer::<f32>::zeroed(s, rows)?;
            let mut rstd = DeviceBuffer::<f32>::zeroed(s, rows)?;
            ops::residual_layernorm_forward(s, ResidualLayerNormForward {
                params: self.params,
                a: &da,
                b: &db,
                weight: &dw,
                bias: &dbias,
                residual: &mut x,
                y: &mut y,
                mean: &mut mean,
                rstd: &mut rstd,
            })?;
            Ok(vec![
                ("residual", download(s, &x)?),
                ("y", download(s, &y)?),
                ("mean", TensorData::F32(download_f32(s, &mean)?)),
                ("rstd", TensorData::F32(download_f32(s, &rstd)?)),
            ])
        })
    }

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
