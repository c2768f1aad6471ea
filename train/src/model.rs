//! GPT-2, written once over [`Backend`]: its parameters, gradients, optimizer state and
//! activations, the step's entry points, and (in `passes`) the forward and backward, where each
//! op is its argument struct (`hip_kernels::ops`, named fields) built on the backend's space and
//! run on its queue.

mod passes;

use crate::backend::{
    adamw_all, AdamWSlot, AdamWStep, Backend, BackendSlot, Dims, GradScaling, TrainElement, View,
};
use crate::config::GptConfig;
use crate::error::{Result, TrainError};
use crate::lora::adapters::Adapters;
use crate::lora::HostAdapters;
use crate::params::{specs, Params};
use hip_kernels::ops::{CrossEntropyParams, SoftmaxCrossEntropy};
use hip_kernels::params::DType;
use std::marker::PhantomData;

/// Saved activations of one layer (`N = B·T` rows): `T` tensors, `S` f32 statistics. The
/// layer's output (the residual stream after it) lives in `Acts::resid`.
struct LayerActs<T, S> {
    ln1: T,
    ln1_mean: S,
    ln1_rstd: S,
    qkv: T,
    atty: T,
    lse: S,
    resid_mid: T,
    ln2: T,
    ln2_mean: S,
    ln2_rstd: S,
    fc_pre: T,
    fc_gelu: T,
}

/// Activations of the whole model plus the backward's scratch.
struct Acts<T, S> {
    encoded: T,
    /// One set per layer; with activation checkpointing one set, which each layer's forward
    /// and its recomputation in the backward reuse.
    layers: Vec<LayerActs<T, S>>,
    /// The residual stream after each layer `[N, C]` (layer `l + 1`'s input): with
    /// checkpointing, what the forward keeps of the layers.
    resid: Vec<T>,
    lnf: T,
    lnf_mean: S,
    lnf_rstd: S,
    logits: T,
    /// `[N, C]` scratch: a branch output in the forward, a branch gradient in the backward.
    branch: T,
    /// Gradient of the residual stream `[N, C]`.
    dres: T,
    /// Gradients of `qkv`, `fc_gelu`, `fc_pre` and `atty`.
    dqkv: T,
    dfc_gelu: T,
    dfc_pre: T,
    datty: T,
    /// The loss of each position `[N]`.
    losses: S,
}

/// A GPT-2 on a backend with storage type `T`: parameters, their gradients, f32 master weights
/// (when `T` is not f32), f32 AdamW moments and activations.
pub struct Gpt2<'b, T: TrainElement, B: Backend<T>> {
    backend: &'b B,
    /// Dimensions of a micro-batch.
    pub dims: Dims,
    layers: usize,
    /// Parameters in `T`.
    pub params: Params<B::Buf<T>>,
    /// f32 master weights, when `T` is not f32.
    pub master: Option<Params<B::Buf<f32>>>,
    /// Gradients, accumulated over the micro-batches of a step (`None`: the base is frozen, LoRA).
    pub grads: Option<Params<B::Buf<T>>>,
    /// AdamW first moments (`None` when frozen).
    pub exp_avg: Option<Params<B::Buf<f32>>>,
    /// AdamW second moments (`None` when frozen).
    pub exp_avg_sq: Option<Params<B::Buf<f32>>>,
    /// LoRA's adapters, the only trainable tensors when present.
    pub lora: Option<Adapters<T, B>>,
    /// With a frozen base: where the layer norms' unused weight gradients go (`[C]` each; the
    /// op always writes them).
    frozen_ln: Option<[B::Buf<T>; 2]>,
    /// Weight decay applies (2-D tensors), in canonical order.
    decays: Vec<bool>,
    /// ZeRO stage 1: the rank that keeps each tensor's AdamW state (and f32 master weights)
    /// and updates it, in canonical order; `None`: every rank keeps and updates all.
    owners: Option<Vec<usize>>,
    /// `--grad-checkpoint`: the forward keeps each layer's input only, and the backward
    /// recomputes each layer's activations (into the one set of `Acts::layers`) before its
    /// backward.
    grad_checkpoint: bool,
    /// ZeRO stage 2: the backend keeps this rank's shards of the gradients and optimizer
    /// state; the model's gradients are empty outside the backward that produces them.
    zero2: bool,
    /// `--offload-optimizer cpu`: the backend keeps the master weights and moments in host
    /// memory ([`crate::offload`]); the model's are empty.
    offload: bool,
    /// Every trained tensor's length, in canonical order.
    grad_lens: Vec<usize>,
    acts: Acts<B::Buf<T>, B::Buf<f32>>,
    _t: PhantomData<T>,
}

