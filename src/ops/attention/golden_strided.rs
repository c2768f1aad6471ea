//! Golden cases of `attention_forward_strided` and `attention_backward_strided`: q, k, v read
//! from one stored `qkv` tensor, `[B, T, 3, H, D]` (`layout = bt3hd`, output `[B, T, H, D]`) or
//! `[3, B, H, T, D]` (`layout = packed`, output `[B, H, T, D]`).

use super::golden::AttentionSpace;
use super::{
    AttentionBackwardStrided, AttentionForwardStrided, AttentionKernel, AttentionLayout,
    AttentionParams, Qkv, Strided,
};
use crate::golden::{f32s, Case, CaseReader, GoldenCase, GoldenError, Outputs, TensorData, Want};
use crate::ops::OpError;
use crate::params::{DType, OnDevice};
use crate::tolerance::{tolerance, Rule, Tolerance};
use crate::{golden_runs, with_dtype};
use hip_rt::Stream;
use std::any::Any;

/// Inputs of an `attention_forward_strided` or `attention_backward_strided` case.
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionStridedCase {
    /// Dimensions, mask and scale (`tq = tk = T`).
    pub params: AttentionParams,
    /// `[B, T, 3, H, D]` rows (true) or packed `[3, B, H, T, D]` (false).
    pub fused: bool,
    /// The stored q, k, v.
    pub qkv: TensorData,
    /// Backward only: the forward's output, `dout` (output layout) and `lse`.
    pub backward: Option<(TensorData, TensorData, Vec<f32>)>,
}

impl AttentionStridedCase {
    fn qkv_layout(&self, w: Qkv) -> AttentionLayout {
        let p = &self.params;
        let (t, h, d) = (p.tq, p.heads, p.head_dim);
        if self.fused {
            AttentionLayout::fused_qkv(w, t, h, d)
        } else {
            AttentionLayout {
                offset: w as usize * p.batch * h * t * d,
                ..AttentionLayout::packed(h, t, d)
            }
        }
    }

    fn out_layout(&self) -> AttentionLayout {
        let p = &self.params;
        if self.fused {
            AttentionLayout::bthd(p.tq, p.heads, p.head_dim)
        } else {
            AttentionLayout::packed(p.heads, p.tq, p.head_dim)
        }
    }
}

fn parse(r: &mut CaseReader<'_>, backward: bool) -> Result<Case, GoldenError> {
    let causal = r.meta_bool("causal")?;
    let scale = r.meta_f32("scale")?;
    let layout = r.meta_str("layout")?;
    let (dtype, s) = r.primary("qkv")?;
    let fused = match layout.as_str() {
        "bt3hd" => true,
        "packed" => false,
        _ => return Err(r.shape_err("qkv", "layout bt3hd or packed".into(), &s)),
    };
    let dims = match (fused, &s[..]) {
        (true, &[b, t, 3, h, d]) => (b, t, h, d),
        (false, &[3, b, h, t, d]) => (b, t, h, d),
        _ => return Err(r.shape_err("qkv", "[B, T, 3, H, D] or [3, B, H, T, D]".into(), &s)),
    };
    let (batch, t, heads, head_dim) = dims;
    let params = AttentionParams {
        batch,
        heads,
        n_kv_heads: heads,
        tq: t,
        tk: t,
        head_dim,
        causal,
        scale,
    };
    let qkv = r.take("qkv", Want::Case, dtype, None)?.data;
    let out_shape = if fused {
        vec![batch, t, heads, head_dim]
    } else {
        vec![batch, heads, t, head_dim]
    };
    let lse_shape = vec![batch, heads, t];
    let (back, expected) = if backward {
        let out = r.take("out", Want::Case, dtype, Some(&out_shape))?.data;
        let dout = r.take("dout", Want::Case, dtype, Some(&out_shape))?.data;
        let lse = f32s(r.take("lse", Want::F32, dtype, Some(&lse_shape))?);
        let e = r.expected(&[("dqkv", Want::Case, s.clone())], dtype)?;
        (Some((out, dout, lse)), e)
    } else {
        let e = r.expected(
            &[
                ("out", Want::Case, out_shape),
                ("lse", Want::F32, lse_shape),
            ],
            dtype,
        )?;
        (None, e)
    };
    let case = AttentionStridedCase {
        params,
        fused,
        qkv,
        backward: back,
    };
    Ok(r.finish(dtype, Box::new(case), expected))
}

