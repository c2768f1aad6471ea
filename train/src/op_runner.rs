//! Where a backend's tensors live and which function runs an op there ([`OpRunner`]), and the one
//! implementation of [`Backend`] over it: every op's argument struct (the Space-generic structs
//! of `hip_kernels::ops`) is built here once, for [`hip_kernels::params::Host`] (run by
//! `hip_kernels::cpu`, [`crate::cpu_backend`]) and [`hip_kernels::params::OnDevice`] (run by the
//! launchers of `hip_kernels::ops` on a stream, [`crate::device_backend`]) alike.

use crate::backend::TrainElement;
use crate::backend::{AdamWSlot, AdamWStep, Backend, Dims, Gemm, GradScaling, MemStats, StepRead};
use crate::error::Result;
use hip_kernels::ops::{
    AdamW, AdamWParams, AdamWTensor, AttentionBackwardStrided, AttentionForwardStrided,
    AttentionLayout, AttentionParams, BiasBackward, BiasParams, CrossEntropyParams,
    ElementwiseParams, EncoderBackward, EncoderForward, EncoderParams, GeluBackward, GeluForward,
    LayerNormBackward, LayerNormForward, LayerNormParams, Matmul, MatmulBias, MatmulBiasParams,
    MatmulLayout, MatmulParams, Qkv, ResidualLayerNormForward, SoftmaxCrossEntropy, Strided,
};
use hip_kernels::params::{DType, Space};

/// A tensor an op of runner `E` reads.
pub type In<'a, E, T> = <<E as OpRunner>::Space as Space>::In<'a, T>;
/// A tensor an op of runner `E` writes.
pub type Out<'a, E, T> = <<E as OpRunner>::Space as Space>::Out<'a, T>;

/// What differs between the CPU reference and a device: where buffers live, how they are made
/// and read, and which function runs each op (one line per op). Everything else of
/// [`Backend`] is written once, below, over this trait.
pub trait OpRunner {
    /// Where the op structs' tensors live.
    type Space: Space;
    /// A buffer of `T`.
    type Buf<T: TrainElement>;
    /// Token ids (i32), with whatever the backend keeps to report a bad one.
    type Ids;
    /// Per-step scalars kept until [`Backend::read_step`].
    type Scalars;

    /// `buf` as an op's input.
    fn view<T: TrainElement>(buf: &Self::Buf<T>) -> In<'_, Self, T>;
    /// `buf` as an op's output.
    fn view_mut<T: TrainElement>(buf: &mut Self::Buf<T>) -> Out<'_, Self, T>;
    /// The ids as an op's input.
    fn ids_view(ids: &Self::Ids) -> In<'_, Self, i32>;
    /// Elements in `buf`.
    fn len<T: TrainElement>(buf: &Self::Buf<T>) -> usize;

    /// Human-readable name for the progress output, for storage type `dtype`.
    fn describe(&self, dtype: DType) -> String;
    /// A zero-filled buffer.
    fn zeros<T: TrainElement>(&self, len: usize) -> Result<Self::Buf<T>>;
    /// A buffer holding `host` rounded to `T`.
    fn upload<T: TrainElement>(&self, host: &[f32]) -> Result<Self::Buf<T>>;
    /// The contents of `buf` widened to f32 (a host wait on a device).
    fn download<T: TrainElement>(&self, buf: &Self::Buf<T>) -> Result<Vec<f32>>;
    /// Set every element to 0.
    fn fill_zero<T: TrainElement>(&self, buf: &mut Self::Buf<T>) -> Result<()>;
    /// Token ids on the backend.
    fn ids(&self, host: &[i32]) -> Result<Self::Ids>;
    /// Fresh per-step scalars.
    fn scalars(&self) -> Result<Self::Scalars>;

