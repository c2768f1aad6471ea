//! Golden cases of `lora_forward` and `lora_backward`.

use super::{LoraBackward, LoraForward, LoraParams};
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
        name: LoraParams::FORWARD,
        parse: parse_forward,
    },
    GoldenOp {
        name: LoraParams::BACKWARD,
        parse: parse_backward,
    },
];

/// Inputs of a `lora_forward` case.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraForwardCase {
    /// Dimensions and scale.
    pub params: LoraParams,
    /// `[rows, d_in]`.
    pub x: TensorData,
    /// `lora_A` `[rank, d_in]`.
    pub a: TensorData,
    /// `lora_B` `[d_out, rank]`.
    pub b: TensorData,
    /// The target output before the adapter `[rows, d_out]`.
    pub y: TensorData,
}

/// Inputs of a `lora_backward` case.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraBackwardCase {
    /// Dimensions, scale and `accumulate`.
    pub params: LoraParams,
    /// `[rows, d_in]`.
    pub x: TensorData,
    /// `[rows, d_out]`.
    pub dy: TensorData,
    /// `lora_A` `[rank, d_in]`.
    pub a: TensorData,
    /// `lora_B` `[d_out, rank]`.
    pub b: TensorData,
    /// The forward's `x·Aᵀ` `[rows, rank]`.
    pub u: TensorData,
    /// Initial `da` (added to when `accumulate`).
    pub da: TensorData,
    /// Initial `db` (added to when `accumulate`).
    pub db: TensorData,
    /// Initial `dx` (the base GEMM's `dy·Wᵀ`, added to).
    pub dx: TensorData,
}

/// `(dtype, rows, d_in, d_out, rank)` from `x` `[rows, d_in]` and `b` `[d_out, rank]`.
fn dims(r: &CaseReader<'_>) -> Result<(DType, [usize; 4]), GoldenError> {
    let (dtype, sx) = r.primary("x")?;
    let (_, sb) = r.primary("b")?;
    let [rows, d_in] = sx[..] else {
        return Err(r.shape_err("x", "[rows, d_in]".into(), &sx));
    };
    let [d_out, rank] = sb[..] else {
        return Err(r.shape_err("b", "[d_out, rank]".into(), &sb));
    };
    Ok((dtype, [rows, d_in, d_out, rank]))
}

fn parse_forward(r: &mut CaseReader<'_>) -> Result<Case, GoldenError> {
    let scale = r.meta_f32("scale")?;
    let (dtype, [rows, d_in, d_out, rank]) = dims(r)?;
    let x = r.take("x", Want::Case, dtype, None)?.data;
    let b = r.take("b", Want::Case, dtype, None)?.data;
    let a = r.take("a", Want::Case, dtype, Some(&[rank, d_in]))?.data;
    let y = r.take("y", Want::Case, dtype, Some(&[rows, d_out]))?.data;
    let expected = r.expected(
        &[
            ("u", Want::Case, vec![rows, rank]),
            ("y", Want::Case, vec![rows, d_out]),
        ],
        dtype,
    )?;
    let params = LoraParams::new(rows, d_in, d_out, rank, scale);
    Ok(r.finish(
        dtype,
        Box::new(LoraForwardCase { params, x, a, b, y }),
        expected,
    ))
}

fn parse_backward(r: &mut CaseReader<'_>) -> Result<Case, GoldenError> {
    let scale = r.meta_f32("scale")?;
    let accumulate = r.meta_bool("accumulate")?;
    let (dtype, [rows, d_in, d_out, rank]) = dims(r)?;
    let x = r.take("x", Want::Case, dtype, None)?.data;
    let b = r.take("b", Want::Case, dtype, None)?.data;
    let dy = r.take("dy", Want::Case, dtype, Some(&[rows, d_out]))?.data;
    let a = r.take("a", Want::Case, dtype, Some(&[rank, d_in]))?.data;
    let u = r.take("u", Want::Case, dtype, Some(&[rows, rank]))?.data;
    let da = r.take("da", Want::Case, dtype, Some(&[rank, d_in]))?.data;
    let db = r.take("db", Want::Case, dtype, Some(&[d_out, rank]))?.data;
    let dx = r.take("dx", Want::Case, dtype, Some(&[rows, d_in]))?.data;
    let expected = r.expected(
        &[
            ("du", Want::Case, vec![rows, rank]),
            ("da", Want::Case, vec![rank, d_in]),
            ("db", Want::Case, vec![d_out, rank]),
            ("dx", Want::Case, vec![rows, d_in]),
        ],
        dtype,
    )?;
    let params = LoraParams {
        accumulate,
        ..LoraParams::new(rows, d_in, d_out, rank, scale)
    };
    Ok(r.finish(
        dtype,
        Box::new(LoraBackwardCase {
            params,
            x,
            dy,
            a,
            b,
            u,
            da,
            db,
            dx,
        }),
        expected,
    ))
}

