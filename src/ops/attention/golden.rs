//! Golden cases of `attention_forward` and `attention_backward`: parsing and running them.

use super::{AttentionBackward, AttentionForward, AttentionKernel, AttentionParams};
use crate::golden::{
    download, download_f32, f32s, upload, Case, CaseReader, GoldenCase, GoldenError, GoldenOp,
    Outputs, TensorData, Want,
};
use crate::ops::OpError;
use crate::params::{DType, Element};
use crate::tolerance::{tolerance, Rule, Tolerance};
use crate::{cpu, ops, with_dtype};
use hip_rt::{DeviceBuffer, Stream};
use std::any::Any;

/// The golden ops of this family.
pub(crate) const GOLDEN: &[GoldenOp] = &[
    GoldenOp {
        name: "attention_forward",
        parse: parse_forward,
    },
    GoldenOp {
        name: "attention_backward",
        parse: parse_backward,
    },
    GoldenOp {
        name: "attention_forward_strided",
        parse: super::golden_strided::parse_forward,
    },
    GoldenOp {
        name: "attention_backward_strided",
        parse: super::golden_strided::parse_backward,
    },
];

/// Inputs of an `attention_forward` case.
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionForwardCase {
    /// Dimensions, mask and scale.
    pub params: AttentionParams,
    /// `[B, H, Tq, D]`.
    pub q: TensorData,
    /// `[B, K, Tk, D]` (K = `n_kv_heads`).
    pub k: TensorData,
    /// `[B, K, Tk, D]`.
    pub v: TensorData,
    /// Variable-length sequences `[B, n + 1]` (int32), if any.
    pub cu_seqlens: Option<Vec<i32>>,
}

/// Inputs of an `attention_backward` case.
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionBackwardCase {
    /// Dimensions, mask and scale.
    pub params: AttentionParams,
    /// `[B, H, Tq, D]`.
    pub q: TensorData,
    /// `[B, K, Tk, D]` (K = `n_kv_heads`).
    pub k: TensorData,
    /// `[B, K, Tk, D]`.
    pub v: TensorData,
    /// Variable-length sequences `[B, n + 1]` (int32), if any.
    pub cu_seqlens: Option<Vec<i32>>,
    /// Saved forward output `[B, H, Tq, D]`.
    pub out: TensorData,
    /// Gradient of `out`.
    pub dout: TensorData,
    /// Saved log-sum-exp `[B, H, Tq]`.
    pub lse: Vec<f32>,
}

const OP: &str = AttentionParams::OP;

/// What both directions share: params, dtype, the q and kv shapes, and `q`, `k`, `v`.
struct Common {
    params: AttentionParams,
    dtype: DType,
    q_shape: Vec<usize>,
    kv_shape: Vec<usize>,
    q: TensorData,
    k: TensorData,
    v: TensorData,
    cu_seqlens: Option<Vec<i32>>,
}

fn common(r: &mut CaseReader<'_>) -> Result<Common, GoldenError> {
    let (causal, scale) = (r.meta_bool("causal")?, r.meta_f32("scale")?);
    let (dtype, q_shape) = r.primary("q")?;
    let (_, k_shape) = r.primary("k")?;
    let [batch, heads, tq, head_dim] = q_shape[..] else {
        return Err(r.shape_err("q", "[B, H, Tq, D]".into(), &q_shape));
    };
    // k: [B, K, Tk, D] with K key/value heads (grouped-query attention when K < H).
    let (n_kv_heads, tk) = match k_shape[..] {
        [_, kv, tk, _] => (kv, tk),
        _ => return Err(r.shape_err("k", "[B, K, Tk, D]".into(), &k_shape)),
    };
    let params = AttentionParams {
        batch,
        heads,
        n_kv_heads,
        tq,
        tk,
        head_dim,
        causal,
        scale,
    };
    let kv_shape = vec![batch, n_kv_heads, tk, head_dim];
    let q = r.take("q", Want::Case, dtype, None)?.data;
    let k = r.take("k", Want::Case, dtype, Some(&kv_shape))?.data;
    let v = r.take("v", Want::Case, dtype, Some(&kv_shape))?.data;
    let cu_seqlens = match r.take_i32("cu_seqlens", None) {
        Ok((shape, cu)) => match shape[..] {
            [b, _] if b == batch => Some(cu),
            _ => return Err(r.shape_err("cu_seqlens", "[B, n + 1]".into(), &shape)),
        },
        Err(GoldenError::MissingTensor { .. }) => None,
        Err(e) => return Err(e),
    };
    Ok(Common {
        params,
        dtype,
        q_shape,
        kv_shape,
        q,
        k,
        v,
        cu_seqlens,
    })
}

