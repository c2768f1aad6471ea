//! Golden cases of `adamw`: parsing and running them.

use super::{AdamW, AdamWParams, AdamWTensor};
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

impl AdamWCase {
    fn run<S: GoldenSpace>(&self, q: S::Queue<'_>) -> Result<Outputs, OpError> {
        let scale = self.grad_scale.map(|g| S::upload(q, &[g])).transpose()?;
        let found_inf = S::upload(q, &self.found_inf_tensor())?;
        with_dtype!(self.param.dtype(), T => {
            let mut param = S::typed::<T>(q, &self.param, OP, "param")?;
            let grad = S::typed::<T>(q, &self.grad, OP, "grad")?;
            let (mut m, mut v) = (S::upload(q, &self.exp_avg)?, S::upload(q, &self.exp_avg_sq)?);
            let mut vmax = self.max_exp_avg_sq.as_ref().map(|x| S::upload(q, x)).transpose()?;
            AdamW::<S, T> {
                params: self.params,
                grad_scale: scale.as_ref().map(S::input),
                found_inf: Some(S::input(&found_inf)),
                tensors: &mut [AdamWTensor {
                    param: S::output(&mut param),
                    grad: S::input(&grad),
                    exp_avg: S::output(&mut m),
                    exp_avg_sq: S::output(&mut v),
                    max_exp_avg_sq: vmax.as_mut().map(S::output),
                    master: None,
                    weight_decay: None,
                    lr_scale: None,
                }],
            }
            .run(q)?;
            let max_sq = vmax.as_ref().map(|b| S::download(q, b)).transpose()?;
            Ok(self.outputs(S::tensor(q, &param)?, S::download(q, &m)?, S::download(q, &v)?, max_sq))
        })
    }
}

impl GoldenCase for AdamWCase {
    fn op(&self) -> &'static str {
        OP
    }

    golden_runs!();

    fn tolerance(&self, output: &str, dtype: DType) -> Tolerance {
        tolerance(Rule::Optimizer, output, dtype, self.param.dtype(), 1)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