impl LoraForwardCase {
    fn run<S: GoldenSpace>(&self, q: S::Queue<'_>) -> Result<Outputs, OpError> {
        const OP: &str = LoraParams::FORWARD;
        let p = self.params;
        with_dtype!(self.x.dtype(), T => {
            let x = S::typed::<T>(q, &self.x, OP, "x")?;
            let a = S::typed::<T>(q, &self.a, OP, "a")?;
            let b = S::typed::<T>(q, &self.b, OP, "b")?;
            let mut y = S::typed::<T>(q, &self.y, OP, "y")?;
            let mut u = S::zeros::<T>(q, p.rows * p.rank)?;
            LoraForward::<S, T> {
                params: p,
                x: S::input(&x),
                a: S::input(&a),
                b: S::input(&b),
                u: S::output(&mut u),
                y: S::output(&mut y),
            }
            .run(q)?;
            Ok(vec![("u", S::tensor(q, &u)?), ("y", S::tensor(q, &y)?)])
        })
    }
}

impl GoldenCase for LoraForwardCase {
    fn op(&self) -> &'static str {
        LoraParams::FORWARD
    }

    golden_runs!();

    fn tolerance(&self, output: &str, dtype: DType) -> Tolerance {
        // u: a d_in-term reduction; y: the rank-term reduction of the rounded u plus y.
        let p = self.params;
        let len = if output == "u" { p.d_in } else { p.rank + 1 };
        tolerance(Rule::Reduction, output, dtype, self.x.dtype(), len)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl LoraBackwardCase {
    fn run<S: GoldenSpace>(&self, q: S::Queue<'_>) -> Result<Outputs, OpError> {
        const OP: &str = LoraParams::BACKWARD;
        let p = self.params;
        with_dtype!(self.x.dtype(), T => {
            let x = S::typed::<T>(q, &self.x, OP, "x")?;
            let dy = S::typed::<T>(q, &self.dy, OP, "dy")?;
            let a = S::typed::<T>(q, &self.a, OP, "a")?;
            let b = S::typed::<T>(q, &self.b, OP, "b")?;
            let u = S::typed::<T>(q, &self.u, OP, "u")?;
            let mut da = S::typed::<T>(q, &self.da, OP, "da")?;
            let mut db = S::typed::<T>(q, &self.db, OP, "db")?;
            let mut dx = S::typed::<T>(q, &self.dx, OP, "dx")?;
            let mut du = S::zeros::<T>(q, p.rows * p.rank)?;
            LoraBackward::<S, T> {
                params: p,
                x: S::input(&x),
                dy: S::input(&dy),
                a: S::input(&a),
                b: S::input(&b),
                u: S::input(&u),
                du: S::output(&mut du),
                da: S::output(&mut da),
                db: S::output(&mut db),
                dx: S::output(&mut dx),
            }
            .run(q)?;
            Ok(vec![
                ("du", S::tensor(q, &du)?),
                ("da", S::tensor(q, &da)?),
                ("db", S::tensor(q, &db)?),
                ("dx", S::tensor(q, &dx)?),
            ])
        })
    }
}

impl GoldenCase for LoraBackwardCase {
    fn op(&self) -> &'static str {
        LoraParams::BACKWARD
    }

    golden_runs!();

    fn tolerance(&self, output: &str, dtype: DType) -> Tolerance {
        // du: a d_out-term reduction; da, db: rows-term reductions (plus the old value); dx: the
        // rank-term reduction of the rounded du plus dx.
        let p = self.params;
        let len = match output {
            "du" => p.d_out,
            "dx" => p.rank + 1,
            _ => p.rows + 1,
        };
        tolerance(Rule::Reduction, output, dtype, self.x.dtype(), len)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