fn parse_forward(r: &mut CaseReader<'_>) -> Result<Case, GoldenError> {
    let c = common(r)?;
    let p = c.params;
    let expected = r.expected(
        &[
            ("out", Want::Case, c.q_shape.clone()),
            ("lse", Want::F32, vec![p.batch, p.heads, p.tq]),
        ],
        c.dtype,
    )?;
    let case = AttentionForwardCase {
        params: p,
        q: c.q,
        k: c.k,
        v: c.v,
        cu_seqlens: c.cu_seqlens,
    };
    Ok(r.finish(c.dtype, Box::new(case), expected))
}

fn parse_backward(r: &mut CaseReader<'_>) -> Result<Case, GoldenError> {
    let c = common(r)?;
    let p = c.params;
    let (dtype, q_shape) = (c.dtype, &c.q_shape);
    let out = r.take("out", Want::Case, dtype, Some(q_shape))?.data;
    let dout = r.take("dout", Want::Case, dtype, Some(q_shape))?.data;
    let lse_shape = [p.batch, p.heads, p.tq];
    let lse = f32s(r.take("lse", Want::F32, dtype, Some(&lse_shape))?);
    let expected = r.expected(
        &[
            ("dq", Want::Case, q_shape.clone()),
            ("dk", Want::Case, c.kv_shape.clone()),
            ("dv", Want::Case, c.kv_shape.clone()),
        ],
        dtype,
    )?;
    let case = AttentionBackwardCase {
        params: p,
        q: c.q,
        k: c.k,
        v: c.v,
        cu_seqlens: c.cu_seqlens,
        out,
        dout,
        lse,
    };
    Ok(r.finish(dtype, Box::new(case), expected))
}