impl<'b, T: TrainElement, B: Backend<T>> Gpt2<'b, T, B> {
    /// Upload `[params, exp_avg, exp_avg_sq]` for micro-batches of `batch × seq`. With ZeRO
    /// stage `zero` 1 and several ranks, this rank keeps the moments and master weights of its
    /// share of the tensors only ([`zero_owners`]); the others are empty. With stage 2 the
    /// backend keeps an element-granular share of them and of the gradients
    /// ([`crate::zero2`]). With `grad_checkpoint` the activations of one layer are kept at a
    /// time (`--grad-checkpoint`).
    pub fn new(
        backend: &'b B,
        cfg: &GptConfig,
        [params, exp_avg, exp_avg_sq]: [&Params<Vec<f32>>; 3],
        batch: usize,
        seq: usize,
        zero: u8,
        grad_checkpoint: bool,
    ) -> Result<Self> {
        Self::build(
            backend,
            cfg,
            params,
            Some([exp_avg, exp_avg_sq]),
            None,
            [batch, seq],
            (zero, grad_checkpoint),
        )
    }

    /// Upload the frozen base `params` (no gradients, no optimizer state) and LoRA's `adapters`
    /// for micro-batches of `batch × seq` (`grad_checkpoint` as in [`Gpt2::new`]).
    pub fn with_lora(
        backend: &'b B,
        cfg: &GptConfig,
        params: &Params<Vec<f32>>,
        adapters: &HostAdapters,
        batch: usize,
        seq: usize,
        grad_checkpoint: bool,
    ) -> Result<Self> {
        Self::build(
            backend,
            cfg,
            params,
            None,
            Some(adapters),
            [batch, seq],
            (0, grad_checkpoint),
        )
    }

