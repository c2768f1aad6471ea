//! Golden cases of `lora_forward` and `lora_backward`.

use super::{LoraBackward, LoraForward, LoraParams};
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

impl GoldenCase for LoraForwardCase {
    fn op(&self) -> &'static str {
        LoraParams::FORWARD
    }

    fn run_cpu(&self) -> Result<Outputs, ShapeError> {
        const OP: &str = LoraParams::FORWARD;
        let p = self.params;
        with_dtype!(self.x.dtype(), T => {
            let mut u = vec![T::from_f64(0.0); p.rows * p.rank];
            let mut y = self.y.typed::<T>(OP, "y")?.to_vec();
            cpu::lora_forward(LoraForward::<_, T> {
                params: p,
                x: self.x.typed::<T>(OP, "x")?,
                a: self.a.typed::<T>(OP, "a")?,
                b: self.b.typed::<T>(OP, "b")?,
                u: &mut u,
                y: &mut y,
            })?;
            Ok(vec![("u", TensorData::from_slice(&u)), ("y", TensorData::from_slice(&y))])
        })
    }

    fn run_device(&self, s: &Stream) -> Result<Outputs, OpError> {
        const OP: &str = LoraParams::FORWARD;
        let p = self.params;
        with_dtype!(self.x.dtype(), T => {
            let x = upload(s, self.x.typed::<T>(OP, "x")?)?;
            let a = upload(s, self.a.typed::<T>(OP, "a")?)?;
            let b = upload(s, self.b.typed::<T>(OP, "b")?)?;
            let mut y = upload(s, self.y.typed::<T>(OP, "y")?)?;
            let mut u = DeviceBuffer::<T>::zeroed(s, p.rows * p.rank)?;
            ops::lora_forward(s, LoraForward { params: p, x: &x, a: &a, b: &b, u: &mut u, y: &mut y })?;
            Ok(vec![("u", download(s, &u)?), ("y", download(s, &y)?)])
        })
    }

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

impl GoldenCase for LoraBackwardCase {
    fn op(&self) -> &'static str {
        LoraParams::BACKWARD
    }

    fn run_cpu(&self) -> Result<Outputs, ShapeError> {
        const OP: &str = LoraParams::BACKWARD;
        let p = self.params;
        with_dtype!(self.x.dtype(), T => {
            let mut du = vec![T::from_f64(0.0); p.rows * p.rank];
            let mut da = self.da.typed::<T>(OP, "da")?.to_vec();
            let mut db = self.db.typed::<T>(OP, "db")?.to_vec();
            let mut dx = self.dx.typed::<T>(OP, "dx")?.to_vec();
            cpu::lora_backward(LoraBackward::<_, T> {
                params: p,
                x: self.x.typed::<T>(OP, "x")?,
                dy: self.dy.typed::<T>(OP, "dy")?,
                a: self.a.typed::<T>(OP, "a")?,
                b: self.b.typed::<T>(OP, "b")?,
                u: self.u.typed::<T>(OP, "u")?,
                du: &mut du,
                da: &mut da,
                db: &mut db,
                dx: &mut dx,
            })?;
            Ok(vec![
                ("du", TensorData::from_slice(&du)),
                ("da", TensorData::from_slice(&da)),
                ("db", TensorData::from_slice(&db)),
                ("dx", TensorData::from_slice(&dx)),
            ])
        })
    }

    fn run_device(&self, s: &Stream) -> Result<Outputs, OpError> {
        const OP: &str = LoraParams::BACKWARD;
        let p = self.params;
        with_dtype!(self.x.dtype(), T => {
            let x = upload(s, self.x.typed::<T>(OP, "x")?)?;
            let dy = upload(s, self.dy.typed::<T>(OP, "dy")?)?;
            let a = upload(s, self.a.typed::<T>(OP, "a")?)?;
            let b = upload(s, self.b.typed::<T>(OP, "b")?)?;
            let u = upload(s, self.u.typed::<T>(OP, "u")?)?;
            let mut da = upload(s, self.da.typed::<T>(OP, "da")?)?;
            let mut db = upload(s, self.db.typed::<T>(OP, "db")?)?;
            let mut dx = upload(s, self.dx.typed::<T>(OP, "dx")?)?;
            let mut du = DeviceBuffer::<T>::zeroed(s, p.rows * p.rank)?;
            ops::lora_backward(s, LoraBackward {
                params: p, x: &x, dy: &dy, a: &a, b: &b, u: &u,
                du: &mut du, da: &mut da, db: &mut db, dx: &mut dx,
            })?;
            Ok(vec![
                ("du", download(s, &du)?),
                ("da", download(s, &da)?),
                ("db", download(s, &db)?),
                ("dx", download(s, &dx)?),
            ])
        })
    }

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
