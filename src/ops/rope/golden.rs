//! Golden cases of `rope_forward` and `rope_backward`: `x` `[B, T, H, D]` (heads concatenated
//! per position, the layout of a q or k projection), int32 `positions` `[B, T]`, metadata
//! `theta`, `rotary_dim`, `interleaved`, `rope_type` (`default` or `llama3`, with `factor`,
//! `low_freq_factor`, `high_freq_factor`, `original_max_position_embeddings`). Outputs: the
//! rotated `x` and the frequency table `freqs` (from [`super::rope_frequencies`]).

use super::{rope_frequencies, Rope, RopeBackward, RopeParams, RopeScaling};
use crate::golden::{
    Case, CaseReader, GoldenCase, GoldenError, GoldenOp, GoldenSpace, Outputs, TensorData, Want,
};
use crate::ops::{AttentionLayout, OpError, Run};
use crate::params::DType;
use crate::tolerance::{tolerance, Rule, Tolerance};
use crate::{golden_runs, with_dtype};
use std::any::Any;

/// The golden ops of this family.
pub(crate) const GOLDEN: &[GoldenOp] = &[
    GoldenOp {
        name: "rope_forward",
        parse: parse_forward,
    },
    GoldenOp {
        name: "rope_backward",
        parse: parse_backward,
    },
];

/// Inputs of a `rope_forward` or `rope_backward` case.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeCase {
    /// The rotation by `−a` (backward) instead of `a`.
    pub backward: bool,
    /// Dimensions and layout flags.
    pub params: RopeParams,
    /// Base θ of the frequency table.
    pub theta: f64,
    /// Its scaling.
    pub scaling: RopeScaling,
    /// `[B, T, H, D]`: q, k or their gradient.
    pub x: TensorData,
    /// `[B, T]`.
    pub positions: Vec<i32>,
}

const OP: &str = RopeParams::OP;

fn parse(r: &mut CaseReader<'_>, backward: bool) -> Result<Case, GoldenError> {
    let theta = r.meta_f64("theta")?;
    let rotary_dim = r.meta_u64("rotary_dim")? as usize;
    let interleaved = r.meta_bool("interleaved")?;
    let scaling = match r.meta_str("rope_type")?.as_str() {
        "default" => RopeScaling::Default,
        "llama3" => RopeScaling::Llama3 {
            factor: r.meta_f64("factor")?,
            low_freq_factor: r.meta_f64("low_freq_factor")?,
            high_freq_factor: r.meta_f64("high_freq_factor")?,
            original_max_position_embeddings: r.meta_f64("original_max_position_embeddings")?,
        },
        other => return Err(r.bad("rope_type", other, "`default` or `llama3`")),
    };
    let (dtype, s) = r.primary("x")?;
    let [batch, seq, heads, head_dim] = s[..] else {
        return Err(r.shape_err("x", "[B, T, H, D]".into(), &s));
    };
    let x = r.take("x", Want::Case, dtype, None)?.data;
    let (_, positions) = r.take_i32("positions", Some(&[batch, seq]))?;
    let expected = r.expected(
        &[
            ("x", Want::Case, s.clone()),
            ("freqs", Want::F32, vec![rotary_dim / 2]),
        ],
        dtype,
    )?;
    let params = RopeParams {
        batch,
        seq,
        heads,
        head_dim,
        rotary_dim,
        interleaved,
    };
    let case = RopeCase {
        backward,
        params,
        theta,
        scaling,
        x,
        positions,
    };
    Ok(r.finish(dtype, Box::new(case), expected))
}

fn parse_forward(r: &mut CaseReader<'_>) -> Result<Case, GoldenError> {
    parse(r, false)
}

fn parse_backward(r: &mut CaseReader<'_>) -> Result<Case, GoldenError> {
    parse(r, true)
}

impl RopeCase {
    fn layout(&self) -> AttentionLayout {
        let p = &self.params;
        AttentionLayout::bthd(p.seq, p.heads, p.head_dim)
    }
}

impl RopeCase {
    fn run<S: GoldenSpace>(&self, q: S::Queue<'_>) -> Result<Outputs, OpError> {
        let freqs = rope_frequencies(self.theta, self.params.rotary_dim, self.scaling)?;
        with_dtype!(self.x.dtype(), T => {
            let mut x = S::typed::<T>(q, &self.x, OP, "x")?;
            let (pos, f) = (S::upload(q, &self.positions)?, S::upload(q, &freqs)?);
            let a = Rope::<S, T> {
                params: self.params,
                x: S::output(&mut x),
                layout: self.layout(),
                positions: S::input(&pos),
                freqs: S::input(&f),
            };
            if self.backward { RopeBackward { grad: a }.run(q)? } else { a.run(q)? }
            Ok(vec![("x", S::tensor(q, &x)?), ("freqs", TensorData::F32(freqs))])
        })
    }
}

impl GoldenCase for RopeCase {
    fn op(&self) -> &'static str {
        if self.backward {
            "rope_backward"
        } else {
            "rope_forward"
        }
    }

    golden_runs!();

    fn tolerance(&self, output: &str, dtype: DType) -> Tolerance {
        tolerance(Rule::Reduction, output, dtype, self.x.dtype(), 2)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
