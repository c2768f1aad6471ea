//! Golden cases of `crossentropy` (the fused classifier) and `linear_crossentropy`.

use super::{
    CrossEntropyParams, LinearCrossEntropy, LinearCrossEntropyParams, SoftmaxCrossEntropy,
    IGNORE_INDEX,
};
use crate::golden::{
    download, download_f32, upload, Case, CaseReader, GoldenCase, GoldenError, GoldenOp, Outputs,
    TensorData, Want,
};
use crate::ops::OpError;
use crate::params::{DType, Element, ShapeError};
use crate::tolerance::{
    linear_crossentropy, softmax_gradient, tolerance, LinearCeBounds, Rule, Tolerance,
};
use crate::{cpu, ops, with_dtype};
use hip_rt::{DeviceBuffer, Stream};
use std::any::Any;

/// The golden ops of this family.
pub(crate) const GOLDEN: &[GoldenOp] = &[
    GoldenOp {
        name: "crossentropy",
        parse,
    },
    GoldenOp {
        name: "linear_crossentropy",
        parse: parse_linear,
    },
];

/// Inputs of a `crossentropy` case.
#[derive(Debug, Clone, PartialEq)]
pub struct CrossEntropyCase {
    /// Dimensions and `dloss`.
    pub params: CrossEntropyParams,
    /// `[rows, padded_vocab]`.
    pub logits: TensorData,
    /// `[rows]`.
    pub targets: Vec<i32>,
    /// Optional `[2]`: what `totals` holds before the call (the case then expects `totals`).
    pub totals: Option<Vec<f32>>,
}

const OP: &str = CrossEntropyParams::OP;

