//! Golden cases of `adamw`: parsing and running them.

use super::{AdamW, AdamWParams, AdamWTensor};
use crate::golden::{
    download, download_f32, f32s, upload, Case, CaseReader, GoldenCase, GoldenError, GoldenOp,
    Outputs, TensorData, Want,
};
use crate::ops::OpError;
use crate::params::{DType, ShapeError};
use crate::tolerance::{tolerance, Rule, Tolerance};
use crate::{cpu, ops, with_dtype};
use hip_rt::Stream;
use std::any::Any;

/// The golden ops of this family.
pub(crate) const GOLDEN: &[GoldenOp] = &[GoldenOp {
    name: "adamw",
    parse,
}];

/// Inputs of an `adamw` case.
#[derive(Debug, Clone, PartialEq)]
pub struct AdamWCase {
    /// Hyper-parameters and step.
    pub params: AdamWParams,
    /// The loss scaler's scale (gradients are divided by it), if any.
    pub grad_scale: Option<f32>,
    /// A non-finite gradient was found: nothing changes.
    pub found_inf: bool,
    /// Parameters (any shape, flattened).
    pub param: TensorData,
    /// Gradients (param dtype).
    pub grad: TensorData,
    /// First moment.
    pub exp_avg: Vec<f32>,
    /// Second moment.
    pub exp_avg_sq: Vec<f32>,
    /// Running max of the second moment, present iff amsgrad.
    pub max_exp_avg_sq: Option<Vec<f32>>,
}

const OP: &str = AdamWParams::OP;

fn parse(r: &mut CaseReader<'_>) -> Result<Case, GoldenError> {
    let mut params = AdamWParams {
        lr: r.meta_f64("lr")?,
        beta1: r.meta_f64("beta1")?,
        beta2: r.meta_f64("beta2")?,
        eps: r.meta_f64("eps")?,
        weight_decay: r.meta_f64("weight_decay")?,
        maximize: r.meta_bool("maximize")?,
        amsgrad: r.meta_bool("amsgrad")?,
        step: 1,
    };
    let grad_scale = if r.has_meta("grad_scale") {
        Some(r.meta_f32("grad_scale")?)
    } else {
        None
    };
    params.step = r.meta_u64("step")?;
    let found_inf = r.meta_bool("found_inf")?;
    let (dtype, shape) = r.primary("param")?;
    let param = r.take("param", Want::Case, dtype, None)?.data;
    let grad = r.take("grad", Want::Case, dtype, Some(&shape))?.data;
    let exp_avg = f32s(r.take("exp_avg", Want::F32, dtype, Some(&shape))?);
    let exp_avg_sq = f32s(r.take("exp_avg_sq", Want::F32, dtype, Some(&shape))?);
    let max_exp_avg_sq = r
        .take_opt("max_exp_avg_sq", Want::F32, dtype, Some(&shape))?
        .map(f32s);
    r.presence("max_exp_avg_sq", max_exp_avg_sq.is_some(), params.amsgrad)?;
    let mut outs = vec![
        ("param", Want::Case, shape.clone()),
        ("exp_avg", Want::F32, shape.clone()),
        ("exp_avg_sq", Want::F32, shape.clone()),
    ];
    if params.amsgrad {
        outs.push(("max_exp_avg_sq", Want::F32, shape));
    }
    let expected = r.expected(&outs, dtype)?;
    let case = AdamWCase {
        params,
        grad_scale,
        found_inf,
        param,
        grad,
        exp_avg,
        exp_avg_sq,
        max_exp_avg_sq,
    };
    Ok(r.finish(dtype, Box::new(case), expected))
}

impl AdamWCase {
    /// `found_inf` as the one-element tensor the op takes.
    fn found_inf_tensor(&self) -> [f32; 1] {
        [if self.found_inf { 1.0 } else { 0.0 }]
    }

    /// The updated tensors, in the schema's order.
    fn outputs(
        &self,
        param: TensorData,
        exp_avg: Vec<f32>,
        exp_avg_sq: Vec<f32>,
        max_sq: Option<Vec<f32>>,
    ) -> Outputs {
        let mut v = vec![
            ("param", param),
            ("exp_avg", TensorData::F32(exp_avg)),
            ("exp_avg_sq", TensorData::F32(exp_avg_sq)),
        ];
        v.extend(max_sq.map(|m| ("max_exp_avg_sq", TensorData::F32(m))));
        v
    }
}

impl GoldenCase for AdamWCase {
    fn op(&self) -> &'static str {
        OP
    }

    fn run_cpu(&self) -> Result<Outputs, ShapeError> {
        let (scale, found_inf) = (self.grad_scale.map(|s| [s]), self.found_inf_tensor());
        with_dtype!(self.param.dtype(), T => {
            let mut param = self.param.typed::<T>(OP, "param")?.to_vec();
            let (mut exp_avg, mut exp_avg_sq, mut max_sq) = (self.exp_avg.clone(), self.exp_avg_sq.clone(), self.max_exp_avg_sq.clone());
            cpu::adamw(AdamW {
                params: self.params,
                grad_scale: scale.as_ref().map(|s| &s[..]),
                found_inf: Some(&found_inf),
                tensors: &mut [AdamWTensor {
                    param: &mut param,
                    grad: self.grad.typed::<T>(OP, "grad")?,
                    exp_avg: &mut exp_avg,
                    exp_avg_sq: &mut exp_avg_sq,
                    max_exp_avg_sq: max_sq.as_deref_mut(),
                    master: None,
                    weight_decay: None,
                    lr_scale: None,
                }],
            })?;
            Ok(self.outputs(TensorData::from_slice(&param), exp_avg, exp_avg_sq, max_sq))
        })
    }

    fn run_device(&self, s: &Stream) -> Result<Outputs, OpError> {
        let scale = self.grad_scale.map(|g| upload(s, &[g])).transpose()?;
        let found_inf = upload(s, &self.found_inf_tensor())?;
        with_dtype!(self.param.dtype(), T => {
            let mut param = upload(s, self.param.typed::<T>(OP, "param")?)?;
            let grad = upload(s, self.grad.typed::<T>(OP, "grad")?)?;
            let (mut m, mut v) = (upload(s, &self.exp_avg)?, upload(s, &self.exp_avg_sq)?);
            let mut vmax = self.max_exp_avg_sq.as_ref().map(|x| upload(s, x)).transpose()?;
            ops::adamw(s, AdamW {
                params: self.params,
                grad_scale: scale.as_ref().map(|b| b as _),
                found_inf: Some(&found_inf),
                tensors: &mut [AdamWTensor {
                    param: &mut param,
                    grad: &grad,
                    exp_avg: &mut m,
                    exp_avg_sq: &mut v,
                    max_exp_avg_sq: vmax.as_mut().map(|b| b as _),
                    master: None,
                    weight_decay: None,
                    lr_scale: None,
                }],
            })?;
            let max_sq = vmax.as_ref().map(|b| download_f32(s, b)).transpose()?;
            Ok(self.outputs(download(s, &param)?, download_f32(s, &m)?, download_f32(s, &v)?, max_sq))
        })
    }

    fn tolerance(&self, output: &str, dtype: DType) -> Tolerance {
        tolerance(Rule::Optimizer, output, dtype, self.param.dtype(), 1)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