    /// Runs [`EncoderForward`] (the device also range-checks the ids: see `error`).
    fn encoder_forward<T: TrainElement>(
        &self,
        d: &Dims,
        tokens: &Self::Ids,
        wte: &Self::Buf<T>,
        wpe: &Self::Buf<T>,
        out: &mut Self::Buf<T>,
    ) -> Result<()>;
    /// Runs [`SoftmaxCrossEntropy`] of one of `accum` micro-batches (built by
    /// [`cross_entropy_args`]) and adds its mean loss / `accum` to the step's loss.
    fn cross_entropy<T: TrainElement>(
        &self,
        d: &Dims,
        logits: &mut Self::Buf<T>,
        targets: &Self::Ids,
        dloss: f32,
        accum: usize,
        scalars: &mut Self::Scalars,
    ) -> Result<()>;
    /// Runs [`EncoderBackward`].
    fn run_encoder_backward<T: TrainElement>(
        &self,
        a: EncoderBackward<'_, Self::Space, T>,
    ) -> Result<()>;
    /// Runs [`Matmul`].
    fn run_matmul<T: TrainElement>(&self, a: Matmul<'_, Self::Space, T>) -> Result<()>;
    /// Runs [`MatmulBias`].
    fn run_matmul_bias<T: TrainElement>(&self, a: MatmulBias<'_, Self::Space, T>) -> Result<()>;
    /// Runs [`BiasBackward`].
    fn run_bias_backward<T: TrainElement>(&self, a: BiasBackward<'_, Self::Space, T>)
        -> Result<()>;
    /// Runs [`LayerNormForward`].
    fn run_layernorm_forward<T: TrainElement>(
        &self,
        a: LayerNormForward<'_, Self::Space, T>,
    ) -> Result<()>;
    /// Runs [`ResidualLayerNormForward`].
    fn run_residual_layernorm_forward<T: TrainElement>(
        &self,
        a: ResidualLayerNormForward<'_, Self::Space, T>,
    ) -> Result<()>;
    /// Runs [`LayerNormBackward`].
    fn run_layernorm_backward<T: TrainElement>(
        &self,
        a: LayerNormBackward<'_, Self::Space, T>,
    ) -> Result<()>;
    /// Runs [`AttentionForwardStrided`].
    fn run_attention_forward<T: TrainElement>(
        &self,
        a: AttentionForwardStrided<'_, Self::Space, T>,
    ) -> Result<()>;
    /// Runs [`AttentionBackwardStrided`].
    fn run_attention_backward<T: TrainElement>(
        &self,
        a: AttentionBackwardStrided<'_, Self::Space, T>,
    ) -> Result<()>;
    /// Runs [`GeluForward`].
    fn run_gelu_forward<T: TrainElement>(&self, a: GeluForward<'_, Self::Space, T>) -> Result<()>;
    /// Runs [`GeluBackward`].
    fn run_gelu_backward<T: TrainElement>(&self, a: GeluBackward<'_, Self::Space, T>)
        -> Result<()>;
    /// Runs [`AdamW`].
    fn run_adamw<T: TrainElement>(&self, a: AdamW<'_, '_, Self::Space, T>) -> Result<()>;

    /// Stores the global L2 norm of `grads` in `scalars`.
    fn grad_norm<T: TrainElement>(
        &self,
        grads: &[&Self::Buf<T>],
        scalars: &mut Self::Scalars,
    ) -> Result<()>;
    /// See [`Backend::grad_norm_sharded`] (one rank owns every tensor: [`OpRunner::grad_norm`]).
    fn grad_norm_sharded<T: TrainElement>(
        &self,
        owned: &[&Self::Buf<T>],
        scalars: &mut Self::Scalars,
    ) -> Result<()> {
        self.grad_norm(owned, scalars)
    }
    /// AdamW's one-element `grad_scale` (absent when 1: the loss scale, clipped by the norm in
    /// `scalars`) and `found_inf` (1 when that norm is not finite), computed without a host read.
    fn update_scalars(
        &self,
        scaling: GradScaling,
        scalars: &Self::Scalars,
    ) -> Result<UpdateScalars<Self::Buf<f32>>>;
    /// The step's loss (the mean over ranks) and gradient norm: the one host read of a step.
    fn read_step(&self, scalars: &Self::Scalars) -> Result<StepRead>;
    /// See [`Backend::grads_ready`] (one device: nothing to do).
    fn grads_ready<T: TrainElement>(
        &self,
        _grads: &mut [&mut Self::Buf<T>],
        _roots: Option<&[usize]>,
    ) -> Result<()> {
        Ok(())
    }
    /// See [`Backend::grads_reduced`].
    fn grads_reduced(&self) -> Result<()> {
        Ok(())
    }
    /// See [`Backend::world`].
    fn world(&self) -> usize {
        1
    }
    /// See [`Backend::rank`].
    fn rank(&self) -> usize {
        0
    }
    /// See [`Backend::broadcast`].
    fn broadcast<T: TrainElement>(&self, _bufs: &mut [(&mut Self::Buf<T>, usize)]) -> Result<()> {
        Ok(())
    }
    /// The allocator's figures (`None` without a device allocator).
    fn memory(&self) -> Option<MemStats> {
        None
    }
    /// Whether this is an emulated device (hip-emu).
    fn emulated(&self) -> bool {
        false
    }
    /// Start a new peak for [`MemStats::peak`].
    fn reset_peak_memory(&self) {}
}

/// AdamW's one-element device-side (or host) scalars of a step.
pub struct UpdateScalars<B> {
    /// Divides the stored gradients (loss scale and clipping); absent when it would be 1.
    pub grad_scale: Option<B>,
    /// 1 when the gradient norm is not finite: the update then changes nothing.
    pub found_inf: B,
}

impl Dims {
    /// Layer norm over the micro-batch's rows.
    pub fn ln(&self) -> LayerNormParams {
        LayerNormParams {
            rows: self.rows(),
            cols: self.channels,
            eps: self.eps,
        }
    }

    /// The embedding op on the micro-batch.
    pub fn encoder(&self, accumulate: bool) -> EncoderParams {
        EncoderParams {
            batch: self.batch,
            seq: self.seq,
            channels: self.channels,
            vocab: self.vocab,
            positions: self.positions,
            accumulate,
        }
    }

    /// Causal attention on the micro-batch, scale 1/√D.
    pub fn attention(&self) -> AttentionParams {
        let d = self.head_dim();
        AttentionParams {
            batch: self.batch,
            heads: self.heads,
            n_kv_heads: self.heads,
            tq: self.seq,
            tk: self.seq,
            head_dim: d,
            causal: true,
            scale: AttentionParams::default_scale(d),
        }
    }

    fn qkv_layouts(&self) -> [AttentionLayout; 3] {
        let (t, h, dd) = (self.seq, self.heads, self.head_dim());
        [Qkv::Q, Qkv::K, Qkv::V].map(|w| AttentionLayout::fused_qkv(w, t, h, dd))
    }

    fn bthd(&self) -> AttentionLayout {
        AttentionLayout::bthd(self.seq, self.heads, self.head_dim())
    }
}

/// A single row-major product `shape`, `out = op(A)·op(B) + beta·out`.
pub fn matmul_params(shape: Gemm, beta: f32) -> MatmulParams {
    MatmulParams {
        batch: 1,
        m: shape.m,
        n: shape.n,
        k: shape.k,
        trans_a: shape.trans_a,
        trans_b: shape.trans_b,
        alpha: 1.0,
        beta,
        layout: MatmulLayout::PACKED,
    }
}

/// The embedding forward: `out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]`, ids flagged in `error`.
pub fn encoder_forward_args<'a, S: Space, T: TrainElement>(
    d: &Dims,
    tokens: S::In<'a, i32>,
    [wte, wpe]: [S::In<'a, T>; 2],
    out: S::Out<'a, T>,
    error: Option<S::Out<'a, u32>>,
) -> EncoderForward<'a, S, T> {
    EncoderForward {
        params: d.encoder(false),
        tokens,
        wte,
        wpe,
        out,
        error,
    }
}

/// The fused softmax cross-entropy of a micro-batch: `logits` overwritten by their gradient
/// times `dloss`, per-row losses in `losses`, their mean in `loss` (when given), bad targets
/// flagged in `error`.
pub fn cross_entropy_args<'a, S: Space, T: TrainElement>(
    d: &Dims,
    dloss: f32,
    logits: S::Out<'a, T>,
    targets: S::In<'a, i32>,
    losses: S::Out<'a, f32>,
    loss: Option<S::Out<'a, f32>>,
    error: Option<S::Out<'a, u32>>,
) -> SoftmaxCrossEntropy<'a, S, T> {
    SoftmaxCrossEntropy {
        params: CrossEntropyParams {
            dloss: Some(dloss),
            ..CrossEntropyParams::new(d.rows(), d.vocab)
        },
        logits,
        targets,
        losses,
        loss,
        totals: None,
        error,
    }
}

/// torch.optim.AdamW's hyper-parameters of `hyper`.
fn adamw_params(hyper: &AdamWStep) -> AdamWParams {
    AdamWParams {
        lr: hyper.lr,
        beta1: hyper.beta1,
        beta2: hyper.beta2,
        eps: hyper.eps,
        weight_decay: hyper.weight_decay,
        maximize: false,
        amsgrad: false,
        step: hyper.step,
    }
}

impl<T: TrainElement, E: OpRunner> Backend<T> for E {
    type Buf = E::Buf<T>;
    type Stat = E::Buf<f32>;
    type Ids = E::Ids;
    type Scalars = E::Scalars;

    fn name(&self) -> String {
        self.describe(<T as hip_kernels::params::Element>::DTYPE)
    }

    fn len_of(&self, buf: &Self::Buf) -> usize {
        E::len(buf)
    }

    fn zeros(&self, len: usize) -> Result<Self::Buf> {
        OpRunner::zeros(self, len)
    }

    fn zeros_stat(&self, len: usize) -> Result<Self::Stat> {
        OpRunner::zeros(self, len)
    }

    fn upload(&self, host: &[f32]) -> Result<Self::Buf> {
        OpRunner::upload(self, host)
    }

    fn download(&self, buf: &Self::Buf) -> Result<Vec<f32>> {
        OpRunner::download(self, buf)
    }

    fn upload_stat(&self, host: &[f32]) -> Result<Self::Stat> {
        OpRunner::upload(self, host)
    }

    fn download_stat(&self, buf: &Self::Stat) -> Result<Vec<f32>> {
        OpRunner::download(self, buf)
    }

    fn fill_zero(&self, buf: &mut Self::Buf) -> Result<()> {
        OpRunner::fill_zero(self, buf)
    }

    fn ids(&self, host: &[i32]) -> Result<Self::Ids> {
        OpRunner::ids(self, host)
    }

    fn scalars(&self) -> Result<Self::Scalars> {
        OpRunner::scalars(self)
    }

    fn encoder_forward(
        &self,
        d: &Dims,
        tokens: &E::Ids,
        wte: &Self::Buf,
        wpe: &Self::Buf,
        out: &mut Self::Buf,
    ) -> Result<()> {
        OpRunner::encoder_forward(self, d, tokens, wte, wpe, out)
    }

    fn encoder_backward(
        &self,
        d: &Dims,
        tokens: &E::Ids,
        dout: &Self::Buf,
        dwte: &mut Self::Buf,
        dwpe: &mut Self::Buf,
    ) -> Result<()> {
        // The forward checked these ids; the kernel never indexes with a bad one.
        self.run_encoder_backward(EncoderBackward::<E::Space, T> {
            params: d.encoder(true),
            tokens: E::ids_view(tokens),
            dout: E::view(dout),
            dwte: E::view_mut(dwte),
            dwpe: E::view_mut(dwpe),
            error: None,
        })
    }

    fn matmul(
        &self,
        shape: Gemm,
        a: &Self::Buf,
        b: &Self::Buf,
        out: &mut Self::Buf,
        accumulate: bool,
    ) -> Result<()> {
        let beta = if accumulate { 1.0 } else { 0.0 };
        self.run_matmul(Matmul::<E::Space, T> {
            params: matmul_params(shape, beta),
            a: E::view(a),
            b: E::view(b),
            out: E::view_mut(out),
        })
    }

    fn matmul_scaled(
        &self,
        shape: Gemm,
        a: &Self::Buf,
        b: &Self::Buf,
        out: &mut Self::Buf,
        alpha: f32,
        beta: f32,
    ) -> Result<()> {
        self.run_matmul(Matmul::<E::Space, T> {
            params: MatmulParams {
                alpha,
                ..matmul_params(shape, beta)
            },
            a: E::view(a),
            b: E::view(b),
            out: E::view_mut(out),
        })
    }

    fn gelu_forward(&self, x: &Self::Buf, out: &mut Self::Buf) -> Result<()> {
        self.run_gelu_forward(GeluForward::<E::Space, T> {
            params: ElementwiseParams { len: E::len(x) },
            x: E::view(x),
            out: E::view_mut(out),
        })
    }

    fn matmul_bias(
        &self,
        shape: Gemm,
        a: &Self::Buf,
        b: &Self::Buf,
        bias: &Self::Buf,
        out: &mut Self::Buf,
        pre_gelu: Option<&mut Self::Buf>,
    ) -> Result<()> {
        self.run_matmul_bias(MatmulBias::<E::Space, T> {
            params: MatmulBiasParams {
                batch: 1,
                m: shape.m,
                n: shape.n,
                k: shape.k,
                trans_a: shape.trans_a,
                trans_b: shape.trans_b,
                gelu: pre_gelu.is_some(),
            },
            a: E::view(a),
            b: E::view(b),
            bias: E::view(bias),
            out: E::view_mut(out),
            pre_gelu: pre_gelu.map(|p| E::view_mut(p)),
        })
    }

    fn bias_backward(&self, rows: usize, dout: &Self::Buf, dbias: &mut Self::Buf) -> Result<()> {
        self.run_bias_backward(BiasBackward::<E::Space, T> {
            params: BiasParams {
                rows,
                cols: E::len(dbias),
                accumulate: true,
            },
            dout: E::view(dout),
            dbias: E::view_mut(dbias),
        })
    }

    fn layernorm_forward(
        &self,
        d: &Dims,
        x: &Self::Buf,
        weight: &Self::Buf,
        bias: &Self::Buf,
        y: &mut Self::Buf,
        mean: &mut Self::Stat,
        rstd: &mut Self::Stat,
    ) -> Result<()> {
        self.run_layernorm_forward(LayerNormForward::<E::Space, T> {
            params: d.ln(),
            x: E::view(x),
            weight: E::view(weight),
            bias: E::view(bias),
            y: E::view_mut(y),
            mean: E::view_mut(mean),
            rstd: E::view_mut(rstd),
        })
    }

    fn residual_layernorm_forward(
        &self,
        d: &Dims,
        a: &Self::Buf,
        b: &Self::Buf,
        weight: &Self::Buf,
        bias: &Self::Buf,
        residual: &mut Self::Buf,
        y: &mut Self::Buf,
        mean: &mut Self::Stat,
        rstd: &mut Self::Stat,
    ) -> Result<()> {
        self.run_residual_layernorm_forward(ResidualLayerNormForward::<E::Space, T> {
            params: d.ln(),
            a: E::view(a),
            b: E::view(b),
            weight: E::view(weight),
            bias: E::view(bias),
            residual: E::view_mut(residual),
            y: E::view_mut(y),
            mean: E::view_mut(mean),
            rstd: E::view_mut(rstd),
        })
    }

    fn layernorm_backward(
        &self,
        d: &Dims,
        x: &Self::Buf,
        weight: &Self::Buf,
        dy: &Self::Buf,
        mean: &Self::Stat,
        rstd: &Self::Stat,
        dresidual: &mut Self::Buf,
        dweight: &mut Self::Buf,
        dbias: &mut Self::Buf,
    ) -> Result<()> {
        // Accumulates into the step's gradients in place (one rounding to T).
        self.run_layernorm_backward(LayerNormBackward::<E::Space, T> {
            params: d.ln(),
            x: E::view(x),
            weight: E::view(weight),
            dy: E::view(dy),
            mean: E::view(mean),
            rstd: E::view(rstd),
            dx: E::view_mut(dresidual),
            dweight: E::view_mut(dweight),
            dbias: E::view_mut(dbias),
            accumulate: true,
        })
    }

    fn attention_forward(
        &self,
        d: &Dims,
        qkv: &Self::Buf,
        out: &mut Self::Buf,
        lse: &mut Self::Stat,
    ) -> Result<()> {
        // q, k, v read from the fused `qkv` [B, T, 3, H, D]; `out` [B, T, H, D].
        let [q, k, v] = d.qkv_layouts().map(|layout| Strided::<E::Space, T> {
            data: E::view(qkv),
            layout,
        });
        self.run_attention_forward(AttentionForwardStrided::<E::Space, T> {
            params: d.attention(),
            q,
            k,
            v,
            out: E::view_mut(out),
            out_layout: d.bthd(),
            lse: E::view_mut(lse),
            cu_seqlens: None,
        })
    }

    fn attention_backward(
        &self,
        d: &Dims,
        qkv: &Self::Buf,
        out: &Self::Buf,
        dout: &Self::Buf,
        lse: &Self::Stat,
        dqkv: &mut Self::Buf,
    ) -> Result<()> {
        // `dqkv` is written whole: the three fused layouts tile [B, T, 3, H, D].
        let [q, k, v] = d.qkv_layouts().map(|layout| Strided::<E::Space, T> {
            data: E::view(qkv),
            layout,
        });
        let [dq, dk, dv] = d.qkv_layouts();
        self.run_attention_backward(AttentionBackwardStrided::<E::Space, T> {
            params: d.attention(),
            q,
            k,
            v,
            out: Strided {
                data: E::view(out),
                layout: d.bthd(),
            },
            dout: Strided {
                data: E::view(dout),
                layout: d.bthd(),
            },
            lse: E::view(lse),
            dqkv: E::view_mut(dqkv),
            dq,
            dk,
            dv,
            cu_seqlens: None,
        })
    }

    fn gelu_backward(&self, pre: &Self::Buf, dout: &Self::Buf, dx: &mut Self::Buf) -> Result<()> {
        self.run_gelu_backward(GeluBackward::<E::Space, T> {
            params: ElementwiseParams { len: E::len(pre) },
            x: E::view(pre),
            dout: E::view(dout),
            dx: E::view_mut(dx),
        })
    }

    fn cross_entropy(
        &self,
        d: &Dims,
        logits: &mut Self::Buf,
        targets: &E::Ids,
        accum: usize,
        loss_scale: f64,
        scalars: &mut E::Scalars,
    ) -> Result<()> {
        let dloss = (loss_scale / accum as f64) as f32;
        OpRunner::cross_entropy(self, d, logits, targets, dloss, accum, scalars)
    }

    fn grad_norm(&self, grads: &[&Self::Buf], scalars: &mut E::Scalars) -> Result<()> {
        OpRunner::grad_norm(self, grads, scalars)
    }

    fn grad_norm_sharded(&self, owned: &[&Self::Buf], scalars: &mut E::Scalars) -> Result<()> {
        OpRunner::grad_norm_sharded(self, owned, scalars)
    }

    fn adamw_all(
        &self,
        hyper: &AdamWStep,
        scaling: GradScaling,
        scalars: &E::Scalars,
        tensors: &mut [AdamWSlot<'_, Self::Buf, Self::Stat>],
    ) -> Result<()> {
        let UpdateScalars {
            grad_scale,
            found_inf,
        } = self.update_scalars(scaling, scalars)?;
        let mut slots: Vec<AdamWTensor<'_, E::Space, T>> = tensors
            .iter_mut()
            .map(|t| AdamWTensor {
                param: E::view_mut(&mut *t.param),
                grad: E::view(t.grad),
                exp_avg: E::view_mut(&mut *t.exp_avg),
                exp_avg_sq: E::view_mut(&mut *t.exp_avg_sq),
                max_exp_avg_sq: None,
                master: t.master.as_deref_mut().map(|m| E::view_mut(m)),
                weight_decay: (!t.decay).then_some(0.0),
                lr_scale: None,
            })
            .collect();
        let done = self.run_adamw(AdamW::<E::Space, T> {
            params: adamw_params(hyper),
            grad_scale: grad_scale.as_ref().map(|g| E::view(g)),
            found_inf: Some(E::view(&found_inf)),
            tensors: &mut slots,
        });
        done
    }

    fn read_step(&self, scalars: &E::Scalars) -> Result<StepRead> {
        OpRunner::read_step(self, scalars)
    }

    fn grads_ready(&self, grads: &mut [&mut Self::Buf], roots: Option<&[usize]>) -> Result<()> {
        OpRunner::grads_ready(self, grads, roots)
    }

    fn grads_reduced(&self) -> Result<()> {
        OpRunner::grads_reduced(self)
    }

    fn world(&self) -> usize {
        OpRunner::world(self)
    }

    fn rank(&self) -> usize {
        OpRunner::rank(self)
    }

    fn broadcast(&self, bufs: &mut [(&mut Self::Buf, usize)]) -> Result<()> {
        OpRunner::broadcast(self, bufs)
    }

    fn broadcast_stat(&self, bufs: &mut [(&mut Self::Stat, usize)]) -> Result<()> {
        OpRunner::broadcast(self, bufs)
    }

    fn memory(&self) -> Option<MemStats> {
        OpRunner::memory(self)
    }

    fn emulated(&self) -> bool {
        OpRunner::emulated(self)
    }

    fn reset_peak_memory(&self) {
        OpRunner::reset_peak_memory(self)
    }
}