fn parse(r: &mut CaseReader<'_>) -> Result<Case, GoldenError> {
    let vocab = r.meta_u64("vocab")? as usize;
    let dloss = opt_f32(r, "dloss")?;
    let divisor = opt_f32(r, "divisor")?;
    let (dtype, ls) = r.primary("logits")?;
    let [rows, padded_vocab] = ls[..] else {
        return Err(r.shape_err("logits", "[N, Vp]".into(), &ls));
    };
    let logits = r.take("logits", Want::Case, dtype, None)?.data;
    let (_, targets) = r.take_i32("targets", Some(&[rows]))?;
    let totals = take_totals(r, dtype)?;
    let mut outs = vec![
        ("losses", Want::F32, vec![rows]),
        ("loss", Want::F32, vec![1]),
    ];
    if dloss.is_some() {
        outs.push(("dlogits", Want::Case, ls.clone()));
    }
    if totals.is_some() {
        outs.push(("totals", Want::F32, vec![2]));
    }
    let expected = r.expected(&outs, dtype)?;
    let params = CrossEntropyParams {
        rows,
        vocab,
        padded_vocab,
        dloss,
        divisor,
    };
    let case = CrossEntropyCase {
        params,
        logits,
        targets,
        totals,
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
            let mut totals = self.totals.clone().unwrap_or_default();
            cpu::softmax_cross_entropy(SoftmaxCrossEntropy::<_, T> {
                params: self.params,
                logits: &mut logits,
                targets: &self.targets,
                losses: &mut losses,
                loss: Some(&mut loss),
                totals: self.totals.as_ref().map(|_| &mut totals[..]),
                error: None,
            })?;
            let mut out = vec![("losses", TensorData::F32(losses)), ("loss", TensorData::F32(loss.to_vec()))];
            if self.params.dloss.is_some() {
                out.push(("dlogits", TensorData::from_slice(&logits)));
            }
            if self.totals.is_some() {
                out.push(("totals", TensorData::F32(totals)));
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
            let mut totals = match &self.totals {
                Some(t) => Some(DeviceBuffer::from_slice(s, t)?),
                None => None,
            };
            ops::softmax_cross_entropy(s, SoftmaxCrossEntropy {
                params: self.params,
                logits: &mut logits,
                targets: &targets,
                losses: &mut losses,
                loss: Some(&mut loss),
                totals: totals.as_mut().map(|t| t as _),
                error: Some(&mut error),
            })?;
            check_error_flag(s, &error)?;
            let mut out = vec![
                ("losses", TensorData::F32(download_f32(s, &losses)?)),
                ("loss", TensorData::F32(download_f32(s, &loss)?)),
            ];
            if self.params.dloss.is_some() {
                out.push(("dlogits", download(s, &logits)?));
            }
            if let Some(t) = &totals {
                out.push(("totals", TensorData::F32(download_f32(s, t)?)));
            }
            Ok(out)
        })
    }

    fn tolerance(&self, output: &str, dtype: DType) -> Tolerance {
        let p = &self.params;
        let base = tolerance(Rule::Reduction, output, dtype, self.logits.dtype(), p.vocab);
        if output == "dlogits" {
            softmax_gradient(
                dtype,
                p.vocab,
                f64::from(p.dloss.unwrap_or(1.0)).abs() / divisor(p.divisor, &self.targets),
            )
        } else {
            base
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

fn opt_f32(r: &CaseReader<'_>, key: &str) -> Result<Option<f32>, GoldenError> {
    if r.has_meta(key) {
        r.meta_f32(key).map(Some)
    } else {
        Ok(None)
    }
}

/// The optional f32 input `totals` `[2]` (present: the case expects `totals`).
fn take_totals(r: &mut CaseReader<'_>, dtype: DType) -> Result<Option<Vec<f32>>, GoldenError> {
    Ok(r.take_opt("totals", Want::F32, dtype, Some(&[2]))?
        .map(crate::golden::f32s))
}

/// The divisor of the gradient: the given one or the count of counted targets (at least 1).
fn divisor(given: Option<f32>, targets: &[i32]) -> f64 {
    given.map_or_else(
        || {
            targets
                .iter()
                .filter(|&&t| t != IGNORE_INDEX)
                .count()
                .max(1) as f64
        },
        f64::from,
    )
}

fn check_error_flag(s: &Stream, error: &DeviceBuffer<u32>) -> Result<(), OpError> {
    let e = error.to_vec(s)?[0];
    if e != u32::MAX {
        return Err(ShapeError::Invalid {
            op: OP,
            name: "error",
            value: e.to_string(),
            reason: "the device flagged a target the case holds as valid",
        }
        .into());
    }
    Ok(())
}

/// Inputs of a `linear_crossentropy` case.
#[derive(Debug, Clone, PartialEq)]
pub struct LinearCrossEntropyCase {
    /// Dimensions, chunking, `dloss` and divisor.
    pub params: LinearCrossEntropyParams,
    /// `[rows, dim]`.
    pub h: TensorData,
    /// `[vocab, dim]`.
    pub weight: TensorData,
    /// `[rows]`.
    pub targets: Vec<i32>,
    /// Optional `[vocab, dim]`: the gradient of `weight` before the call (absent: a frozen
    /// head, no `dweight`).
    pub dweight: Option<TensorData>,
    /// Optional `[2]`: what `totals` holds before the call.
    pub totals: Option<Vec<f32>>,
}

const LINEAR: &str = LinearCrossEntropyParams::OP;

fn parse_linear(r: &mut CaseReader<'_>) -> Result<Case, GoldenError> {
    let dloss = opt_f32(r, "dloss")?;
    let divisor = opt_f32(r, "divisor")?;
    let chunk_rows = if r.has_meta("chunk_rows") {
        Some(r.meta_u64("chunk_rows")? as usize)
    } else {
        None
    };
    let (dtype, hs) = r.primary("h")?;
    let [rows, dim] = hs[..] else {
        return Err(r.shape_err("h", "[N, C]".into(), &hs));
    };
    let h = r.take("h", Want::Case, dtype, None)?.data;
    let (_, ws) = r.primary("weight")?;
    let [vocab, wdim] = ws[..] else {
        return Err(r.shape_err("weight", format!("[V, {dim}]"), &ws));
    };
    if wdim != dim {
        return Err(r.shape_err("weight", format!("[V, {dim}]"), &ws));
    }
    let weight = r.take("weight", Want::Case, dtype, None)?.data;
    let (_, targets) = r.take_i32("targets", Some(&[rows]))?;
    let dweight = r
        .take_opt("dweight", Want::Case, dtype, Some(&ws))?
        .map(|t| t.data);
    r.presence(
        "dweight",
        dweight.is_some(),
        dweight.is_some() && dloss.is_some(),
    )?;
    let totals = take_totals(r, dtype)?;
    let mut outs = vec![
        ("losses", Want::F32, vec![rows]),
        ("loss", Want::F32, vec![1]),
    ];
    if dloss.is_some() {
        outs.push(("dh", Want::Case, hs.clone()));
    }
    if dweight.is_some() {
        outs.push(("dweight", Want::Case, ws.clone()));
    }
    if totals.is_some() {
        outs.push(("totals", Want::F32, vec![2]));
    }
    let expected = r.expected(&outs, dtype)?;
    let params = LinearCrossEntropyParams {
        rows,
        dim,
        vocab,
        chunk_rows,
        dloss,
        divisor,
    };
    let case = LinearCrossEntropyCase {
        params,
        h,
        weight,
        targets,
        dweight,
        totals,
    };
    Ok(r.finish(dtype, Box::new(case), expected))
}

impl LinearCrossEntropyCase {
    /// The magnitudes [`linear_crossentropy`]'s tolerance needs (the largest logit in f64:
    /// `N·V·C` products, as the CPU reference).
    pub fn bounds(&self) -> LinearCeBounds {
        let p = &self.params;
        let wide = |t: &TensorData| {
            (0..t.len())
                .filter_map(|i| t.get_f64(i))
                .collect::<Vec<_>>()
        };
        let (h, w) = (wide(&self.h), wide(&self.weight));
        let c = p.dim.max(1);
        let mut logit_max = 0.0f64;
        for hi in h.chunks_exact(c) {
            for wj in w.chunks_exact(c) {
                let x: f64 = hi.iter().zip(wj).map(|(a, b)| a * b).sum();
                logit_max = logit_max.max(x.abs());
            }
        }
        let max = |v: &[f64]| v.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        LinearCeBounds {
            rows: p.rows,
            dim: p.dim,
            vocab: p.vocab,
            scale: f64::from(p.dloss.unwrap_or(1.0)).abs() / divisor(p.divisor, &self.targets),
            logit_max,
            h_max: max(&h),
            w_max: max(&w),
        }
    }
}

impl GoldenCase for LinearCrossEntropyCase {
    fn op(&self) -> &'static str {
        LINEAR
    }

    fn run_cpu(&self) -> Result<Outputs, ShapeError> {
        let p = self.params;
        with_dtype!(self.h.dtype(), T => {
            let mut dh = vec![T::from_f64(0.0); if p.dloss.is_some() { p.rows * p.dim } else { 0 }];
            let mut dweight = match &self.dweight {
                Some(d) => d.typed::<T>(LINEAR, "dweight")?.to_vec(),
                None => Vec::new(),
            };
            let mut losses = vec![0.0f32; p.rows];
            let mut loss = [0.0f32];
            let mut totals = self.totals.clone().unwrap_or_default();
            cpu::linear_cross_entropy(LinearCrossEntropy::<_, T> {
                params: p,
                h: self.h.typed::<T>(LINEAR, "h")?,
                weight: self.weight.typed::<T>(LINEAR, "weight")?,
                targets: &self.targets,
                dh: p.dloss.map(|_| &mut dh[..]),
                dweight: self.dweight.as_ref().map(|_| &mut dweight[..]),
                losses: &mut losses,
                loss: Some(&mut loss),
                totals: self.totals.as_ref().map(|_| &mut totals[..]),
                error: None,
            })?;
            let mut out = vec![("losses", TensorData::F32(losses)), ("loss", TensorData::F32(loss.to_vec()))];
            if p.dloss.is_some() {
                out.push(("dh", TensorData::from_slice(&dh)));
            }
            if self.dweight.is_some() {
                out.push(("dweight", TensorData::from_slice(&dweight)));
            }
            if self.totals.is_some() {
                out.push(("totals", TensorData::F32(totals)));
            }
            Ok(out)
        })
    }

    fn run_device(&self, s: &Stream) -> Result<Outputs, OpError> {
        let p = self.params;
        with_dtype!(self.h.dtype(), T => {
            let h = upload(s, self.h.typed::<T>(LINEAR, "h")?)?;
            let weight = upload(s, self.weight.typed::<T>(LINEAR, "weight")?)?;
            let targets = DeviceBuffer::from_slice(s, &self.targets)?;
            let mut dh = match p.dloss {
                Some(_) => Some(DeviceBuffer::<T>::zeroed(s, p.rows * p.dim)?),
                None => None,
            };
            let mut dweight = match &self.dweight {
                Some(d) => Some(upload(s, d.typed::<T>(LINEAR, "dweight")?)?),
                None => None,
            };
            let mut losses = DeviceBuffer::<f32>::zeroed(s, p.rows)?;
            let mut loss = DeviceBuffer::<f32>::zeroed(s, 1)?;
            let mut totals = match &self.totals {
                Some(t) => Some(DeviceBuffer::from_slice(s, t)?),
                None => None,
            };
            let mut error = DeviceBuffer::<u32>::zeroed(s, 1)?;
            ops::linear_cross_entropy(s, LinearCrossEntropy {
                params: p,
                h: &h,
                weight: &weight,
                targets: &targets,
                dh: dh.as_mut().map(|d| d as _),
                dweight: dweight.as_mut().map(|d| d as _),
                losses: &mut losses,
                loss: Some(&mut loss),
                totals: totals.as_mut().map(|t| t as _),
                error: Some(&mut error),
            })?;
            check_error_flag(s, &error)?;
            let mut out = vec![
                ("losses", TensorData::F32(download_f32(s, &losses)?)),
                ("loss", TensorData::F32(download_f32(s, &loss)?)),
            ];
            if let Some(d) = &dh {
                out.push(("dh", download(s, d)?));
            }
            if let Some(d) = &dweight {
                out.push(("dweight", download(s, d)?));
            }
            if let Some(t) = &totals {
                out.push(("totals", TensorData::F32(download_f32(s, t)?)));
            }
            Ok(out)
        })
    }

    fn tolerance(&self, output: &str, dtype: DType) -> Tolerance {
        linear_crossentropy(output, dtype, self.h.dtype(), &self.bounds())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
