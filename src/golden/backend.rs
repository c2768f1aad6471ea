//! The pluggable implementation under test, and the CPU reference as one.

use super::{
    AdamWCase, AttentionBackwardCase, AttentionForwardCase, LayerNormBackwardCase,
    LayerNormForwardCase, MatmulCase, TensorData,
};
use crate::params::ShapeError;
use crate::{cpu, with_dtype};

/// Outputs of `layernorm_forward`.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerNormForwardOut {
    /// Normalized output (case dtype).
    pub y: TensorData,
    /// Per-row mean.
    pub mean: Vec<f32>,
    /// Per-row reciprocal standard deviation.
    pub rstd: Vec<f32>,
}

/// Outputs of `layernorm_backward`.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerNormBackwardOut {
    /// Gradient of `x`.
    pub dx: TensorData,
    /// Gradient of `weight`.
    pub dweight: TensorData,
    /// Gradient of `bias`.
    pub dbias: TensorData,
}

/// Outputs of `attention_forward`.
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionForwardOut {
    /// Attention output (case dtype).
    pub out: TensorData,
    /// Log-sum-exp per query.
    pub lse: Vec<f32>,
}

/// Outputs of `attention_backward`.
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionBackwardOut {
    /// Gradient of `q`.
    pub dq: TensorData,
    /// Gradient of `k`.
    pub dk: TensorData,
    /// Gradient of `v`.
    pub dv: TensorData,
}

/// The updated tensors of `adamw`.
#[derive(Debug, Clone, PartialEq)]
pub struct AdamWOut {
    /// Parameters (case dtype).
    pub param: TensorData,
    /// First moment.
    pub exp_avg: Vec<f32>,
    /// Second moment.
    pub exp_avg_sq: Vec<f32>,
    /// Running max of the second moment (iff amsgrad).
    pub max_exp_avg_sq: Option<Vec<f32>>,
}

/// An implementation that golden cases can check: one method per op, taking the case's inputs
/// and returning its outputs (host values; a device backend uploads, launches and downloads).
pub trait GoldenBackend {
    /// The backend's error.
    type Error: std::error::Error + Send + Sync + 'static;

    /// A short name for reports ("cpu", "hip:0 gfx906", ...).
    fn name(&self) -> String;

    /// `out = alpha·op(a)·op(b) + beta·c`.
    fn matmul(&mut self, case: &MatmulCase) -> Result<TensorData, Self::Error>;

    /// Layer norm forward.
    fn layernorm_forward(
        &mut self,
        case: &LayerNormForwardCase,
    ) -> Result<LayerNormForwardOut, Self::Error>;

    /// Layer norm backward.
    fn layernorm_backward(
        &mut self,
        case: &LayerNormBackwardCase,
    ) -> Result<LayerNormBackwardOut, Self::Error>;

    /// Attention forward.
    fn attention_forward(
        &mut self,
        case: &AttentionForwardCase,
    ) -> Result<AttentionForwardOut, Self::Error>;

    /// Attention backward.
    fn attention_backward(
        &mut self,
        case: &AttentionBackwardCase,
    ) -> Result<AttentionBackwardOut, Self::Error>;

    /// One AdamW step (on copies of the case's tensors).
    fn adamw(&mut self, case: &AdamWCase) -> Result<AdamWOut, Self::Error>;
}

/// The CPU reference ([`crate::cpu`]) as a [`GoldenBackend`].
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuBackend;

impl GoldenBackend for CpuBackend {
    type Error = ShapeError;

    fn name(&self) -> String {
        "cpu".into()
    }

    fn matmul(&mut self, c: &MatmulCase) -> Result<TensorData, ShapeError> {
        const OP: &str = "matmul";
        with_dtype!(c.a.dtype(), T => {
            let mut out = match &c.c {
                Some(cc) => cc.typed::<T>(OP, "c")?.to_vec(),
                None => vec![<T as crate::params::Element>::from_f64(0.0); c.shape.out_len()?],
            };
            cpu::matmul(&c.shape, c.alpha, c.beta, c.a.typed::<T>(OP, "a")?, c.b.typed::<T>(OP, "b")?, &mut out)?;
            Ok(TensorData::from_slice(&out))
        })
    }

