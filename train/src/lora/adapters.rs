//! The adapters on a backend: parameters (storage type `T`, f32 master weights when `T` is not
//! f32), gradients, AdamW moments, and the small products beside each adapted GEMM.
//!
//! Forward of a target with input `x` `[N, in]` and output `y` `[N, out]` (already `x @ W + b`):
//! `u = x @ Aᵀ` `[N, r]` (kept for the backward), then `y += s · u @ Bᵀ` — the second product
//! accumulates into the target's output (no extra buffer, no add kernel). Backward with the
//! output gradient `dy`, after the base GEMM wrote `dx = dy @ Wᵀ`: `du = s · dy @ B`,
//! `dB += s · dyᵀ @ u`, `dA += duᵀ @ x`, `dx += du @ A`. The frozen weight's gradient
//! `xᵀ @ dy` is never computed.
//!
//! Both run as one op each (`hip_kernels::ops::LoraForward` / `LoraBackward`): on a device the
//! skinny kernels of `kernels/lora_gemm.hip` (forward 2 launches, backward 3, or 4 when the row
//! reductions split into groups; the GEMM through the tuner when GEMM tuning is on), on the CPU
//! the reference with the GEMMs' numerics (f64 sums, one rounding per stored value).

use super::{HostAdapters, LoraConfig, Target};
use crate::backend::{
    adamw_all, AdamWSlot, AdamWStep, Backend, BackendSlot, GradScaling, TrainElement, View,
};
use crate::config::GptConfig;
use crate::error::{Result, TrainError};
use hip_kernels::ops::{LoraBackward, LoraForward, LoraParams, Run};
use hip_kernels::params::DType;
use std::marker::PhantomData;

/// The adapters of a GPT-2 on backend `B` with storage type `T`.
pub struct Adapters<T: TrainElement, B: Backend<T>> {
    /// Rank, alpha, targets.
    pub cfg: LoraConfig,
    /// `(in, out)` of each target.
    dims: Vec<(Target, usize, usize)>,
    /// Rows N of a micro-batch.
    rows: usize,
    /// `lora_A`, `lora_B`, … in [`LoraConfig::specs`]' order, in `T`.
    pub params: Vec<B::Buf<T>>,
    /// f32 master weights, when `T` is not f32.
    pub master: Option<Vec<B::Buf<f32>>>,
    /// Gradients, accumulated over a step's micro-batches.
    pub grads: Vec<B::Buf<T>>,
    /// AdamW first moments.
    pub exp_avg: Vec<B::Buf<f32>>,
    /// AdamW second moments.
    pub exp_avg_sq: Vec<B::Buf<f32>>,
    /// `u = x @ Aᵀ` `[N, r]` of every adapted module (saved for the backward), one per `lora_A`.
    saved: Vec<B::Buf<T>>,
    /// Scratch `du` `[N, r]`.
    du: B::Buf<T>,
    _t: PhantomData<T>,
}

impl<T: TrainElement, B: Backend<T>> Adapters<T, B> {
    /// Upload `host` for micro-batches of `rows` positions.
    pub fn new(be: &B, gpt: &GptConfig, host: &HostAdapters, rows: usize) -> Result<Self> {
        let cfg = host.cfg.clone();
        let r = cfg.rank;
        let specs = cfg.specs(gpt);
        if host.params.len() != specs.len() {
            return Err(TrainError::Op(format!(
                "{} adapter tensors for {} adapters",
                host.params.len(),
                specs.len()
            )));
        }
        let up = |v: &Vec<f32>| be.upload::<T>(v);
        let up_stat = |v: &Vec<f32>| be.upload::<f32>(v);
        let size = rows
            .checked_mul(r)
            .ok_or_else(|| TrainError::Op(format!("{rows} rows × rank {r} overflows")))?;
        Ok(Self {
            dims: cfg
                .targets
                .iter()
                .map(|&t| {
                    let (i, o) = t.dims(gpt);
                    (t, i, o)
                })
                .collect(),
            rows,
            params: host.params.iter().map(up).collect::<Result<_>>()?,
            master: match <T as hip_kernels::params::Element>::DTYPE {
                DType::F32 => None,
                _ => Some(host.params.iter().map(up_stat).collect::<Result<_>>()?),
            },
            grads: host
                .params
                .iter()
                .map(|p| be.zeros::<T>(p.len()))
                .collect::<Result<_>>()?,
            exp_avg: host.exp_avg.iter().map(up_stat).collect::<Result<_>>()?,
            exp_avg_sq: host.exp_avg_sq.iter().map(up_stat).collect::<Result<_>>()?,
            saved: (0..specs.len() / 2)
                .map(|_| be.zeros::<T>(size))
                .collect::<Result<_>>()?,
            du: be.zeros(size)?,
            cfg,
            _t: PhantomData,
        })
    }

