//! Golden cases of `encoder_forward` and `encoder_backward`: parsing and running them.

use super::{EncoderBackward, EncoderForward, EncoderParams};
use crate::golden::{
    Case, CaseReader, GoldenCase, GoldenError, GoldenOp, GoldenSpace, Outputs, TensorData, Want,
};
use crate::ops::{OpError, Run};
use crate::params::{DType, ShapeError};
use crate::tolerance::{tolerance, Rule, Tolerance};
use crate::{golden_runs, with_dtype};
use std::any::Any;

/// The golden ops of this family.
pub(crate) const GOLDEN: &[GoldenOp] = &[
    GoldenOp {
        name: "encoder_forward",
        parse: parse_forward,
    },
    GoldenOp {
        name: "encoder_backward",
        parse: parse_backward,
    },
];

/// Inputs of an `encoder_forward` case.
#[derive(Debug, Clone, PartialEq)]
pub struct EncoderForwardCase {
    /// Dimensions.
    pub params: EncoderParams,
    /// `[batch, seq]`.
    pub tokens: Vec<i32>,
    /// `[vocab, channels]`.
    pub wte: TensorData,
    /// `[positions, channels]`.
    pub wpe: TensorData,
}

/// Inputs of an `encoder_backward` case.
#[derive(Debug, Clone, PartialEq)]
pub struct EncoderBackwardCase {
    /// Dimensions and `accumulate`.
    pub params: EncoderParams,
    /// `[batch, seq]`.
    pub tokens: Vec<i32>,
    /// `[batch, seq, channels]`.
    pub dout: TensorData,
    /// Initial `dwte` `[vocab, channels]` (added to when `accumulate`).
    pub dwte: TensorData,
    /// Initial `dwpe` `[positions, channels]`.
    pub dwpe: TensorData,
}

const OP: &str = EncoderParams::OP;

/// Params, dtype and tokens from the `[vocab, C]` and `[positions, C]` tensors named `w`, `p`.
fn common(
    r: &mut CaseReader<'_>,
    w: &str,
    p: &str,
    accumulate: bool,
) -> Result<(EncoderParams, DType, Vec<i32>, TensorData, TensorData), GoldenError> {
    let (dtype, ws) = r.primary(w)?;
    let [vocab, channels] = ws[..] else {
        return Err(r.shape_err(w, "[V, C]".into(), &ws));
    };
    let (ts, tokens) = r.take_i32("tokens", None)?;
    let [batch, seq] = ts[..] else {
        return Err(r.shape_err("tokens", "[B, T]".into(), &ts));
    };
    let wt = r.take(w, Want::Case, dtype, None)?.data;
    let (_, ps) = r.primary(p)?;
    let positions = ps.first().copied().unwrap_or(0);
    let pt = r
        .take(p, Want::Case, dtype, Some(&[positions, channels]))?
        .data;
    let params = EncoderParams {
        batch,
        seq,
        channels,
        vocab,
        positions,
        accumulate,
    };
    Ok((params, dtype, tokens, wt, pt))
}

fn parse_forward(r: &mut CaseReader<'_>) -> Result<Case, GoldenError> {
    let (params, dtype, tokens, wte, wpe) = common(r, "wte", "wpe", false)?;
    let expected = r.expected(
        &[(
            "out",
            Want::Case,
            vec![params.batch, params.seq, params.channels],
        )],
        dtype,
    )?;
    let case = EncoderForwardCase {
        params,
        tokens,
        wte,
        wpe,
    };
    Ok(r.finish(dtype, Box::new(case), expected))
}