pub(super) fn parse_forward(r: &mut CaseReader<'_>) -> Result<Case, GoldenError> {
    parse(r, false)
}

pub(super) fn parse_backward(r: &mut CaseReader<'_>) -> Result<Case, GoldenError> {
    parse(r, true)
}

const OP: &str = "attention";

impl AttentionStridedCase {
    /// The case on the space `S` with the kernel family `kernel`.
    fn run_on<S: AttentionSpace>(
        &self,
        q: S::Queue<'_>,
        kernel: AttentionKernel,
    ) -> Result<Outputs, OpError> {
        let p = self.params;
        with_dtype!(self.qkv.dtype(), T => {
            let qkv = S::typed::<T>(q, &self.qkv, OP, "qkv")?;
            let view = |w| Strided::<S, T> { data: S::input(&qkv), layout: self.qkv_layout(w) };
            let out_layout = self.out_layout();
            // NaN in every output: the views cover the whole buffers, so each element must be
            // written.
            match &self.backward {
                None => {
                    let mut out = S::nan::<T>(q, p.q_len()?)?;
                    let mut lse = S::nan::<f32>(q, p.lse_len()?)?;
                    S::forward_strided(q, AttentionForwardStrided::<S, T> {
                        params: p, q: view(Qkv::Q), k: view(Qkv::K), v: view(Qkv::V),
                        out: S::output(&mut out), out_layout, lse: S::output(&mut lse),
                        cu_seqlens: None,
                    }, kernel)?;
                    Ok(vec![("out", S::tensor(q, &out)?), ("lse", S::tensor(q, &lse)?)])
                }
                Some((out, dout, lse)) => {
                    let bo = S::typed::<T>(q, out, OP, "out")?;
                    let bdo = S::typed::<T>(q, dout, OP, "dout")?;
                    let blse = S::upload(q, lse)?;
                    let mut dqkv = S::nan::<T>(q, self.qkv.len())?;
                    S::backward_strided(q, AttentionBackwardStrided::<S, T> {
                        params: p, q: view(Qkv::Q), k: view(Qkv::K), v: view(Qkv::V),
                        out: Strided { data: S::input(&bo), layout: out_layout },
                        dout: Strided { data: S::input(&bdo), layout: out_layout },
                        lse: S::input(&blse),
                        dqkv: S::output(&mut dqkv),
                        dq: self.qkv_layout(Qkv::Q), dk: self.qkv_layout(Qkv::K), dv: self.qkv_layout(Qkv::V),
                        cu_seqlens: None,
                    }, kernel)?;
                    Ok(vec![("dqkv", S::tensor(q, &dqkv)?)])
                }
            }
        })
    }

    /// The case on the default kernel family (what [`crate::golden_runs!`] runs).
    fn run<S: AttentionSpace>(&self, q: S::Queue<'_>) -> Result<Outputs, OpError> {
        self.run_on::<S>(q, AttentionKernel::Auto)
    }

    /// [`GoldenCase::run_device`] on the kernel family `kernel` (the golden tests of the
    /// matrix-core kernels pass [`AttentionKernel::MatrixCore`]): the same generic run.
    pub fn run_device_with(&self, s: &Stream, kernel: AttentionKernel) -> Result<Outputs, OpError> {
        self.run_on::<OnDevice>(s, kernel)
    }
}

impl GoldenCase for AttentionStridedCase {
    fn op(&self) -> &'static str {
        if self.backward.is_some() {
            "attention_backward_strided"
        } else {
            "attention_forward_strided"
        }
    }

    golden_runs!();

    fn tolerance(&self, output: &str, dtype: DType) -> Tolerance {
        let p = &self.params;
        let len = p.tk.max(p.head_dim);
        // The backward too: the kernels keep P and dS in f32, nothing is rounded to the
        // storage type before the output (see `Rule::Reduction`'s note on attention).
        tolerance(Rule::Reduction, output, dtype, self.qkv.dtype(), len)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