    /// Whether target `t` carries adapters (in every layer).
    pub fn adapts(&self, t: Target) -> bool {
        self.cfg.targets.contains(&t)
    }

    /// `(index of lora_A, in, out)` of layer `l`, target `t`.
    fn slot(&self, l: usize, t: Target) -> Option<(usize, usize, usize)> {
        let i = self.cfg.index(l, t)?;
        let &(_, n_in, n_out) = self.dims.iter().find(|d| d.0 == t)?;
        Some((i, n_in, n_out))
    }

    /// Adds `s · (x @ Aᵀ) @ Bᵀ` to `y` (nothing when `t` is not adapted).
    pub fn forward(
        &mut self,
        be: &B,
        l: usize,
        t: Target,
        x: &B::Buf<T>,
        y: &mut B::Buf<T>,
    ) -> Result<()> {
        let Some((i, n_in, n_out)) = self.slot(l, t) else {
            return Ok(());
        };
        let params = LoraParams::new(self.rows, n_in, n_out, self.cfg.rank, self.scale());
        LoraForward::<B::Space, T> {
            params,
            x: x.view(),
            a: self.params[i].view(),
            b: self.params[i + 1].view(),
            u: self.saved[i / 2].view_mut(),
            y: y.view_mut(),
        }
        .run(be.queue())?;
        Ok(())
    }

    /// The adapters' scale alpha / r, as the kernels take it.
    fn scale(&self) -> f32 {
        self.cfg.scale() as f32
    }

    /// The adapters' part of the backward of layer `l`'s target `t` with input `x` and output
    /// gradient `dy`: accumulates `dA`, `dB`, and adds the adapter path's input gradient to
    /// `dx` (which holds `dy @ Wᵀ`). Nothing when `t` is not adapted.
    pub fn backward(
        &mut self,
        be: &B,
        l: usize,
        t: Target,
        x: &B::Buf<T>,
        dy: &B::Buf<T>,
        dx: &mut B::Buf<T>,
    ) -> Result<()> {
        let Some((i, n_in, n_out)) = self.slot(l, t) else {
            return Ok(());
        };
        let params = LoraParams::new(self.rows, n_in, n_out, self.cfg.rank, self.scale());
        let (ga, gb) = self.grads.split_at_mut(i + 1);
        // dA and dB accumulate over the step's micro-batches.
        LoraBackward::<B::Space, T> {
            params: params.accumulating(),
            x: x.view(),
            dy: dy.view(),
            a: self.params[i].view(),
            b: self.params[i + 1].view(),
            u: self.saved[i / 2].view(),
            du: self.du.view_mut(),
            da: ga[i].view_mut(),
            db: gb[0].view_mut(),
            dx: dx.view_mut(),
        }
        .run(be.queue())?;
        Ok(())
    }

    /// Zero the gradients (start of a step).
    pub fn zero_grads(&mut self, be: &B) -> Result<()> {
        for g in &mut self.grads {
            be.fill_zero(g)?;
        }
        Ok(())
    }

    /// The gradients, for the norm.
    pub fn grad_refs(&self) -> Vec<&B::Buf<T>> {
        self.grads.iter().collect()
    }

    /// One AdamW step of every adapter (all 2-D: the step's weight decay applies).
    pub fn update(
        &mut self,
        be: &B,
        hyper: &AdamWStep,
        scaling: GradScaling,
        scalars: &B::Scalars,
    ) -> Result<()> {
        let mut masters = self.master.as_mut().map(|m| m.iter_mut());
        let mut slots: Vec<BackendSlot<'_, B, T>> = self
            .params
            .iter_mut()
            .zip(&self.grads)
            .zip(self.exp_avg.iter_mut().zip(self.exp_avg_sq.iter_mut()))
            .map(|((param, grad), (exp_avg, exp_avg_sq))| AdamWSlot {
                master: masters.as_mut().and_then(|it| it.next()),
                param,
                grad,
                exp_avg,
                exp_avg_sq,
                decay: true,
            })
            .collect();
        adamw_all(be, hyper, scaling, scalars, &mut slots)
    }

    /// The adapters (f32: the master weights when there are) and their moments on the host.
    pub fn download(&self, be: &B) -> Result<HostAdapters> {
        let stat = |t: &B::Buf<f32>| be.download(t);
        let params = match &self.master {
            Some(m) => m.iter().map(stat).collect::<Result<_>>()?,
            None => self
                .params
                .iter()
                .map(|t| be.download(t))
                .collect::<Result<_>>()?,
        };
        Ok(HostAdapters {
            cfg: self.cfg.clone(),
            params,
            exp_avg: self.exp_avg.iter().map(stat).collect::<Result<_>>()?,
            exp_avg_sq: self.exp_avg_sq.iter().map(stat).collect::<Result<_>>()?,
        })
    }
}
