//! The CPU backend: every op is the crate's CPU reference (`hip_kernels::cpu`, f64 inside, each
//! output rounded once to its storage type: f32, bf16 or f16). The oracle, not a fast path.
//! Its argument structs are built in [`crate::op_runner`], shared with the device backend.

use crate::backend::TrainElement;
use crate::backend::{Dims, GradScaling, StepRead};
use crate::error::{op, Result};
use crate::op_runner::{cross_entropy_args, encoder_forward_args, OpRunner, UpdateScalars};
use hip_kernels::cpu;
use hip_kernels::ops::{
    AdamW, AttentionBackwardStrided, AttentionForwardStrided, BiasBackward, ClipGradScale,
    ClipParams, EncoderBackward, GeluBackward, GeluForward, LayerNormBackward, LayerNormForward,
    Matmul, MatmulBias, ResidualLayerNormForward,
};
use hip_kernels::params::{DType, Host};

/// The CPU reference as a [`crate::backend::Backend`].
#[derive(Debug, Default, Clone, Copy)]
pub struct Cpu;

/// Per-step scalars of the CPU backend.
#[derive(Debug, Default, Clone, Copy)]
pub struct CpuScalars {
    loss: f64,
    norm: f64,
}

impl OpRunner for Cpu {
    type Space = Host;
    type Buf<T: TrainElement> = Vec<T>;
    type Ids = Vec<i32>;
    type Scalars = CpuScalars;

    fn view<T: TrainElement>(buf: &Vec<T>) -> &[T] {
        buf
    }

    fn view_mut<T: TrainElement>(buf: &mut Vec<T>) -> &mut [T] {
        buf
    }

    fn ids_view(ids: &Vec<i32>) -> &[i32] {
        ids
    }

    fn len<T: TrainElement>(buf: &Vec<T>) -> usize {
        buf.len()
    }

    fn describe(&self, dtype: DType) -> String {
        format!("cpu ({dtype}, hip_kernels::cpu reference)")
    }

    fn zeros<T: TrainElement>(&self, len: usize) -> Result<Vec<T>> {
        Ok(vec![T::from_f32(0.0); len])
    }

    fn upload<T: TrainElement>(&self, host: &[f32]) -> Result<Vec<T>> {
        Ok(host.iter().map(|&x| T::from_f32(x)).collect())
    }

    fn download<T: TrainElement>(&self, buf: &Vec<T>) -> Result<Vec<f32>> {
        Ok(buf.iter().map(|x| x.to_f32()).collect())
    }

    fn fill_zero<T: TrainElement>(&self, buf: &mut Vec<T>) -> Result<()> {
        buf.fill(T::from_f32(0.0));
        Ok(())
    }

    fn ids(&self, host: &[i32]) -> Result<Vec<i32>> {
        Ok(host.to_vec())
    }

    fn scalars(&self) -> Result<CpuScalars> {
        Ok(CpuScalars::default())
    }

    fn encoder_forward<T: TrainElement>(
        &self,
        d: &Dims,
        tokens: &Vec<i32>,
        wte: &Vec<T>,
        wpe: &Vec<T>,
        out: &mut Vec<T>,
    ) -> Result<()> {
        cpu::encoder_forward(encoder_forward_args::<Host, T>(
            d,
            tokens,
            [wte, wpe],
            out,
            None,
        ))
        .map_err(op)
    }

    fn cross_entropy<T: TrainElement>(
        &self,
        d: &Dims,
        logits: &mut Vec<T>,
        targets: &Vec<i32>,
        dloss: f32,
        accum: usize,
        scalars: &mut CpuScalars,
    ) -> Result<()> {
        let mut losses = vec![0.0f32; d.rows()];
        let mean = cpu::softmax_cross_entropy(cross_entropy_args::<Host, T>(
            d,
            dloss,
            logits,
            targets,
            &mut losses,
            None,
            None,
        ))
        .map_err(op)?;
        scalars.loss += mean / accum as f64;
        Ok(())
    }

    fn run_encoder_backward<T: TrainElement>(&self, a: EncoderBackward<'_, Host, T>) -> Result<()> {
        cpu::encoder_backward(a).map_err(op)
    }

    fn run_matmul<T: TrainElement>(&self, a: Matmul<'_, Host, T>) -> Result<()> {
        cpu::matmul(a).map_err(op)
    }

    fn run_matmul_bias<T: TrainElement>(&self, a: MatmulBias<'_, Host, T>) -> Result<()> {
        cpu::matmul_bias(a).map_err(op)
    }

    fn run_bias_backward<T: TrainElement>(&self, a: BiasBackward<'_, Host, T>) -> Result<()> {
        cpu::bias_backward(a).map_err(op)
    }

    fn run_layernorm_forward<T: TrainElement>(
        &self,
        a: LayerNormForward<'_, Host, T>,
    ) -> Result<()> {
        cpu::layernorm_forward(a).map_err(op)
    }

    fn run_residual_layernorm_forward<T: TrainElement>(
        &self,
        a: ResidualLayerNormForward<'_, Host, T>,
    ) -> Result<()> {
        cpu::residual_layernorm_forward(a).map_err(op)
    }

    fn run_layernorm_backward<T: TrainElement>(
        &self,
        a: LayerNormBackward<'_, Host, T>,
    ) -> Result<()> {
        cpu::layernorm_backward(a).map_err(op)
    }

    fn run_attention_forward<T: TrainElement>(
        &self,
        a: AttentionForwardStrided<'_, Host, T>,
    ) -> Result<()> {
        cpu::attention_forward_strided(a).map_err(op)
    }

    fn run_attention_backward<T: TrainElement>(
        &self,
        a: AttentionBackwardStrided<'_, Host, T>,
    ) -> Result<()> {
        cpu::attention_backward_strided(a).map_err(op)
    }

    fn run_gelu_forward<T: TrainElement>(&self, a: GeluForward<'_, Host, T>) -> Result<()> {
        cpu::gelu_forward(a).map_err(op)
    }

    fn run_gelu_backward<T: TrainElement>(&self, a: GeluBackward<'_, Host, T>) -> Result<()> {
        cpu::gelu_backward(a).map_err(op)
    }

    fn run_adamw<T: TrainElement>(&self, a: AdamW<'_, '_, Host, T>) -> Result<()> {
        cpu::adamw(a).map_err(op)
    }

    fn grad_norm<T: TrainElement>(
        &self,
        grads: &[&Vec<T>],
        scalars: &mut CpuScalars,
    ) -> Result<()> {
        let slices: Vec<&[T]> = grads.iter().map(|g| g.as_slice()).collect();
        scalars.norm = cpu::l2_norm(&slices);
        Ok(())
    }

    fn update_scalars(
        &self,
        scaling: GradScaling,
        scalars: &CpuScalars,
    ) -> Result<UpdateScalars<Vec<f32>>> {
        // One-element f32 tensors, as a device step keeps them in device memory.
        let finite = scalars.norm.is_finite();
        let found_inf = vec![if finite { 0.0f32 } else { 1.0 }];
        let loss_scale = [scaling.loss_scale as f32];
        let mut grad_scale = vec![loss_scale[0]];
        if let (Some(max_norm), true) = (scaling.clip, finite) {
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
        Ok(UpdateScalars {
            grad_scale: (grad_scale[0] != 1.0).then_some(grad_scale),
            found_inf,
        })
    }

    fn read_step(&self, scalars: &CpuScalars) -> Result<StepRead> {
        Ok(StepRead {
            loss: scalars.loss,
            grad_norm: scalars.norm,
        })
    }
}
