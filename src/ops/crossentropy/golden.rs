//! Golden cases of `crossentropy` (the fused classifier) and `linear_crossentropy`.

use super::{
    CrossEntropyParams, LinearCrossEntropy, LinearCrossEntropyParams, SoftmaxCrossEntropy,
    IGNORE_INDEX,
};
use crate::golden::{
    Case, CaseReader, GoldenCase, GoldenError, GoldenOp, GoldenSpace, Outputs, TensorData, Want,
};
use crate::ops::{OpError, Run};
use crate::params::{DType, ShapeError};
use crate::tolerance::{
    linear_crossentropy, softmax_gradient, tolerance, LinearCeBounds, Rule, Tolerance,
};
use crate::{golden_runs, with_dtype};
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

impl CrossEntropyCase {
    fn run<S: GoldenSpace>(&self, q: S::Queue<'_>) -> Result<Outputs, OpError> {
        with_dtype!(self.logits.dtype(), T => {
            let mut logits = S::typed::<T>(q, &self.logits, OP, "logits")?;
            let targets = S::upload(q, &self.targets)?;
            let mut losses = S::zeros::<f32>(q, self.params.rows)?;
            let mut loss = S::zeros::<f32>(q, 1)?;
            let mut error = S::upload(q, &[u32::MAX])?;
            let mut totals = self.totals.as_ref().map(|t| S::upload(q, t)).transpose()?;
            SoftmaxCrossEntropy::<S, T> {
                params: self.params,
                logits: S::output(&mut logits),
                targets: S::input(&targets),
                losses: S::output(&mut losses),
                loss: Some(S::output(&mut loss)),
                totals: totals.as_mut().map(S::output),
                error: Some(S::output(&mut error)),
            }
            .run(q)?;
            check_error_flag::<S>(q, &error)?;
            let mut out = vec![("losses", S::tensor(q, &losses)?), ("loss", S::tensor(q, &loss)?)];
            if self.params.dloss.is_some() {
                out.push(("dlogits", S::tensor(q, &logits)?));
            }
            if let Some(t) = &totals {
                out.push(("totals", S::tensor(q, t)?));
            }
            Ok(out)
        })
    }
}

impl GoldenCase for CrossEntropyCase {
    fn op(&self) -> &'static str {
        "crossentropy"
    }

    golden_runs!();

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

fn check_error_flag<S: GoldenSpace>(q: S::Queue<'_>, error: &S::Buf<u32>) -> Result<(), OpError> {
    let e = S::download(q, error)?[0];
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

impl LinearCrossEntropyCase {
    fn run<S: GoldenSpace>(&self, q: S::Queue<'_>) -> Result<Outputs, OpError> {
        let p = self.params;
        with_dtype!(self.h.dtype(), T => {
            let h = S::typed::<T>(q, &self.h, LINEAR, "h")?;
            let weight = S::typed::<T>(q, &self.weight, LINEAR, "weight")?;
            let targets = S::upload(q, &self.targets)?;
            let mut dh = p.dloss.map(|_| S::zeros::<T>(q, p.rows * p.dim)).transpose()?;
            let mut dweight = self.dweight.as_ref().map(|d| S::typed::<T>(q, d, LINEAR, "dweight")).transpose()?;
            let mut losses = S::zeros::<f32>(q, p.rows)?;
            let mut loss = S::zeros::<f32>(q, 1)?;
            let mut totals = self.totals.as_ref().map(|t| S::upload(q, t)).transpose()?;
            let mut error = S::upload(q, &[u32::MAX])?;
            LinearCrossEntropy::<S, T> {
                params: p,
                h: S::input(&h),
                weight: S::input(&weight),
                targets: S::input(&targets),
                dh: dh.as_mut().map(S::output),
                dweight: dweight.as_mut().map(S::output),
                losses: S::output(&mut losses),
                loss: Some(S::output(&mut loss)),
                totals: totals.as_mut().map(S::output),
                error: Some(S::output(&mut error)),
            }
            .run(q)?;
            check_error_flag::<S>(q, &error)?;
            let mut out = vec![("losses", S::tensor(q, &losses)?), ("loss", S::tensor(q, &loss)?)];
            if let Some(d) = &dh {
                out.push(("dh", S::tensor(q, d)?));
            }
            if let Some(d) = &dweight {
                out.push(("dweight", S::tensor(q, d)?));
            }
            if let Some(t) = &totals {
                out.push(("totals", S::tensor(q, t)?));
            }
            Ok(out)
        })
    }
}

impl GoldenCase for LinearCrossEntropyCase {
    fn op(&self) -> &'static str {
        LINEAR
    }

    golden_runs!();

    fn tolerance(&self, output: &str, dtype: DType) -> Tolerance {
        linear_crossentropy(output, dtype, self.h.dtype(), &self.bounds())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
