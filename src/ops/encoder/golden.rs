//! Golden cases of `encoder_forward` and `encoder_backward`: parsing and running them.

use super::{EncoderBackward, EncoderForward, EncoderParams};
use crate::golden::{
    download, upload, Case, CaseReader, GoldenCase, GoldenError, GoldenOp, Outputs, TensorData,
    Want,
};
use crate::ops::OpError;
use crate::params::{DType, Element, ShapeError};
use crate::tolerance::{tolerance, Rule, Tolerance};
use crate::{cpu, ops, with_dtype};
use hip_rt::{DeviceBuffer, Stream};
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

impl GoldenCase for EncoderForwardCase {
    fn op(&self) -> &'static str {
        "encoder_forward"
    }

    fn run_cpu(&self) -> Result<Outputs, ShapeError> {
        with_dtype!(self.wte.dtype(), T => {
            let mut out = vec![T::from_f64(0.0); self.params.out_len()?];
            cpu::encoder_forward(EncoderForward::<_, T> {
                params: self.params,
                tokens: &self.tokens,
                wte: self.wte.typed::<T>(OP, "wte")?,
                wpe: self.wpe.typed::<T>(OP, "wpe")?,
                out: &mut out,
                error: None,
            })?;
            Ok(vec![("out", TensorData::from_slice(&out))])
        })
    }

    fn run_device(&self, s: &Stream) -> Result<Outputs, OpError> {
        with_dtype!(self.wte.dtype(), T => {
            let tokens = DeviceBuffer::from_slice(s, &self.tokens)?;
            let (wte, wpe) = (upload(s, self.wte.typed::<T>(OP, "wte")?)?, upload(s, self.wpe.typed::<T>(OP, "wpe")?)?);
            let mut out = DeviceBuffer::<T>::zeroed(s, self.params.out_len()?)?;
            let mut error = DeviceBuffer::<u32>::zeroed(s, 1)?;
            ops::encoder_forward(s, EncoderForward {
                params: self.params,
                tokens: &tokens,
                wte: &wte,
                wpe: &wpe,
                out: &mut out,
                error: Some(&mut error),
            })?;
            check_no_error(s, &error)?;
            Ok(vec![("out", download(s, &out)?)])
        })
    }

    fn tolerance(&self, output: &str, dtype: DType) -> Tolerance {
        tolerance(Rule::Reduction, output, dtype, self.wte.dtype(), 2)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A golden case holds only valid ids: the device flag must say so.
fn check_no_error(s: &Stream, error: &DeviceBuffer<u32>) -> Result<(), OpError> {
    let e = error.to_vec(s)?[0];
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

impl GoldenCase for EncoderBackwardCase {
    fn op(&self) -> &'static str {
        "encoder_backward"
    }

    fn run_cpu(&self) -> Result<Outputs, ShapeError> {
        with_dtype!(self.dout.dtype(), T => {
            let mut dwte = self.dwte.typed::<T>(OP, "dwte")?.to_vec();
            let mut dwpe = self.dwpe.typed::<T>(OP, "dwpe")?.to_vec();
            cpu::encoder_backward(EncoderBackward::<_, T> {
                params: self.params,
                tokens: &self.tokens,
                dout: self.dout.typed::<T>(OP, "dout")?,
                dwte: &mut dwte,
                dwpe: &mut dwpe,
                error: None,
            })?;
            Ok(vec![("dwte", TensorData::from_slice(&dwte)), ("dwpe", TensorData::from_slice(&dwpe))])
        })
    }

    fn run_device(&self, s: &Stream) -> Result<Outputs, OpError> {
        with_dtype!(self.dout.dtype(), T => {
            let tokens = DeviceBuffer::from_slice(s, &self.tokens)?;
            let dout = upload(s, self.dout.typed::<T>(OP, "dout")?)?;
            let mut dwte = upload(s, self.dwte.typed::<T>(OP, "dwte")?)?;
            let mut dwpe = upload(s, self.dwpe.typed::<T>(OP, "dwpe")?)?;
            let mut error = DeviceBuffer::<u32>::zeroed(s, 1)?;
            ops::encoder_backward(s, EncoderBackward {
                params: self.params,
                tokens: &tokens,
                dout: &dout,
                dwte: &mut dwte,
                dwpe: &mut dwpe,
                error: Some(&mut error),
            })?;
            check_no_error(s, &error)?;
            Ok(vec![("dwte", download(s, &dwte)?), ("dwpe", download(s, &dwpe)?)])
        })
    }

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
