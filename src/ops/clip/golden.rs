//! Golden cases of `clip` (AdamW's grad_scale from the gradient norm).

use super::{ClipGradScale, ClipParams};
use crate::golden::{
    f32s, Case, CaseReader, GoldenCase, GoldenError, GoldenOp, GoldenSpace, Outputs, TensorData,
    Want,
};
use crate::golden_runs;
use crate::ops::{OpError, Run};
use crate::params::DType;
use crate::tolerance::{tolerance, Rule, Tolerance};
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

impl ClipCase {
    fn run<S: GoldenSpace>(&self, q: S::Queue<'_>) -> Result<Outputs, OpError> {
        let norm = S::upload(q, &[self.norm])?;
        let scale = S::upload(q, &[self.loss_scale])?;
        let mut g = S::zeros::<f32>(q, 1)?;
        ClipGradScale::<S> {
            params: self.params,
            norm: S::input(&norm),
            loss_scale: Some(S::input(&scale)),
            grad_scale: S::output(&mut g),
        }
        .run(q)?;
        let grad_scale = S::download(q, &g)?;
        // The coefficient is not an output of the op: the result implies it.
        let coef = f64::from(self.loss_scale) / f64::from(grad_scale[0]);
        Ok(vec![
            ("coefficient", TensorData::F32(vec![coef as f32])),
            ("grad_scale", TensorData::F32(grad_scale)),
        ])
    }
}

impl GoldenCase for ClipCase {
    fn op(&self) -> &'static str {
        "clip"
    }

    golden_runs!();

    fn tolerance(&self, output: &str, dtype: DType) -> Tolerance {
        tolerance(Rule::Reduction, output, dtype, DType::F32, 1)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