    fn build(
        backend: &'b B,
        cfg: &GptConfig,
        params: &Params<Vec<f32>>,
        moments: Option<[&Params<Vec<f32>>; 2]>,
        adapters: Option<&HostAdapters>,
        [batch, seq]: [usize; 2],
        (zero, grad_checkpoint): (u8, bool),
    ) -> Result<Self> {
        let zero2 = zero == 2 && backend.world() > 1 && moments.is_some();
        let owners = (zero == 1 && backend.world() > 1).then(|| {
            let lens: Vec<usize> = params.iter().iter().map(|t| t.len()).collect();
            zero_owners(&lens, backend.world())
        });
        // --offload-optimizer cpu: the master weights and moments live on the host.
        let offload = backend.offloads() && moments.is_some() && !zero2;
        let rank = backend.rank();
        let mine = |i: usize| !zero2 && !offload && owners.as_ref().map_or(true, |o| o[i] == rank);
        let dims = Dims {
            batch,
            seq,
            channels: cfg.channels,
            heads: cfg.heads,
            inner: cfg.inner,
            vocab: cfg.vocab,
            positions: cfg.positions,
            eps: cfg.eps as f32,
        };
        let up = |_: usize, t: &Vec<f32>| backend.upload::<T>(t);
        let up_stat = |i: usize, t: &Vec<f32>| match mine(i) {
            true => backend.upload::<f32>(t),
            false => backend.zeros::<f32>(0),
        };
        // ZeRO 2: allocated by the backward (`zero2_alloc`).
        let zero = |_: usize, t: &Vec<f32>| backend.zeros::<T>(if zero2 { 0 } else { t.len() });
        let decays: Vec<bool> = specs(cfg).iter().map(|s| s.decays()).collect();
        fn host(p: &Params<Vec<f32>>) -> Vec<&[f32]> {
            p.iter().into_iter().map(|t| &t[..]).collect()
        }
        if let (true, Some([m, v])) = (zero2, moments) {
            backend.zero2_init([&host(params), &host(m), &host(v)], &decays)?;
        }
        if let (true, Some([m, v])) = (offload, moments) {
            // ZeRO 1: only the tensors this rank owns.
            let own = |p| crate::offload::owned_only(host(p), owners.as_deref(), rank);
            backend.offload_init([&own(params), &own(m), &own(v)], &decays)?;
        }
        let (n, c, f) = (dims.rows(), dims.channels, dims.inner);
        let z = |len: usize| backend.zeros::<T>(len);
        let zs = |len: usize| backend.zeros::<f32>(len);
        let lse_len = batch * cfg.heads * seq;
        let sets = match grad_checkpoint {
            true => cfg.layers.min(1),
            false => cfg.layers,
        };
        let layers = (0..sets)
            .map(|_| {
                Ok(LayerActs {
                    ln1: z(n * c)?,
                    ln1_mean: zs(n)?,
                    ln1_rstd: zs(n)?,
                    qkv: z(n * 3 * c)?,
                    atty: z(n * c)?,
                    lse: zs(lse_len)?,
                    resid_mid: z(n * c)?,
                    ln2: z(n * c)?,
                    ln2_mean: zs(n)?,
                    ln2_rstd: zs(n)?,
                    fc_pre: z(n * f)?,
                    fc_gelu: z(n * f)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let acts = Acts {
            encoded: z(n * c)?,
            layers,
            resid: (0..cfg.layers).map(|_| z(n * c)).collect::<Result<_>>()?,
            lnf: z(n * c)?,
            lnf_mean: zs(n)?,
            lnf_rstd: zs(n)?,
            logits: z(n * cfg.vocab)?,
            branch: z(n * c)?,
            dres: z(n * c)?,
            dqkv: z(n * 3 * c)?,
            dfc_gelu: z(n * f)?,
            dfc_pre: z(n * f)?,
            datty: z(n * c)?,
            losses: zs(n)?,
        };
        let trains_base = moments.is_some();
        Ok(Self {
            backend,
            dims,
            layers: cfg.layers,
            params: params.try_map(up)?,
            master: match (<T as hip_kernels::params::Element>::DTYPE, trains_base) {
                (DType::F32, _) | (_, false) => None,
                _ => Some(params.try_map(up_stat)?),
            },
            grads: trains_base.then(|| params.try_map(zero)).transpose()?,
            exp_avg: moments.map(|[m, _]| m.try_map(up_stat)).transpose()?,
            exp_avg_sq: moments.map(|[_, v]| v.try_map(up_stat)).transpose()?,
            lora: adapters
                .map(|h| Adapters::new(backend, cfg, h, n))
                .transpose()?,
            frozen_ln: if trains_base {
                None
            } else {
                Some([z(c)?, z(c)?])
            },
            decays,
            owners,
            grad_checkpoint,
            zero2,
            offload,
            grad_lens: params.iter().iter().map(|t| t.len()).collect(),
            acts,
            _t: PhantomData,
        })
    }

    /// Set every gradient to zero (start of a step).
    pub fn zero_grads(&mut self) -> Result<()> {
        // ZeRO 2: the backward allocates them zeroed.
        let grads = self.grads.iter_mut().filter(|_| !self.zero2);
        for g in grads.flat_map(|g| g.iter_mut()) {
            self.backend.fill_zero(g)?;
        }
        for g in self.frozen_ln.iter_mut().flatten() {
            self.backend.fill_zero(g)?;
        }
        match self.lora.as_mut() {
            Some(lo) => lo.zero_grads(self.backend),
            None => Ok(()),
        }
    }

    /// Forward and backward of one of `accum` micro-batches: the mean loss / `accum` is added to
    /// `scalars`, the gradients of that times `loss_scale` accumulate. With data parallelism
    /// (`backend.world()` W > 1) the gradients are of the mean over ranks (each rank's share
    /// scaled by 1/W, summed across ranks), and `last` (the step's last micro-batch) hands each
    /// layer's gradients to the backend's all-reduce (with ZeRO stage 1: a reduce to each
    /// tensor's owner) as soon as the backward has produced them.
    pub fn forward_backward(
        &mut self,
        inputs: &B::Ids,
        targets: &B::Ids,
        accum: usize,
        loss_scale: f64,
        scalars: &mut B::Scalars,
        last: bool,
    ) -> Result<()> {
        self.forward(inputs)?;
        let be = self.backend;
        let d = self.dims;
        // W = 1: exactly `loss_scale` (no rounding added to one device's figures).
        let share = match be.world() {
            1 => loss_scale,
            w => loss_scale / w as f64,
        };
        let a = &mut self.acts;
        let a_ce = SoftmaxCrossEntropy::<B::Space, T> {
            params: CrossEntropyParams {
                dloss: Some((share / accum as f64) as f32),
                ..CrossEntropyParams::new(d.rows(), d.vocab)
            },
            logits: a.logits.view_mut(),
            targets: targets.view(),
            losses: a.losses.view_mut(),
            loss: None,
            totals: None,
            error: None,
        };
        be.cross_entropy(a_ce, targets, d.token_check("target token"), accum, scalars)?;
        self.backward(inputs, last)?;
        // ZeRO 2: every micro-batch's gradients go to their owners' shards.
        if last || self.zero2 {
            be.grads_reduced()?;
        }
        Ok(())
    }

    /// Store the global gradient norm in `scalars`. With ZeRO stage 1 this rank holds the sums
    /// of the tensors it owns only: the norm combines every rank's norm over its share.
    pub fn grad_norm(&self, scalars: &mut B::Scalars) -> Result<()> {
        let rank = self.backend.rank();
        match (&self.lora, &self.grads, &self.owners) {
            (Some(lo), _, _) => self.backend.grad_norm(&lo.grad_refs(), scalars),
            (None, Some(_), _) if self.zero2 => self.backend.zero2_norm(scalars),
            (None, Some(g), Some(o)) => {
                let owned: Vec<&B::Buf<T>> = g
                    .iter()
                    .into_iter()
                    .zip(o)
                    .filter(|(_, &r)| r == rank)
                    .map(|(t, _)| t)
                    .collect();
                self.backend.grad_norm_sharded(&owned, scalars)
            }
            (None, Some(g), None) => self.backend.grad_norm(&g.iter(), scalars),
            (None, None, _) => Err(TrainError::Op("nothing trains: no gradients".into())),
        }
    }

    /// One AdamW step over every parameter with `hyper` (its weight decay on 2-D tensors only),
    /// the gradients unscaled and clipped as `scaling` says; skipped entirely on a non-finite
    /// gradient norm.
    pub fn update(
        &mut self,
        hyper: &AdamWStep,
        scaling: GradScaling,
        scalars: &B::Scalars,
    ) -> Result<()> {
        if let Some(lo) = self.lora.as_mut() {
            return lo.update(self.backend, hyper, scaling, scalars);
        }
        if self.zero2 {
            let mut params = self.params.iter_mut();
            return self
                .backend
                .zero2_update(hyper, scaling, scalars, &mut params);
        }
        if let (true, Some(grads)) = (self.offload, self.grads.as_ref()) {
            let grads = grads.iter();
            let mut params = self.params.iter_mut();
            self.backend
                .offload_update(hyper, scaling, scalars, &grads, &mut params)?;
            if let Some(o) = &self.owners {
                // Each tensor's owner updated it: hand the new values to every rank.
                self.backend.offload_params_ready(usize::MAX)?;
                let mut bufs: Vec<_> = params.into_iter().zip(o.iter().copied()).collect();
                self.backend.broadcast(&mut bufs)?;
            }
            return Ok(());
        }
        let (Some(grads), Some(ms), Some(vs)) = (
            self.grads.as_ref(),
            self.exp_avg.as_mut(),
            self.exp_avg_sq.as_mut(),
        ) else {
            return Err(TrainError::Op("nothing trains: no optimizer state".into()));
        };
        let mut masters = self.master.as_mut().map(|m| m.iter_mut().into_iter());
        let params = self.params.iter_mut();
        let grads = grads.iter();
        let ms = ms.iter_mut();
        let vs = vs.iter_mut();
        let rank = self.backend.rank();
        let owners = self.owners.as_deref();
        let mut slots: Vec<BackendSlot<'_, B, T>> = params
            .into_iter()
            .zip(grads)
            .zip(ms)
            .zip(vs)
            .zip(&self.decays)
            .map(
                |((((param, grad), exp_avg), exp_avg_sq), &decay)| AdamWSlot {
                    master: masters.as_mut().and_then(|it| it.next()),
                    param,
                    grad,
                    exp_avg,
                    exp_avg_sq,
                    decay,
                },
            )
            .enumerate()
            .filter(|(i, _)| owners.map_or(true, |o| o[*i] == rank))
            .map(|(_, slot)| slot)
            .collect();
        adamw_all(self.backend, hyper, scaling, scalars, &mut slots)?;
        drop(slots);
        if let Some(o) = owners {
            // Each tensor's owner updated it: hand the new values to every rank.
            let mut bufs: Vec<_> = self
                .params
                .iter_mut()
                .into_iter()
                .zip(o.iter().copied())
                .collect();
            self.backend.broadcast(&mut bufs)?;
        }
        Ok(())
    }

    /// This rank's gradient buffers on the host as they stand (after a step: the sums across
    /// ranks, or with ZeRO stage 1 the sums of the tensors it owns and its own contribution to
    /// the others); `None` with a frozen base.
    pub fn download_grads(&self) -> Result<Option<Params<Vec<f32>>>> {
        let be = self.backend;
        self.grads
            .as_ref()
            .map(|g| g.try_map(|_, t| be.download(t)))
            .transpose()
    }

    /// f32 parameters (the master weights when there are) and moments on the host. With ZeRO
    /// every rank must call it at the same point: each tensor's state comes from its owner.
    pub fn download(&self) -> Result<[Params<Vec<f32>>; 3]> {
        let be = self.backend;
        be.offload_params_ready(usize::MAX)?;
        let (Some(exp_avg), Some(exp_avg_sq)) = (&self.exp_avg, &self.exp_avg_sq) else {
            return Err(TrainError::Op(
                "the base is frozen (LoRA): it has no optimizer state to download".into(),
            ));
        };
        if self.zero2 || self.offload {
            let (master, m, v) = match self.offload {
                true => {
                    let lens: Vec<usize> =
                        self.params.iter().iter().map(|t| be.len_of(t)).collect();
                    offload_gather(be, self.owners.as_deref(), &lens, be.offload_download()?)?
                }
                false => be.zero2_download()?,
            };
            let params = match master {
                Some(h) => Params::from_vec(h, self.layers)?,
                None => self.params.try_map(|_, t| be.download(t))?,
            };
            return Ok([
                params,
                Params::from_vec(m, self.layers)?,
                Params::from_vec(v, self.layers)?,
            ]);
        }
        if let Some(o) = &self.owners {
            let lens: Vec<usize> = self.params.iter().iter().map(|t| be.len_of(t)).collect();
            let gather = |p: &Params<B::Buf<f32>>| -> Result<Params<Vec<f32>>> {
                let mut full = p.try_map(|i, t| match o[i] == be.rank() {
                    true => be.download(t).and_then(|h| be.upload::<f32>(&h)),
                    false => be.zeros::<f32>(lens[i]),
                })?;
                let mut bufs: Vec<_> = full.iter_mut().into_iter().zip(o.iter().copied()).collect();
                be.broadcast(&mut bufs)?;
                full.try_map(|_, t| be.download(t))
            };
            let params = match &self.master {
                Some(m) => gather(m)?,
                None => self.params.try_map(|_, t| be.download(t))?,
            };
            return Ok([params, gather(exp_avg)?, gather(exp_avg_sq)?]);
        }
        let stat = |_: usize, t: &B::Buf<f32>| be.download(t);
        let params = match &self.master {
            Some(m) => m.try_map(stat)?,
            None => self.params.try_map(|_, t| be.download(t))?,
        };
        Ok([params, exp_avg.try_map(stat)?, exp_avg_sq.try_map(stat)?])
    }
}

/// Offload with ZeRO 1 (`owners`): every tensor's host state `(master, exp_avg, exp_avg_sq)`
/// from its owner (the others hold it empty), through the device (upload, broadcast,
/// download); every rank calls it at the same point. Without owners, `state` as it is.
pub(crate) fn offload_gather<T: TrainElement, B: Backend<T>>(
    be: &B,
    owners: Option<&[usize]>,
    lens: &[usize],
    state: crate::backend::Zero2Host,
) -> Result<crate::backend::Zero2Host> {
    let Some(o) = owners else {
        return Ok(state);
    };
    let gather = |group: Vec<Vec<f32>>| -> Result<Vec<Vec<f32>>> {
        let mut full = group
            .iter()
            .enumerate()
            .map(|(i, t)| match o.get(i) == Some(&be.rank()) {
                true => be.upload::<f32>(t),
                false => be.zeros::<f32>(lens.get(i).copied().unwrap_or(0)),
            })
            .collect::<Result<Vec<_>>>()?;
        let mut bufs: Vec<_> = full.iter_mut().zip(o.iter().copied()).collect();
        be.broadcast(&mut bufs)?;
        full.iter().map(|t| be.download(t)).collect()
    };
    let (master, m, v) = state;
    Ok((master.map(gather).transpose()?, gather(m)?, gather(v)?))
}

/// ZeRO stage 2: give each empty gradient of `grads` (canonical index, buffer) its zeroed
/// buffer of `lens[index]` elements (every micro-batch: the previous one handed it over).
pub(crate) fn zero2_alloc<T: TrainElement, B: Backend<T>>(
    be: &B,
    grads: Vec<(usize, &mut B::Buf<T>)>,
    lens: &[usize],
) -> Result<()> {
    for (i, g) in grads {
        let n = lens.get(i).copied().unwrap_or(0);
        if be.len_of(g) != n {
            *g = be.zeros::<T>(n)?;
        }
    }
    Ok(())
}

/// ZeRO stage 2: hand a micro-batch's final gradients `grads` (canonical index, buffer;
/// `last`: the step's last micro-batch) to the backend's bucket, leaving them empty.
pub(crate) fn zero2_hand<T: TrainElement, B: Backend<T>>(
    be: &B,
    grads: Vec<(usize, &mut B::Buf<T>)>,
    last: bool,
) -> Result<()> {
    let taken = grads
        .into_iter()
        .map(|(i, g)| Ok((i, std::mem::replace(g, be.zeros::<T>(0)?))))
        .collect::<Result<Vec<_>>>()?;
    be.zero2_ready(taken, last)
}

/// ZeRO stage 1's owner of each tensor (lengths `lens` in canonical order) among `world` ranks:
/// the tensors in order, cut into `world` runs of about equal element counts (a tensor belongs
/// to the rank whose share holds its middle element).
pub fn zero_owners(lens: &[usize], world: usize) -> Vec<usize> {
    let total: usize = lens.iter().sum::<usize>().max(1);
    let mut start = 0usize;
    lens.iter()
        .map(|&n| {
            let mid = start as u128 * 2 + n as u128;
            start += n;
            ((mid * world as u128 / (2 * total as u128)) as usize).min(world.saturating_sub(1))
        })
        .collect()
}
