//! Golden cases of `attention_forward` and `attention_backward`: parsing and running them.

use super::{
    AttentionBackward, AttentionBackwardStrided, AttentionForward, AttentionForwardStrided,
    AttentionKernel, AttentionParams,
};
use crate::golden::{
    f32s, Case, CaseReader, GoldenCase, GoldenError, GoldenOp, GoldenSpace, Outputs, TensorData,
    Want,
};
use crate::ops::{OpError, Run};
use crate::params::{DType, DeviceElement, Host, OnDevice};
use crate::tolerance::{tolerance, Rule, Tolerance};
use crate::{golden_runs, ops, with_dtype};
use hip_rt::Stream;
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

/// A [`GoldenSpace`] that runs the attention ops on a chosen kernel family: the golden runs of
/// this family are one generic function per case that takes the choice. The CPU reference has
/// one algorithm (the choice does not apply); a device launches the family asked for
/// ([`AttentionKernel::Auto`] for [`GoldenCase::run_device`], the matrix-core tests pass
/// [`AttentionKernel::MatrixCore`]).
pub(super) trait AttentionSpace: GoldenSpace + Sized {
    /// [`AttentionForward`] on `kernel`.
    fn forward<T: DeviceElement>(
        q: Self::Queue<'_>,
        a: AttentionForward<'_, Self, T>,
        kernel: AttentionKernel,
    ) -> Result<(), OpError>;

    /// [`AttentionBackward`] on `kernel`.
    fn backward<T: DeviceElement>(
        q: Self::Queue<'_>,
        a: AttentionBackward<'_, Self, T>,
        kernel: AttentionKernel,
    ) -> Result<(), OpError>;

    /// [`AttentionForwardStrided`] on `kernel`.
    fn forward_strided<T: DeviceElement>(
        q: Self::Queue<'_>,
        a: AttentionForwardStrided<'_, Self, T>,
        kernel: AttentionKernel,
    ) -> Result<(), OpError>;

    /// [`AttentionBackwardStrided`] on `kernel`.
    fn backward_strided<T: DeviceElement>(
        q: Self::Queue<'_>,
        a: AttentionBackwardStrided<'_, Self, T>,
        kernel: AttentionKernel,
    ) -> Result<(), OpError>;
}

impl AttentionSpace for Host {
    fn forward<T: DeviceElement>(
        (): (),
        a: AttentionForward<'_, Host, T>,
        _: AttentionKernel,
    ) -> Result<(), OpError> {
        a.run(())
    }

    fn backward<T: DeviceElement>(
        (): (),
        a: AttentionBackward<'_, Host, T>,
        _: AttentionKernel,
    ) -> Result<(), OpError> {
        a.run(())
    }

    fn forward_strided<T: DeviceElement>(
        (): (),
        a: AttentionForwardStrided<'_, Host, T>,
        _: AttentionKernel,
    ) -> Result<(), OpError> {
        a.run(())
    }

    fn backward_strided<T: DeviceElement>(
        (): (),
        a: AttentionBackwardStrided<'_, Host, T>,
        _: AttentionKernel,
    ) -> Result<(), OpError> {
        a.run(())
    }
}

impl AttentionSpace for OnDevice {
    fn forward<T: DeviceElement>(
        s: &Stream,
        a: AttentionForward<'_, OnDevice, T>,
        kernel: AttentionKernel,
    ) -> Result<(), OpError> {
        ops::attention_forward_with(s, a, kernel)
    }

    fn backward<T: DeviceElement>(
        s: &Stream,
        a: AttentionBackward<'_, OnDevice, T>,
        kernel: AttentionKernel,
    ) -> Result<(), OpError> {
        ops::attention_backward_with(s, a, kernel)
    }

    fn forward_strided<T: DeviceElement>(
        s: &Stream,
        a: AttentionForwardStrided<'_, OnDevice, T>,
        kernel: AttentionKernel,
    ) -> Result<(), OpError> {
        ops::attention_forward_strided_with(s, a, kernel)
    }