fn parse_backward(r: &mut CaseReader<'_>) -> Result<Case, GoldenError> {
    let accumulate = r.meta_bool("accumulate")?;
    let (params, dtype, tokens, dwte, dwpe) = common(r, "dwte", "dwpe", accumulate)?;
    let btc = vec![params.batch, params.seq, params.channels];
    let dout = r.take("dout", Want::Case, dtype, Some(&btc))?.data;
    let expected = r.expected(
        &[
            ("dwte", Want::Case, vec![params.vocab, params.channels]),
            ("dwpe", Want::Case, vec![params.positions, params.channels]),
        ],
        dtype,
    )?;
    let case = EncoderBackwardCase {
        params,
        tokens,
        dout,
        dwte,
        dwpe,
    };
    Ok(r.finish(dtype, Box::new(case), expected))
}

impl EncoderForwardCase {
    fn run<S: GoldenSpace>(&self, q: S::Queue<'_>) -> Result<Outputs, OpError> {
        with_dtype!(self.wte.dtype(), T => {
            let tokens = S::upload(q, &self.tokens)?;
            let (wte, wpe) = (S::typed::<T>(q, &self.wte, OP, "wte")?, S::typed::<T>(q, &self.wpe, OP, "wpe")?);
            let mut out = S::zeros::<T>(q, self.params.out_len()?)?;
            let mut error = S::upload(q, &[super::NO_ERROR])?;
            EncoderForward::<S, T> {
                params: self.params,
                tokens: S::input(&tokens),
                wte: S::input(&wte),
                wpe: S::input(&wpe),
                out: S::output(&mut out),
                error: Some(S::output(&mut error)),
            }
            .run(q)?;
            check_no_error::<S>(q, &error)?;
            Ok(vec![("out", S::tensor(q, &out)?)])
        })
    }
}

impl GoldenCase for EncoderForwardCase {
    fn op(&self) -> &'static str {
        "encoder_forward"
    }

    golden_runs!();

    fn tolerance(&self, output: &str, dtype: DType) -> Tolerance {
        tolerance(Rule::Reduction, output, dtype, self.wte.dtype(), 2)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A golden case holds only valid ids: the device flag must say so.
fn check_no_error<S: GoldenSpace>(q: S::Queue<'_>, error: &S::Buf<u32>) -> Result<(), OpError> {
    let e = S::download(q, error)?[0];
    if e != super::NO_ERROR {
        return Err(ShapeError::Invalid {
            op: OP,
            name: "error",
            value: e.to_string(),
            reason: "the device flagged a token id the case holds as valid",
        }
        .into());
    }
    Ok(())
}

impl EncoderBackwardCase {
    fn run<S: GoldenSpace>(&self, q: S::Queue<'_>) -> Result<Outputs, OpError> {
        with_dtype!(self.dout.dtype(), T => {
            let tokens = S::upload(q, &self.tokens)?;
            let dout = S::typed::<T>(q, &self.dout, OP, "dout")?;
            let mut dwte = S::typed::<T>(q, &self.dwte, OP, "dwte")?;
            let mut dwpe = S::typed::<T>(q, &self.dwpe, OP, "dwpe")?;
            let mut error = S::upload(q, &[super::NO_ERROR])?;
            EncoderBackward::<S, T> {
                params: self.params,
                tokens: S::input(&tokens),
                dout: S::input(&dout),
                dwte: S::output(&mut dwte),
                dwpe: S::output(&mut dwpe),
                error: Some(S::output(&mut error)),
            }
            .run(q)?;
            check_no_error::<S>(q, &error)?;
            Ok(vec![("dwte", S::tensor(q, &dwte)?), ("dwpe", S::tensor(q, &dwpe)?)])
        })
    }
}

impl GoldenCase for EncoderBackwardCase {
    fn op(&self) -> &'static str {
        "encoder_backward"
    }

    golden_runs!();

    fn tolerance(&self, output: &str, dtype: DType) -> Tolerance {
        let p = &self.params;
        let add = usize::from(p.accumulate);
        // Worst case for dwte: every position holds the same token.
        let len = if output == "dwte" {
            p.batch * p.seq
        } else {
            p.batch
        } + add;
        tolerance(Rule::Reduction, output, dtype, self.dout.dtype(), len)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
