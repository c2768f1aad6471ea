//! The CPU backend: every op is the crate's CPU reference (`hip_kernels::cpu`, f64 inside, each
//! output rounded once to its storage type: f32, bf16 or f16). The oracle, not a fast path.

use crate::backend::{AdamWSlot, AdamWStep, Backend, Dims, Gemm, GradScaling, StepRead};
use crate::error::{Result, TrainError};
use hip_kernels::cpu;
use hip_kernels::ops::{
    AdamW, AdamWParams, AdamWTensor, AttentionBackwardStrided, AttentionForwardStrided,
    AttentionLayout, AttentionParams, BiasBackward, BiasParams, ClipGradScale, ClipParams,
    CrossEntropyParams, ElementwiseParams, EncoderBackward, EncoderForward, EncoderParams,
    GeluBackward, LayerNormBackward, LayerNormForward, LayerNormParams, Matmul, MatmulBias,
    MatmulBiasParams, MatmulParams, Qkv, ResidualLayerNormForward, SoftmaxCrossEntropy, Strided,
};
use hip_kernels::params::{DeviceElement, Host, Space};

/// The CPU reference as a [`Backend`].
#[derive(Debug, Default, Clone, Copy)]
pub struct Cpu;

/// Per-step scalars of the CPU backend.
#[derive(Debug, Default, Clone, Copy)]
pub struct CpuScalars {
    loss: f64,
    norm: f64,
}

pub(crate) fn op(e: impl std::fmt::Display) -> TrainError {
    TrainError::Op(e.to_string())
}

impl Dims {
    pub(crate) fn ln(&self) -> LayerNormParams {
        LayerNormParams {
            rows: self.rows(),
            cols: self.channels,
            eps: self.eps,
        }
    }

    pub(crate) fn encoder(&self, accumulate: bool) -> EncoderParams {
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
    pub(crate) fn attention(&self) -> AttentionParams {
        let d = self.head_dim();
        AttentionParams {
            batch: self.batch,
            heads: self.heads,
            tq: self.seq,
            tk: self.seq,
            head_dim: d,
            causal: true,
            scale: AttentionParams::default_scale(d),
        }
    }

    pub(crate) fn qkv_layouts(&self) -> [AttentionLayout; 3] {
        let (t, h, dd) = (self.seq, self.heads, self.head_dim());
        [Qkv::Q, Qkv::K, Qkv::V].map(|w| AttentionLayout::fused_qkv(w, t, h, dd))
    }

    pub(crate) fn bthd(&self) -> AttentionLayout {
        AttentionLayout::bthd(self.seq, self.heads, self.head_dim())
    }

    /// The strided attention forward on this micro-batch, in either space: q, k, v read from
    /// the fused `qkv` `[B, T, 3, H, D]`, `out` `[B, T, H, D]`.
    pub(crate) fn attention_forward_args<'a, S: Space, T: DeviceElement>(
        &self,
        qkv: S::In<'a, T>,
        out: S::Out<'a, T>,
        lse: S::Out<'a, f32>,
    ) -> AttentionForwardStrided<'a, S, T>
    where
        S::In<'a, T>: Copy,
    {
        let [q, k, v] = self
            .qkv_layouts()
            .map(|layout| Strided::<S, T> { data: qkv, layout });
        AttentionForwardStrided {
            params: self.attention(),
            q,
            k,
            v,
            out,
            out_layout: self.bthd(),
            lse,
        }
    }

    /// The strided attention backward on this micro-batch, in either space: `dqkv` written
    /// whole (the three fused layouts tile `[B, T, 3, H, D]`).
    pub(crate) fn attention_backward_args<'a, S: Space, T: DeviceElement>(
        &self,
        [qkv, out, dout]: [S::In<'a, T>; 3],
        lse: S::In<'a, f32>,
        dqkv: S::Out<'a, T>,
    ) -> AttentionBackwardStrided<'a, S, T>
    where
        S::In<'a, T>: Copy,
    {
        let [q, k, v] = self
            .qkv_layouts()
            .map(|layout| Strided::<S, T> { data: qkv, layout });
        let [dq, dk, dv] = self.qkv_layouts();
        let bthd = |data| Strided::<S, T> {
            data,
            layout: self.bthd(),
        };
        AttentionBackwardStrided {
            params: self.attention(),
            q,
            k,
            v,
            out: bthd(out),
            dout: bthd(dout),
            lse,
            dqkv,
            dq,
            dk,
            dv,
        }
    }
}

pub(crate) fn matmul_params(g: Gemm, beta: f32) -> MatmulParams {
    MatmulParams {
        batch: 1,
        m: g.m,
        n: g.n,
        k: g.k,
        trans_a: g.trans_a,
        trans_b: g.trans_b,
        alpha: 1.0,
        beta,
        layout: hip_kernels::ops::MatmulLayout::PACKED,
    }
}

impl<T: DeviceElement> Backend<T> for Cpu {
    type Buf = Vec<T>;
    type Stat = Vec<f32>;
    type Ids = Vec<i32>;
    type Scalars = CpuScalars;

