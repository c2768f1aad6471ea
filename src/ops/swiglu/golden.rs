//! Golden cases of `swiglu_forward` and `swiglu_backward` (metadata `fused`: one `gate_up`
//! tensor `[N, 2F]`, else `gate` and `up` `[N, F]`; the backward's gradients in the same layout).

use super::{GateUp, GateUpGrad, SwigluBackward, SwigluForward, SwigluParams};
use crate::golden::{
    Case, CaseReader, GoldenCase, GoldenError, GoldenOp, GoldenSpace, Outputs, TensorData, Want,
};
use crate::ops::{OpError, Run};
use crate::params::DType;
use crate::tolerance::{tolerance, Rule, Tolerance};
use crate::{golden_runs, with_dtype};
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

/// The case's input buffers (one fused `gate_up` or `gate` and `up`) in space `S`.
fn input_bufs<S: GoldenSpace, T: crate::params::DeviceElement>(
    q: S::Queue<'_>,
    input: &[TensorData],
) -> Result<Vec<S::Buf<T>>, OpError> {
    let names: &[&'static str] = if input.len() == 1 {
        &["gate_up"]
    } else {
        &["gate", "up"]
    };
    input
        .iter()
        .zip(names)
        .map(|(t, name)| S::typed::<T>(q, t, OP, name))
        .collect()
}

/// The op's input view of [`input_bufs`].
fn gate_up<S: GoldenSpace, T: crate::params::DeviceElement>(
    bufs: &[S::Buf<T>],
) -> Result<GateUp<'_, S, T>, OpError> {
    Ok(match bufs {
        [x] => GateUp::Fused {
            gate_up: S::input(x),
        },
        [g, u] => GateUp::Separate {
            gate: S::input(g),
            up: S::input(u),
        },
        _ => {
            return Err(crate::params::invalid(
                OP,
                "input",
                bufs.len(),
                "a case has one fused gate_up tensor or gate and up",
            )
            .into())
        }
    })
}

impl SwigluForwardCase {
    fn run<S: GoldenSpace>(&self, q: S::Queue<'_>) -> Result<Outputs, OpError> {
        let n = self.params.rows * self.params.ffn;
        with_dtype!(self.input[0].dtype(), T => {
            let bufs = input_bufs::<S, T>(q, &self.input)?;
            let mut h = S::zeros::<T>(q, n)?;
            SwigluForward::<S, T> {
                params: self.params,
                input: gate_up::<S, T>(&bufs)?,
                h: S::output(&mut h),
            }
            .run(q)?;
            Ok(vec![("h", S::tensor(q, &h)?)])
        })
    }
}

impl GoldenCase for SwigluForwardCase {
    fn op(&self) -> &'static str {
        "swiglu_forward"
    }

    golden_runs!();

    fn tolerance(&self, output: &str, dtype: DType) -> Tolerance {
        tolerance(Rule::Reduction, output, dtype, self.input[0].dtype(), 1)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl SwigluBackwardCase {
    fn run<S: GoldenSpace>(&self, q: S::Queue<'_>) -> Result<Outputs, OpError> {
        let (p, n) = (self.params, self.params.rows * self.params.ffn);
        with_dtype!(self.dh.dtype(), T => {
            let bufs = input_bufs::<S, T>(q, &self.input)?;
            let dh = S::typed::<T>(q, &self.dh, OP, "dh")?;
            // Outputs start as NaN: the backward overwrites them and never reads them.
            if bufs.len() == 1 {
                let mut d = S::nan::<T>(q, 2 * n)?;
                let input = gate_up::<S, T>(&bufs)?;
                let grad = GateUpGrad::Fused { dgate_up: S::output(&mut d) };
                SwigluBackward::<S, T> { params: p, input, dh: S::input(&dh), grad }.run(q)?;
                Ok(vec![("dgate_up", S::tensor(q, &d)?)])
            } else {
                let (mut dg, mut du) = (S::nan::<T>(q, n)?, S::nan::<T>(q, n)?);
                let input = gate_up::<S, T>(&bufs)?;
                let grad = GateUpGrad::Separate { dgate: S::output(&mut dg), dup: S::output(&mut du) };
                SwigluBackward::<S, T> { params: p, input, dh: S::input(&dh), grad }.run(q)?;
                Ok(vec![("dgate", S::tensor(q, &dg)?), ("dup", S::tensor(q, &du)?)])
            }
        })
    }
}

impl GoldenCase for SwigluBackwardCase {
    fn op(&self) -> &'static str {
        "swiglu_backward"
    }

    golden_runs!();

    fn tolerance(&self, output: &str, dtype: DType) -> Tolerance {
        tolerance(Rule::Reduction, output, dtype, self.dh.dtype(), 1)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
