//! The CPU backend: every op is the crate's CPU reference (`hip_kernels::cpu`, f64 inside, each
//! output rounded once to its storage type: f32, bf16 or f16), run by the op structs the model
//! builds on [`Host`]. The oracle, not a fast path.

use crate::backend::{
    Backend, GradScaling, IdCheck, MemStats, StepRead, Tail, TrainElement, UpdateScalars, View,
};
use crate::error::{op, Result, TrainError};
use hip_kernels::cpu;
use hip_kernels::ops::{ClipGradScale, ClipParams, EncoderForward, SoftmaxCrossEntropy};
use hip_kernels::params::Host;

/// The CPU reference as a [`crate::backend::Backend`].
#[derive(Debug, Default, Clone, Copy)]
pub struct Cpu;

/// Per-step scalars of the CPU backend.
#[derive(Debug, Default, Clone, Copy)]
pub struct CpuScalars {
    loss: f64,
    norm: f64,
}

impl<U: hip_rt::Element> View<Host, U> for Vec<U> {
    fn view(&self) -> &[U] {
        self
    }

    fn view_mut(&mut self) -> &mut [U] {
        self
    }
}

impl<U: hip_rt::Element> View<Host, U> for &mut [U] {
    fn view(&self) -> &[U] {
        self
    }

    fn view_mut(&mut self) -> &mut [U] {
        self
    }
}

impl<U: hip_rt::Element> Tail<Host, U> for Vec<U> {
    type Of<'a> = &'a mut [U];

    fn tail_mut(&mut self, offset: usize) -> Result<&mut [U]> {
        let len = self.len();
        self.get_mut(offset..)
            .ok_or_else(|| TrainError::Op(format!("offset {offset} past {len} elements")))
    }
}

impl<T: TrainElement> Backend<T> for Cpu {
    type Space = Host;
    type Buf<U: TrainElement> = Vec<U>;
    type Ids = Vec<i32>;
    type Scalars = CpuScalars;

    fn queue(&self) {}

    fn name(&self) -> String {
        let dtype = <T as hip_kernels::params::Element>::DTYPE;
        format!("cpu ({dtype}, hip_kernels::cpu reference)")
    }

    fn zeros<U: TrainElement>(&self, len: usize) -> Result<Vec<U>> {
        Ok(vec![U::from_f32(0.0); len])
    }

    fn upload<U: TrainElement>(&self, host: &[f32]) -> Result<Vec<U>> {
        Ok(host.iter().map(|&x| U::from_f32(x)).collect())
    }

    fn download<U: TrainElement>(&self, buf: &Vec<U>) -> Result<Vec<f32>> {
        Ok(buf.iter().map(|x| x.to_f32()).collect())
    }

    fn fill_zero<U: TrainElement>(&self, buf: &mut Vec<U>) -> Result<()> {
        buf.fill(U::from_f32(0.0));
        Ok(())
    }

    fn ids(&self, host: &[i32]) -> Result<Vec<i32>> {
        Ok(host.to_vec())
    }

    fn scalars(&self) -> Result<CpuScalars> {
        Ok(CpuScalars::default())
    }

    /// No flag: the CPU reference checks the ids itself and returns the error.
    fn encoder_forward(
        &self,
        a: EncoderForward<'_, Host, T>,
        _ids: &Vec<i32>,
        _check: IdCheck,
    ) -> Result<()> {
        cpu::encoder_forward(a).map_err(op)
    }

    /// The f64 mean of the CPU reference, added unrounded.
    fn cross_entropy(
        &self,
        a: SoftmaxCrossEntropy<'_, Host, T>,
        _targets: &Vec<i32>,
        _check: IdCheck,
        accum: usize,
        scalars: &mut CpuScalars,
    ) -> Result<()> {
        let mean = cpu::softmax_cross_entropy(a).map_err(op)?;
        scalars.loss += mean / accum as f64;
        Ok(())
    }

    fn grad_norm(&self, grads: &[&Vec<T>], scalars: &mut CpuScalars) -> Result<()> {
        let slices: Vec<&[T]> = grads.iter().map(|g| g.as_slice()).collect();
        scalars.norm = cpu::l2_norm(&slices);
        Ok(())
    }

    /// One rank holds every tensor: the plain norm.
    fn grad_norm_sharded(&self, owned: &[&Vec<T>], scalars: &mut CpuScalars) -> Result<()> {
        Backend::<T>::grad_norm(self, owned, scalars)
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

    fn grads_ready(&self, _grads: &mut [&mut Vec<T>], _roots: Option<&[usize]>) -> Result<()> {
        Ok(())
    }

    fn grads_reduced(&self) -> Result<()> {
        Ok(())
    }

    fn world(&self) -> usize {
        1
    }

    fn rank(&self) -> usize {
        0
    }

    fn broadcast<U: TrainElement>(&self, _bufs: &mut [(&mut Vec<U>, usize)]) -> Result<()> {
        Ok(())
    }

    fn read_step(&self, scalars: &CpuScalars) -> Result<StepRead> {
        Ok(StepRead {
            loss: scalars.loss,
            grad_norm: scalars.norm,
        })
    }

    fn memory(&self) -> Option<MemStats> {
        None
    }

    fn emulated(&self) -> bool {
        false
    }

    fn reset_peak_memory(&self) {}
}