    fn name(&self) -> String {
        format!("cpu ({}, hip_kernels::cpu reference)", T::DTYPE)
    }

    fn zeros(&self, len: usize) -> Result<Vec<T>> {
        Ok(vec![T::from_f32(0.0); len])
    }

    fn zeros_stat(&self, len: usize) -> Result<Vec<f32>> {
        Ok(vec![0.0; len])
    }

    fn upload(&self, host: &[f32]) -> Result<Vec<T>> {
        Ok(host.iter().map(|&x| T::from_f32(x)).collect())
    }

    fn upload_stat(&self, host: &[f32]) -> Result<Vec<f32>> {
        Ok(host.to_vec())
    }

    fn download(&self, buf: &Vec<T>) -> Result<Vec<f32>> {
        Ok(buf.iter().map(|x| x.to_f32()).collect())
    }

    fn download_stat(&self, buf: &Vec<f32>) -> Result<Vec<f32>> {
        Ok(buf.clone())
    }

    fn fill_zero(&self, buf: &mut Vec<T>) -> Result<()> {
        buf.fill(T::from_f32(0.0));
        Ok(())
    }

    fn ids(&self, host: &[i32]) -> Result<Vec<i32>> {
        Ok(host.to_vec())
    }

    fn scalars(&self) -> Result<CpuScalars> {
        Ok(CpuScalars::default())
    }

    fn encoder_forward(
        &self,
        d: &Dims,
        tokens: &Vec<i32>,
        wte: &Vec<T>,
        wpe: &Vec<T>,
        out: &mut Vec<T>,
    ) -> Result<()> {
        cpu::encoder_forward(EncoderForward::<Host, T> {
            params: d.encoder(false),
            tokens,
            wte,
            wpe,
            out,
            error: None,
        })
        .map_err(op)
    }

    fn encoder_backward(
        &self,
        d: &Dims,
        tokens: &Vec<i32>,
        dout: &Vec<T>,
        dwte: &mut Vec<T>,
        dwpe: &mut Vec<T>,
    ) -> Result<()> {
        cpu::encoder_backward(EncoderBackward::<Host, T> {
            params: d.encoder(true),
            tokens,
            dout,
            dwte,
            dwpe,
            error: None,
        })
        .map_err(op)
    }

    fn matmul(
        &self,
        shape: Gemm,
        a: &Vec<T>,
        b: &Vec<T>,
        out: &mut Vec<T>,
        accumulate: bool,
    ) -> Result<()> {
        let beta = if accumulate { 1.0 } else { 0.0 };
        cpu::matmul(Matmul::<Host, T> {
            params: matmul_params(shape, beta),
            a,
            b,
            out,
        })
        .map_err(op)
    }

    fn matmul_bias(
        &self,
        shape: Gemm,
        a: &Vec<T>,
        b: &Vec<T>,
        bias: &Vec<T>,
        out: &mut Vec<T>,
        pre_gelu: Option<&mut Vec<T>>,
    ) -> Result<()> {
        cpu::matmul_bias(MatmulBias::<Host, T> {
            params: MatmulBiasParams {
                batch: 1,
                m: shape.m,
                n: shape.n,
                k: shape.k,
                trans_a: shape.trans_a,
                trans_b: shape.trans_b,
                gelu: pre_gelu.is_some(),
            },
            a,
            b,
            bias,
            out,
            pre_gelu: pre_gelu.map(|p| p.as_mut_slice()),
        })
        .map_err(op)
    }

    fn bias_backward(&self, rows: usize, dout: &Vec<T>, dbias: &mut Vec<T>) -> Result<()> {
        cpu::bias_backward(BiasBackward::<Host, T> {
            params: BiasParams {
                rows,
                cols: dbias.len(),
                accumulate: true,
            },
            dout,
            dbias,
        })
        .map_err(op)
    }

    fn layernorm_forward(
        &self,
        d: &Dims,
        x: &Vec<T>,
        weight: &Vec<T>,
        bias: &Vec<T>,
        y: &mut Vec<T>,
        mean: &mut Vec<f32>,
        rstd: &mut Vec<f32>,
    ) -> Result<()> {
        cpu::layernorm_forward(LayerNormForward::<Host, T> {
            params: d.ln(),
            x,
            weight,
            bias,
            y,
            mean,
            rstd,
        })
        .map_err(op)
    }

    fn residual_layernorm_forward(
        &self,
        d: &Dims,
        a: &Vec<T>,
        b: &Vec<T>,
        weight: &Vec<T>,
        bias: &Vec<T>,
        residual: &mut Vec<T>,
        y: &mut Vec<T>,
        mean: &mut Vec<f32>,
        rstd: &mut Vec<f32>,
    ) -> Result<()> {
        cpu::residual_layernorm_forward(ResidualLayerNormForward::<Host, T> {
            params: d.ln(),
            a,
            b,
            weight,
            bias,
            residual,
            y,
            mean,
            rstd,
        })
        .map_err(op)
    }

