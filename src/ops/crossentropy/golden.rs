//! Golden cases of `crossentropy` (the fused classifier).

use super::{CrossEntropyParams, SoftmaxCrossEntropy, IGNORE_INDEX};
use crate::golden::{
    download, download_f32, upload, Case, CaseReader, GoldenCase, GoldenError, GoldenOp, Outputs,
    TensorData, Want,
};
use crate::ops::OpError;
use crate::params::{DType, ShapeError};
use crate::tolerance::{softmax_gradient, tolerance, Rule, Tolerance};
use crate::{cpu, ops, with_dtype};
use hip_rt::{DeviceBuffer, Stream};
use std::any::Any;

/// The golden ops of this family.
pub(crate) const GOLDEN: &[GoldenOp] = &[GoldenOp {
    name: "crossentropy",
    parse,
}];

/// Inputs of a `crossentropy` case.
#[derive(Debug, Clone, PartialEq)]
pub struct CrossEntropyCase {
    /// Dimensions and `dloss`.
    pub params: CrossEntropyParams,
    /// `[rows, padded_vocab]`.
    pub logits: TensorData,
    /// `[rows]`.
    pub targets: Vec<i32>,
}

const OP: &str = CrossEntropyParams::OP;

fn parse(r: &mut CaseReader<'_>) -> Result<Case, GoldenError> {
    let vocab = r.meta_u64("vocab")? as usize;
    let dloss = if r.has_meta("dloss") {
        Some(r.meta_f32("dloss")?)
    } else {
        None
    };
    let (dtype, ls) = r.primary("logits")?;
    let [rows, padded_vocab] = ls[..] else {
        return Err(r.shape_err("logits", "[N, Vp]".into(), &ls));
    };
    let logits = r.take("logits", Want::Case, dtype, None)?.data;
    let (_, targets) = r.take_i32("targets", Some(&[rows]))?;
    let mut outs = vec![
        ("losses", Want::F32, vec![rows]),
        ("loss", Want::F32, vec![1]),
    ];
    if dloss.is_some() {
        outs.push(("dlogits", Want::Case, ls.clone()));
    }
    let expected = r.expected(&outs, dtype)?;
    let params = CrossEntropyParams {
        rows,
        vocab,
        padded_vocab,
        dloss,
    };
    let case = CrossEntropyCase {
        params,
        logits,
        targets,
    };
    Ok(r.finish(dtype, Box::new(case), expected))
}

impl GoldenCase for CrossEntropyCase {
    fn op(&self) -> &'static str {
        "crossentropy"
    }

    fn run_cpu(&self) -> Result<Outputs, ShapeError> {
        with_dtype!(self.logits.dtype(), T => {
            let mut logits = self.logits.typed::<T>(OP, "logits")?.to_vec();
            let mut losses = vec![0.0f32; self.params.rows];
            let mut loss = [0.0f32];
            cpu::softmax_cross_entropy(SoftmaxCrossEntropy::<_, T> {
                params: self.params,
                logits: &mut logits,
                targets: &self.targets,
                losses: &mut losses,
                loss: Some(&mut loss),
                error: None,
            })?;
            let mut out = vec![("losses", TensorData::F32(losses)), ("loss", TensorData::F32(loss.to_vec()))];
            if self.params.dloss.is_some() {
                out.push(("dlogits", TensorData::from_slice(&logits)));
            }
            Ok(out)
        })
    }

    fn run_device(&self, s: &Stream) -> Result<Outputs, OpError> {
        with_dtype!(self.logits.dtype(), T => {
            let mut logits = upload(s, self.logits.typed::<T>(OP, "logits")?)?;
            let targets = DeviceBuffer::from_slice(s, &self.targets)?;
            let mut losses = DeviceBuffer::<f32>::zeroed(s, self.params.rows)?;
            let mut loss = DeviceBuffer::<f32>::zeroed(s, 1)?;
            let mut error = DeviceBuffer::<u32>::zeroed(s, 1)?;
            ops::softmax_cross_entropy(s, SoftmaxCrossEntropy {
                params: self.params,
                logits: &mut logits,
                targets: &targets,
                losses: &mut losses,
                loss: Some(&mut loss),
                error: Some(&mut error),
            })?;
            let e = error.to_vec(s)?[0];
            if e != u32::MAX {
                return Err(ShapeError::Invalid { op: OP, name: "error", value: e.to_string(), reason: "the device flagged a target the case holds as valid" }.into());
            }
            let mut out = vec![
                ("losses", TensorData::F32(download_f32(s, &losses)?)),
                ("loss", TensorData::F32(download_f32(s, &loss)?)),
            ];
            if self.params.dloss.is_some() {
                out.push(("dlogits", download(s, &logits)?));
            }
            Ok(out)
        })
    }

    fn tolerance(&self, output: &str, dtype: DType) -> Tolerance {
        let p = &self.params;
        let base = tolerance(Rule::Reduction, output, dtype, self.logits.dtype(), p.vocab);
        if output == "dlogits" {
            let n = self
                .targets
                .iter()
                .filter(|&&t| t != IGNORE_INDEX)
                .count()
                .max(1);
            softmax_gradient(
                dtype,
                p.vocab,
                f64::from(p.dloss.unwrap_or(1.0)).abs() / n as f64,
            )
        } else {
            base
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
