//! Golden cases of `gelu_forward`, `gelu_backward` and `residual_add`.

use super::{ElementwiseParams, GeluBackward, GeluForward, ResidualAdd};
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

impl ElementwiseCase {
    fn run<S: GoldenSpace>(&self, q: S::Queue<'_>) -> Result<Outputs, OpError> {
        let op = self.op();
        let params = self.params;
        with_dtype!(self.inputs[0].dtype(), T => {
            let x = S::typed::<T>(q, &self.inputs[0], op, "x")?;
            let mut out = S::zeros::<T>(q, params.len)?;
            match self.op {
                Elementwise::GeluForward => GeluForward::<S, T> {
                    params,
                    x: S::input(&x),
                    out: S::output(&mut out),
                }
                .run(q)?,
                Elementwise::GeluBackward => {
                    let d = S::typed::<T>(q, &self.inputs[1], op, "dout")?;
                    GeluBackward::<S, T> {
                        params,
                        x: S::input(&x),
                        dout: S::input(&d),
                        dx: S::output(&mut out),
                    }
                    .run(q)?
                }
                Elementwise::ResidualAdd => {
                    let b = S::typed::<T>(q, &self.inputs[1], op, "b")?;
                    ResidualAdd::<S, T> {
                        params,
                        a: S::input(&x),
                        b: S::input(&b),
                        out: S::output(&mut out),
                    }
                    .run(q)?
                }
            }
            Ok(vec![(self.output(), S::tensor(q, &out)?)])
        })
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

    golden_runs!();

    fn tolerance(&self, output: &str, dtype: DType) -> Tolerance {
        tolerance(Rule::Reduction, output, dtype, self.inputs[0].dtype(), 1)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