    fn layernorm_backward(
        &self,
        d: &Dims,
        x: &Vec<T>,
        weight: &Vec<T>,
        dy: &Vec<T>,
        mean: &Vec<f32>,
        rstd: &Vec<f32>,
        dresidual: &mut Vec<T>,
        dweight: &mut Vec<T>,
        dbias: &mut Vec<T>,
    ) -> Result<()> {
        // Accumulates into the step's gradients (f64 sum, one rounding to T).
        cpu::layernorm_backward(LayerNormBackward::<Host, T> {
            params: d.ln(),
            x,
            weight,
            dy,
            mean,
            rstd,
            dx: dresidual,
            dweight,
            dbias,
            accumulate: true,
        })
        .map_err(op)
    }

    fn attention_forward(
        &self,
        d: &Dims,
        qkv: &Vec<T>,
        out: &mut Vec<T>,
        lse: &mut Vec<f32>,
    ) -> Result<()> {
        cpu::attention_forward_strided(d.attention_forward_args::<Host, T>(qkv, out, lse))
            .map_err(op)
    }

    fn attention_backward(
        &self,
        d: &Dims,
        qkv: &Vec<T>,
        out: &Vec<T>,
        dout: &Vec<T>,
        lse: &Vec<f32>,
        dqkv: &mut Vec<T>,
    ) -> Result<()> {
        cpu::attention_backward_strided(d.attention_backward_args::<Host, T>(
            [qkv, out, dout],
            lse,
            dqkv,
        ))
        .map_err(op)
    }

    fn gelu_backward(&self, pre: &Vec<T>, dout: &Vec<T>, dx: &mut Vec<T>) -> Result<()> {
        cpu::gelu_backward(GeluBackward::<Host, T> {
            params: ElementwiseParams { len: pre.len() },
            x: pre,
            dout,
            dx,
        })
        .map_err(op)
    }

    fn cross_entropy(
        &self,
        d: &Dims,
        logits: &mut Vec<T>,
        targets: &Vec<i32>,
        accum: usize,
        loss_scale: f64,
        scalars: &mut CpuScalars,
    ) -> Result<()> {
        let mut losses = vec![0.0f32; d.rows()];
        let mean = cpu::softmax_cross_entropy(SoftmaxCrossEntropy::<Host, T> {
            params: CrossEntropyParams {
                dloss: Some((loss_scale / accum as f64) as f32),
                ..CrossEntropyParams::new(d.rows(), d.vocab)
            },
            logits,
            targets,
            losses: &mut losses,
            loss: None,
            error: None,
        })
        .map_err(op)?;
        scalars.loss += mean / accum as f64;
        Ok(())
    }

    fn grad_norm(&self, grads: &[&Vec<T>], scalars: &mut CpuScalars) -> Result<()> {
        let slices: Vec<&[T]> = grads.iter().map(|g| g.as_slice()).collect();
        scalars.norm = cpu::l2_norm(&slices);
        Ok(())
    }

    fn adamw_all(
        &self,
        hyper: &AdamWStep,
        scaling: GradScaling,
        scalars: &CpuScalars,
        tensors: &mut [AdamWSlot<'_, Vec<T>, Vec<f32>>],
    ) -> Result<()> {
        // One-element f32 tensors, as a device step keeps them in device memory.
        let found_inf = [if scalars.norm.is_finite() {
            0.0f32
        } else {
            1.0
        }];
        let loss_scale = [scaling.loss_scale as f32];
        let mut grad_scale = [loss_scale[0]];
        if let (Some(max_norm), true) = (scaling.clip, scalars.norm.is_finite()) {
            cpu::clip_grad_scale(ClipGradScale::<Host> {
                params: ClipParams {
                    max_norm: max_norm as f32,
                },
                norm: &[scalars.norm as f32],
                loss_scale: Some(&loss_scale),
                grad_scale: &mut grad_scale,
            })
            .map_err(op)?;
        }
        let params = AdamWParams {
            lr: hyper.lr,
            beta1: hyper.beta1,
            beta2: hyper.beta2,
            eps: hyper.eps,
            weight_decay: hyper.weight_decay,
            maximize: false,
            amsgrad: false,
            step: hyper.step,
        };
        cpu::adamw(AdamW::<Host, T> {
            params,
            grad_scale: (grad_scale[0] != 1.0).then_some(&grad_scale[..]),
            found_inf: Some(&found_inf),
            tensors: &mut tensors
                .iter_mut()
                .map(|t| AdamWTensor {
                    param: t.param.as_mut_slice(),
                    grad: t.grad.as_slice(),
                    exp_avg: t.exp_avg.as_mut_slice(),
                    exp_avg_sq: t.exp_avg_sq.as_mut_slice(),
                    max_exp_avg_sq: None,
                    master: t.master.as_deref_mut().map(|m| m.as_mut_slice()),
                    weight_decay: (!t.decay).then_some(0.0),
                    lr_scale: None,
                })
                .collect::<Vec<_>>(),
        })
        .map_err(op)
    }

    fn read_step(&self, scalars: &CpuScalars) -> Result<StepRead> {
        Ok(StepRead {
            loss: scalars.loss,
            grad_norm: scalars.norm,
        })
    }
}
