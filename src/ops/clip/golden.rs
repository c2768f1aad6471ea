//! Golden cases of `clip` (AdamW's grad_scale from the gradient norm).

use super::{ClipGradScale, ClipParams};
use crate::golden::{
    download_f32, f32s, upload, Case, CaseReader, GoldenCase, GoldenError, GoldenOp, Outputs,
    TensorData, Want,
};
use crate::ops::OpError;
use crate::params::{DType, ShapeError};
use crate::tolerance::{tolerance, Rule, Tolerance};
use crate::{cpu, ops};
use hip_rt::{DeviceBuffer, Stream};
use std::any::Any;

/// The golden ops of this family.
pub(crate) const GOLDEN: &[GoldenOp] = &[GoldenOp {
    name: "clip",
    parse,
}];

/// Inputs of a `clip` case.
#[derive(Debug, Clone, PartialEq)]
pub struct ClipCase {
    /// `max_norm`.
    pub params: ClipParams,
    /// The gradients' norm as stored (times `loss_scale`).
    pub norm: f32,
    /// The loss scale the gradients carry.
    pub loss_scale: f32,
}

fn parse(r: &mut CaseReader<'_>) -> Result<Case, GoldenError> {
    let max_norm = r.meta_f32("max_norm")?;
    let loss_scale = r.meta_f32("loss_scale")?;
    let norm = f32s(r.take("norm", Want::F32, DType::F32, Some(&[1]))?)[0];
    let expected = r.expected(
        &[
            ("coefficient", Want::F32, vec![1]),
            ("grad_scale", Want::F32, vec![1]),
        ],
        DType::F32,
    )?;
    let case = ClipCase {
        params: ClipParams { max_norm },
        norm,
        loss_scale,
    };
    Ok(r.finish(DType::F32, Box::new(case), expected))
}

impl GoldenCase for ClipCase {
    fn op(&self) -> &'static str {
        "clip"
    }

    fn run_cpu(&self) -> Result<Outputs, ShapeError> {
        let s = f64::from(self.loss_scale);
        let coef =
            cpu::clip_coefficient(f64::from(self.norm) / s, f64::from(self.params.max_norm))?;
        let mut g = [0.0f32];
        cpu::clip_grad_scale(ClipGradScale {
            params: self.params,
            norm: &[self.norm],
            loss_scale: Some(&[self.loss_scale]),
            grad_scale: &mut g,
        })?;
        Ok(vec![
            ("coefficient", TensorData::F32(vec![coef as f32])),
            ("grad_scale", TensorData::F32(g.to_vec())),
        ])
    }

    fn run_device(&self, s: &Stream) -> Result<Outputs, OpError> {
        let norm = upload(s, &[self.norm])?;
        let scale = upload(s, &[self.loss_scale])?;
        let mut g = DeviceBuffer::<f32>::zeroed(s, 1)?;
        ops::clip_grad_scale(
            s,
            ClipGradScale {
                params: self.params,
                norm: &norm,
                loss_scale: Some(&scale),
                grad_scale: &mut g,
            },
        )?;
        let grad_scale = download_f32(s, &g)?;
        // The coefficient is not a device output: the device result implies it.
        let coef = f64::from(self.loss_scale) / f64::from(grad_scale[0]);
        Ok(vec![
            ("coefficient", TensorData::F32(vec![coef as f32])),
            ("grad_scale", TensorData::F32(grad_scale)),
        ])
    }

    fn tolerance(&self, output: &str, dtype: DType) -> Tolerance {
        tolerance(Rule::Reduction, output, dtype, DType::F32, 1)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