    fn backward_strided<T: DeviceElement>(
        s: &Stream,
        a: AttentionBackwardStrided<'_, OnDevice, T>,
        kernel: AttentionKernel,
    ) -> Result<(), OpError> {
        ops::attention_backward_strided_with(s, a, kernel)
    }
}

impl AttentionForwardCase {
    /// The case on the space `S` with the kernel family `kernel`.
    fn run_on<S: AttentionSpace>(
        &self,
        q: S::Queue<'_>,
        kernel: AttentionKernel,
    ) -> Result<Outputs, OpError> {
        with_dtype!(self.q.dtype(), T => {
            let bq = S::typed::<T>(q, &self.q, OP, "q")?;
            let bk = S::typed::<T>(q, &self.k, OP, "k")?;
            let bv = S::typed::<T>(q, &self.v, OP, "v")?;
            // NaN in the outputs: every element must be written.
            let mut out = S::nan::<T>(q, self.q.len())?;
            let mut lse = S::nan::<f32>(q, self.params.lse_len()?)?;
            let cu = self.cu_seqlens.as_deref().map(|c| S::upload(q, c)).transpose()?;
            S::forward(q, AttentionForward::<S, T> {
                params: self.params,
                q: S::input(&bq),
                k: S::input(&bk),
                v: S::input(&bv),
                out: S::output(&mut out),
                lse: S::output(&mut lse),
                cu_seqlens: cu.as_ref().map(S::input),
            }, kernel)?;
            Ok(vec![("out", S::tensor(q, &out)?), ("lse", S::tensor(q, &lse)?)])
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

impl GoldenCase for AttentionForwardCase {
    fn op(&self) -> &'static str {
        "attention_forward"
    }

    golden_runs!();

    fn tolerance(&self, output: &str, dtype: DType) -> Tolerance {
        let len = self.params.tk.max(self.params.head_dim);
        tolerance(Rule::Reduction, output, dtype, self.q.dtype(), len)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl AttentionBackwardCase {
    /// The case on the space `S` with the kernel family `kernel`.
    fn run_on<S: AttentionSpace>(
        &self,
        q: S::Queue<'_>,
        kernel: AttentionKernel,
    ) -> Result<Outputs, OpError> {
        with_dtype!(self.q.dtype(), T => {
            let bq = S::typed::<T>(q, &self.q, OP, "q")?;
            let bk = S::typed::<T>(q, &self.k, OP, "k")?;
            let bv = S::typed::<T>(q, &self.v, OP, "v")?;
            let bo = S::typed::<T>(q, &self.out, OP, "out")?;
            let bdo = S::typed::<T>(q, &self.dout, OP, "dout")?;
            let blse = S::upload(q, &self.lse)?;
            // NaN in the outputs: every element must be written.
            let mut dq = S::nan::<T>(q, self.q.len())?;
            let mut dk = S::nan::<T>(q, self.k.len())?;
            let mut dv = S::nan::<T>(q, self.v.len())?;
            let cu = self.cu_seqlens.as_deref().map(|c| S::upload(q, c)).transpose()?;
            S::backward(q, AttentionBackward::<S, T> {
                params: self.params,
                q: S::input(&bq),
                k: S::input(&bk),
                v: S::input(&bv),
                out: S::input(&bo),
                dout: S::input(&bdo),
                lse: S::input(&blse),
                dq: S::output(&mut dq),
                dk: S::output(&mut dk),
                dv: S::output(&mut dv),
                cu_seqlens: cu.as_ref().map(S::input),
            }, kernel)?;
            Ok(vec![("dq", S::tensor(q, &dq)?), ("dk", S::tensor(q, &dk)?), ("dv", S::tensor(q, &dv)?)])
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

impl GoldenCase for AttentionBackwardCase {
    fn op(&self) -> &'static str {
        "attention_backward"
    }

    golden_runs!();

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
