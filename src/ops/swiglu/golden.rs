//! Golden cases of `swiglu_forward` and `swiglu_backward` (metadata `fused`: one `gate_up`
//! tensor `[N, 2F]`, else `gate` and `up` `[N, F]`; the backward's gradients in the same layout).

use super::{GateUp, GateUpGrad, SwigluBackward, SwigluForward, SwigluParams};
use crate::golden::{
    download, upload, Case, CaseReader, GoldenCase, GoldenError, GoldenOp, Outputs, TensorData,
    Want,
};
use crate::ops::OpError;
use crate::params::{DType, Element, Host, OnDevice, ShapeError};
use crate::tolerance::{tolerance, Rule, Tolerance};
use crate::{cpu, ops, with_dtype};
use hip_rt::{DeviceBuffer, Stream};
use std::any::Any;

/// The golden ops of this family.
pub(crate) const GOLDEN: &[GoldenOp] = &[
    GoldenOp {
        name: "swiglu_forward",
        parse: parse_forward,
    },
    GoldenOp {
        name: "swiglu_backward",
        parse: parse_backward,
    },
];

/// Inputs of a `swiglu_forward` case.
#[derive(Debug, Clone, PartialEq)]
pub struct SwigluForwardCase {
    /// Rows and F.
    pub params: SwigluParams,
    /// `[gate_up]` (fused) or `[gate, up]`.
    pub input: Vec<TensorData>,
}

/// Inputs of a `swiglu_backward` case.
#[derive(Debug, Clone, PartialEq)]
pub struct SwigluBackwardCase {
    /// Rows and F.
    pub params: SwigluParams,
    /// `[gate_up]` (fused) or `[gate, up]`.
    pub input: Vec<TensorData>,
    /// `[N, F]`.
    pub dh: TensorData,
}

const OP: &str = SwigluParams::OP;

fn parse_input(
    r: &mut CaseReader<'_>,
) -> Result<(SwigluParams, DType, Vec<TensorData>), GoldenError> {
    if r.meta_bool("fused")? {
        let (dtype, s) = r.primary("gate_up")?;
        let [rows, f2] = s[..] else {
            return Err(r.shape_err("gate_up", "[N, 2F]".into(), &s));
        };
        if f2 % 2 != 0 {
            return Err(r.shape_err("gate_up", "[N, 2F] (an even width)".into(), &s));
        }
        let x = r.take("gate_up", Want::Case, dtype, None)?.data;
        Ok((SwigluParams { rows, ffn: f2 / 2 }, dtype, vec![x]))
    } else {
        let (dtype, s) = r.primary("gate")?;
        let [rows, ffn] = s[..] else {
            return Err(r.shape_err("gate", "[N, F]".into(), &s));
        };
        let g = r.take("gate", Want::Case, dtype, None)?.data;
        let u = r.take("up", Want::Case, dtype, Some(&s))?.data;
        Ok((SwigluParams { rows, ffn }, dtype, vec![g, u]))
    }
}

fn parse_forward(r: &mut CaseReader<'_>) -> Result<Case, GoldenError> {
    let (params, dtype, input) = parse_input(r)?;
    let expected = r.expected(&[("h", Want::Case, vec![params.rows, params.ffn])], dtype)?;
    Ok(r.finish(
        dtype,
        Box::new(SwigluForwardCase { params, input }),
        expected,
    ))
}

fn parse_backward(r: &mut CaseReader<'_>) -> Result<Case, GoldenError> {
    let (params, dtype, input) = parse_input(r)?;
    let hs = [params.rows, params.ffn];
    let dh = r.take("dh", Want::Case, dtype, Some(&hs))?.data;
    let expected = if input.len() == 1 {
        r.expected(
            &[("dgate_up", Want::Case, vec![params.rows, 2 * params.ffn])],
            dtype,
        )?
    } else {
        r.expected(
            &[
                ("dgate", Want::Case, hs.to_vec()),
                ("dup", Want::Case, hs.to_vec()),
            ],
            dtype,
        )?
    };
    let case = SwigluBackwardCase { params, input, dh };
    Ok(r.finish(dtype, Box::new(case), expected))
}

/// The input layout over host slices.
fn host_input<'a, T: crate::params::DeviceElement>(
    input: &'a [TensorData],
) -> Result<GateUp<'a, Host, T>, ShapeError> {
    Ok(match input {
        [x] => GateUp::Fused {
            gate_up: x.typed::<T>(OP, "gate_up")?,
        },
        [g, u, ..] => GateUp::Separate {
            gate: g.typed::<T>(OP, "gate")?,
            up: u.typed::<T>(OP, "up")?,
        },
        [] => {
            return Err(crate::params::invalid(
                OP,
                "input",
                "none",
                "a case has inputs",
            ))
        }
    })
}

