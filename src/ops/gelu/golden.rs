//! Golden cases of `gelu_forward`, `gelu_backward` and `residual_add`.

use super::{ElementwiseParams, GeluBackward, GeluForward, ResidualAdd};
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
        name: "gelu_forward",
        parse: parse_forward,
    },
    GoldenOp {
        name: "gelu_backward",
        parse: parse_backward,
    },
    GoldenOp {
        name: "residual_add",
        parse: parse_add,
    },
];

/// Which elementwise op a case runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elementwise {
    /// `out = gelu(x)`; inputs `[x]`.
    GeluForward,
    /// `dx = dout·gelu'(x)`; inputs `[x, dout]`.
    GeluBackward,
    /// `out = a + b`; inputs `[a, b]`.
    ResidualAdd,
}

/// Inputs of a `gelu_forward`, `gelu_backward` or `residual_add` case.
#[derive(Debug, Clone, PartialEq)]
pub struct ElementwiseCase {
    /// The op.
    pub op: Elementwise,
    /// The length.
    pub params: ElementwiseParams,
    /// The inputs, in the op's order.
    pub inputs: Vec<TensorData>,
}

fn parse(
    r: &mut CaseReader<'_>,
    op: Elementwise,
    names: &[&str],
    out: &str,
) -> Result<Case, GoldenError> {
    let (dtype, shape) = r.primary(names[0])?;
    let inputs = names
        .iter()
        .map(|n| Ok(r.take(n, Want::Case, dtype, Some(&shape))?.data))
        .collect::<Result<Vec<_>, GoldenError>>()?;
    let params = ElementwiseParams {
        len: inputs[0].len(),
    };
    let expected = r.expected(&[(out, Want::Case, shape)], dtype)?;
    Ok(r.finish(
        dtype,
        Box::new(ElementwiseCase { op, params, inputs }),
        expected,
    ))
}

fn parse_forward(r: &mut CaseReader<'_>) -> Result<Case, GoldenError> {
    parse(r, Elementwise::GeluForward, &["x"], "out")
}

fn parse_backward(r: &mut CaseReader<'_>) -> Result<Case, GoldenError> {
    parse(r, Elementwise::GeluBackward, &["x", "dout"], "dx")
}

fn parse_add(r: &mut CaseReader<'_>) -> Result<Case, GoldenError> {
    parse(r, Elementwise::ResidualAdd, &["a", "b"], "out")
}

impl ElementwiseCase {
    fn output(&self) -> &'static str {
        if self.op == Elementwise::GeluBackward {
            "dx"
        } else {
            "out"
        }
    }
}

impl GoldenCase for ElementwiseCase {
    fn op(&self) -> &'static str {
        match self.op {
            Elementwise::GeluForward => "gelu_forward",
            Elementwise::GeluBackward => "gelu_backward",
            Elementwise::ResidualAdd => "residual_add",
        }
    }

    fn run_cpu(&self) -> Result<Outputs, ShapeError> {
        let op = self.op();
        let params = self.params;
        with_dtype!(self.inputs[0].dtype(), T => {
            let x = self.inputs[0].typed::<T>(op, "x")?;
            let mut out = vec![T::from_f64(0.0); x.len()];
            match self.op {
                Elementwise::GeluForward => cpu::gelu_forward(GeluForward::<_, T> { params, x, out: &mut out })?,
                Elementwise::GeluBackward => cpu::gelu_backward(GeluBackward::<_, T> {
                    params, x, dout: self.inputs[1].typed::<T>(op, "dout")?, dx: &mut out,
                })?,
                Elementwise::ResidualAdd => cpu::residual_add(ResidualAdd::<_, T> {
                    params, a: x, b: self.inputs[1].typed::<T>(op, "b")?, out: &mut out,
                })?,
            }
            Ok(vec![(self.output(), TensorData::from_slice(&out))])
        })
    }

    fn run_device(&self, s: &Stream) -> Result<Outputs, OpError> {
        let op = self.op();
        let params = self.params;
        with_dtype!(self.inputs[0].dtype(), T => {
            let x = upload(s, self.inputs[0].typed::<T>(op, "x")?)?;
            let mut out = DeviceBuffer::<T>::zeroed(s, params.len)?;
            match self.op {
                Elementwise::GeluForward => ops::gelu_forward(s, GeluForward { params, x: &x, out: &mut out })?,
                Elementwise::GeluBackward => {
                    let d = upload(s, self.inputs[1].typed::<T>(op, "dout")?)?;
                    ops::gelu_backward(s, GeluBackward { params, x: &x, dout: &d, dx: &mut out })?
                }
                Elementwise::ResidualAdd => {
                    let b = upload(s, self.inputs[1].typed::<T>(op, "b")?)?;
                    ops::residual_add(s, ResidualAdd { params, a: &x, b: &b, out: &mut out })?
                }
            }
            Ok(vec![(self.output(), download(s, &out)?)])
        })
    }

    fn tolerance(&self, output: &str, dtype: DType) -> Tolerance {
        tolerance(Rule::Reduction, output, dtype, self.inputs[0].dtype(), 1)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