impl GoldenCase for AttentionForwardCase {
    fn op(&self) -> &'static str {
        "attention_forward"
    }

    fn run_cpu(&self) -> Result<Outputs, OpError> {
        with_dtype!(self.q.dtype(), T => {
            let q = self.q.typed::<T>(OP, "q")?;
            let mut out = q.to_vec();
            let mut lse = vec![0.0; self.params.lse_len()?];
            cpu::attention_forward(AttentionForward::<_, T> {
                params: self.params,
                q,
                k: self.k.typed::<T>(OP, "k")?,
                v: self.v.typed::<T>(OP, "v")?,
                out: &mut out,
                lse: &mut lse,
                cu_seqlens: self.cu_seqlens.as_deref(),
            })?;
            Ok(vec![("out", TensorData::from_slice(&out)), ("lse", TensorData::F32(lse))])
        })
    }

    fn run_device(&self, s: &Stream) -> Result<Outputs, OpError> {
        self.run_device_with(s, AttentionKernel::Auto)
    }

    fn tolerance(&self, output: &str, dtype: DType) -> Tolerance {
        let len = self.params.tk.max(self.params.head_dim);
        tolerance(Rule::Reduction, output, dtype, self.q.dtype(), len)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl AttentionForwardCase {
    /// [`GoldenCase::run_device`] on the kernel family `kernel` (the golden tests of the
    /// matrix-core kernels pass [`AttentionKernel::MatrixCore`]).
    pub fn run_device_with(&self, s: &Stream, kernel: AttentionKernel) -> Result<Outputs, OpError> {
        with_dtype!(self.q.dtype(), T => {
            let q = self.q.typed::<T>(OP, "q")?;
            let (dq, dk, dv) = (upload(s, q)?, upload(s, self.k.typed::<T>(OP, "k")?)?, upload(s, self.v.typed::<T>(OP, "v")?)?);
            let mut out = DeviceBuffer::<T>::zeroed(s, q.len())?;
            let mut lse = DeviceBuffer::<f32>::zeroed(s, self.params.lse_len()?)?;
            let cu = self.cu_seqlens.as_deref().map(|c| DeviceBuffer::from_slice(s, c)).transpose()?;
            ops::attention_forward_with(s, AttentionForward {
                params: self.params,
                q: &dq,
                k: &dk,
                v: &dv,
                out: &mut out,
                lse: &mut lse,
                cu_seqlens: cu.as_ref().map(|c| c as _),
            }, kernel)?;
            Ok(vec![("out", download(s, &out)?), ("lse", TensorData::F32(download_f32(s, &lse)?))])
        })
    }
}

impl GoldenCase for AttentionBackwardCase {
    fn op(&self) -> &'static str {
        "attention_backward"
    }

    fn run_cpu(&self) -> Result<Outputs, OpError> {
        with_dtype!(self.q.dtype(), T => {
            let (q, k, v) = (self.q.typed::<T>(OP, "q")?, self.k.typed::<T>(OP, "k")?, self.v.typed::<T>(OP, "v")?);
            let (mut dq, mut dk, mut dv) = (q.to_vec(), k.to_vec(), v.to_vec());
            cpu::attention_backward(AttentionBackward::<_, T> {
                params: self.params,
                q,
                k,
                v,
                out: self.out.typed::<T>(OP, "out")?,
                dout: self.dout.typed::<T>(OP, "dout")?,
                lse: &self.lse,
                dq: &mut dq,
                dk: &mut dk,
                dv: &mut dv,
                cu_seqlens: self.cu_seqlens.as_deref(),
            })?;
            Ok(vec![
                ("dq", TensorData::from_slice(&dq)),
                ("dk", TensorData::from_slice(&dk)),
                ("dv", TensorData::from_slice(&dv)),
            ])
        })
    }

    fn run_device(&self, s: &Stream) -> Result<Outputs, OpError> {
        self.run_device_with(s, AttentionKernel::Auto)
    }

    fn tolerance(&self, output: &str, dtype: DType) -> Tolerance {
        let p = &self.params;
        // dq reduces over the keys, dk and dv over the queries.
        let len = if output == "dq" { p.tk } else { p.tq }.max(p.head_dim);
        tolerance(
            Rule::RoundedIntermediates,
            output,
            dtype,
            self.q.dtype(),
            len,
        )
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl AttentionBackwardCase {
    /// [`GoldenCase::run_device`] on the kernel family `kernel` (the golden tests of the
    /// matrix-core kernels pass [`AttentionKernel::MatrixCore`]).
    pub fn run_device_with(&self, s: &Stream, kernel: AttentionKernel) -> Result<Outputs, OpError> {
        with_dtype!(self.q.dtype(), T => {
            let (q, k, v) = (self.q.typed::<T>(OP, "q")?, self.k.typed::<T>(OP, "k")?, self.v.typed::<T>(OP, "v")?);
            let (bq, bk, bv) = (upload(s, q)?, upload(s, k)?, upload(s, v)?);
            let (bo, bdo) = (upload(s, self.out.typed::<T>(OP, "out")?)?, upload(s, self.dout.typed::<T>(OP, "dout")?)?);
            let blse = upload(s, &self.lse)?;
            // Garbage in the outputs: every element must be written.
            let nan = <T as Element>::from_f64(f64::NAN);
            let mut dq = upload(s, &vec![nan; q.len()])?;
            let mut dk = upload(s, &vec![nan; k.len()])?;
            let mut dv = upload(s, &vec![nan; v.len()])?;
            let cu = self.cu_seqlens.as_deref().map(|c| DeviceBuffer::from_slice(s, c)).transpose()?;
            ops::attention_backward_with(s, AttentionBackward {
                params: self.params,
                q: &bq,
                k: &bk,
                v: &bv,
                out: &bo,
                dout: &bdo,
                lse: &blse,
                dq: &mut dq,
                dk: &mut dk,
                dv: &mut dv,
                cu_seqlens: cu.as_ref().map(|c| c as _),
            }, kernel)?;
            Ok(vec![("dq", download(s, &dq)?), ("dk", download(s, &dk)?), ("dv", download(s, &dv)?)])
        })
    }
}