    fn layernorm_forward(
        &mut self,
        c: &LayerNormForwardCase,
    ) -> Result<LayerNormForwardOut, ShapeError> {
        const OP: &str = "layernorm";
        with_dtype!(c.x.dtype(), T => {
            let x = c.x.typed::<T>(OP, "x")?;
            let mut y = x.to_vec();
            let (mut mean, mut rstd) = (vec![0.0; c.shape.rows], vec![0.0; c.shape.rows]);
            cpu::layernorm_forward(&c.shape, c.eps, x, c.weight.typed::<T>(OP, "weight")?, c.bias.typed::<T>(OP, "bias")?, &mut y, &mut mean, &mut rstd)?;
            Ok(LayerNormForwardOut { y: TensorData::from_slice(&y), mean, rstd })
        })
    }

    fn layernorm_backward(
        &mut self,
        c: &LayerNormBackwardCase,
    ) -> Result<LayerNormBackwardOut, ShapeError> {
        const OP: &str = "layernorm";
        with_dtype!(c.x.dtype(), T => {
            let (x, w) = (c.x.typed::<T>(OP, "x")?, c.weight.typed::<T>(OP, "weight")?);
            let (mut dx, mut dw, mut db) = (x.to_vec(), w.to_vec(), w.to_vec());
            cpu::layernorm_backward(&c.shape, x, w, c.dy.typed::<T>(OP, "dy")?, &c.mean, &c.rstd, &mut dx, &mut dw, &mut db)?;
            Ok(LayerNormBackwardOut { dx: TensorData::from_slice(&dx), dweight: TensorData::from_slice(&dw), dbias: TensorData::from_slice(&db) })
        })
    }

    fn attention_forward(
        &mut self,
        c: &AttentionForwardCase,
    ) -> Result<AttentionForwardOut, ShapeError> {
        const OP: &str = "attention";
        with_dtype!(c.q.dtype(), T => {
            let q = c.q.typed::<T>(OP, "q")?;
            let mut out = q.to_vec();
            let mut lse = vec![0.0; c.shape.lse_len()?];
            cpu::attention_forward(&c.shape, q, c.k.typed::<T>(OP, "k")?, c.v.typed::<T>(OP, "v")?, &mut out, &mut lse)?;
            Ok(AttentionForwardOut { out: TensorData::from_slice(&out), lse })
        })
    }

    fn attention_backward(
        &mut self,
        c: &AttentionBackwardCase,
    ) -> Result<AttentionBackwardOut, ShapeError> {
        const OP: &str = "attention";
        with_dtype!(c.q.dtype(), T => {
            let (q, k, v) = (c.q.typed::<T>(OP, "q")?, c.k.typed::<T>(OP, "k")?, c.v.typed::<T>(OP, "v")?);
            let (mut dq, mut dk, mut dv) = (q.to_vec(), k.to_vec(), v.to_vec());
            cpu::attention_backward(&c.shape, q, k, v, c.out.typed::<T>(OP, "out")?, c.dout.typed::<T>(OP, "dout")?, &c.lse, &mut dq, &mut dk, &mut dv)?;
            Ok(AttentionBackwardOut { dq: TensorData::from_slice(&dq), dk: TensorData::from_slice(&dk), dv: TensorData::from_slice(&dv) })
        })
    }

    fn adamw(&mut self, c: &AdamWCase) -> Result<AdamWOut, ShapeError> {
        const OP: &str = "adamw";
        with_dtype!(c.param.dtype(), T => {
            let mut param = c.param.typed::<T>(OP, "param")?.to_vec();
            let (mut exp_avg, mut exp_avg_sq, mut max_sq) = (c.exp_avg.clone(), c.exp_avg_sq.clone(), c.max_exp_avg_sq.clone());
            cpu::adamw(&c.config, &c.step, &mut param, c.grad.typed::<T>(OP, "grad")?, &mut exp_avg, &mut exp_avg_sq, max_sq.as_deref_mut())?;
            Ok(AdamWOut { param: TensorData::from_slice(&param), exp_avg, exp_avg_sq, max_exp_avg_sq: max_sq })
        })
    }
}