impl GoldenCase for SwigluForwardCase {
    fn op(&self) -> &'static str {
        "swiglu_forward"
    }

    fn run_cpu(&self) -> Result<Outputs, ShapeError> {
        let n = self.params.rows * self.params.ffn;
        with_dtype!(self.input[0].dtype(), T => {
            let mut h = vec![T::from_f64(0.0); n];
            cpu::swiglu_forward(SwigluForward { params: self.params, input: host_input::<T>(&self.input)?, h: &mut h })?;
            Ok(vec![("h", TensorData::from_slice(&h))])
        })
    }

    fn run_device(&self, s: &Stream) -> Result<Outputs, OpError> {
        let n = self.params.rows * self.params.ffn;
        with_dtype!(self.input[0].dtype(), T => {
            let bufs = self.input.iter().map(|t| upload(s, t.typed::<T>(OP, "input")?)).collect::<Result<Vec<_>, OpError>>()?;
            let input: GateUp<'_, OnDevice, T> = match &bufs[..] {
                [x] => GateUp::Fused { gate_up: x },
                [g, u, ..] => GateUp::Separate { gate: g, up: u },
                [] => unreachable!("parse gives one or two inputs"),
            };
            let mut h = DeviceBuffer::<T>::zeroed(s, n)?;
            ops::swiglu_forward(s, SwigluForward { params: self.params, input, h: &mut h })?;
            Ok(vec![("h", download(s, &h)?)])
        })
    }

    fn tolerance(&self, output: &str, dtype: DType) -> Tolerance {
        tolerance(Rule::Reduction, output, dtype, self.input[0].dtype(), 1)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl GoldenCase for SwigluBackwardCase {
    fn op(&self) -> &'static str {
        "swiglu_backward"
    }

    fn run_cpu(&self) -> Result<Outputs, ShapeError> {
        let (p, n) = (self.params, self.params.rows * self.params.ffn);
        with_dtype!(self.dh.dtype(), T => {
            let input = host_input::<T>(&self.input)?;
            let dh = self.dh.typed::<T>(OP, "dh")?;
            if self.input.len() == 1 {
                let mut d = vec![T::from_f64(0.0); 2 * n];
                let grad: GateUpGrad<'_, Host, T> = GateUpGrad::Fused { dgate_up: &mut d };
                cpu::swiglu_backward(SwigluBackward { params: p, input, dh, grad })?;
                Ok(vec![("dgate_up", TensorData::from_slice(&d))])
            } else {
                let (mut dg, mut du) = (vec![T::from_f64(0.0); n], vec![T::from_f64(0.0); n]);
                let grad: GateUpGrad<'_, Host, T> = GateUpGrad::Separate { dgate: &mut dg, dup: &mut du };
                cpu::swiglu_backward(SwigluBackward { params: p, input, dh, grad })?;
                Ok(vec![("dgate", TensorData::from_slice(&dg)), ("dup", TensorData::from_slice(&du))])
            }
        })
    }

    fn run_device(&self, s: &Stream) -> Result<Outputs, OpError> {
        let (p, n) = (self.params, self.params.rows * self.params.ffn);
        with_dtype!(self.dh.dtype(), T => {
            let bufs = self.input.iter().map(|t| upload(s, t.typed::<T>(OP, "input")?)).collect::<Result<Vec<_>, OpError>>()?;
            let input = || -> GateUp<'_, OnDevice, T> {
                match &bufs[..] {
                    [x] => GateUp::Fused { gate_up: x },
                    [g, u, ..] => GateUp::Separate { gate: g, up: u },
                    [] => unreachable!("parse gives one or two inputs"),
                }
            };
            let dh = upload(s, self.dh.typed::<T>(OP, "dh")?)?;
            // Outputs start as NaN: the backward overwrites them and never reads them.
            let nan = |n| upload(s, &vec![T::from_f64(f64::NAN); n]);
            if bufs.len() == 1 {
                let mut d = nan(2 * n)?;
                let grad: GateUpGrad<'_, OnDevice, T> = GateUpGrad::Fused { dgate_up: &mut d };
                ops::swiglu_backward(s, SwigluBackward { params: p, input: input(), dh: &dh, grad })?;
                Ok(vec![("dgate_up", download(s, &d)?)])
            } else {
                let (mut dg, mut du) = (nan(n)?, nan(n)?);
                let grad: GateUpGrad<'_, OnDevice, T> = GateUpGrad::Separate { dgate: &mut dg, dup: &mut du };
                ops::swiglu_backward(s, SwigluBackward { params: p, input: input(), dh: &dh, grad })?;
                Ok(vec![("dgate", download(s, &dg)?), ("dup", download(s, &du)?)])
            }
        })
    }

    fn tolerance(&self, output: &str, dtype: DType) -> Tolerance {
        tolerance(Rule::Reduction, output, dtype, self.dh.dtype(), 1)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
