//! GPT-2 forward and backward, written once over [`Backend`].

use crate::backend::TrainElement;
use crate::backend::{AdamWSlot, AdamWStep, Backend, Dims, Gemm, GradScaling};
use crate::config::GptConfig;
use crate::error::{Result, TrainError};
use crate::lora::adapters::Adapters;
use crate::lora::{HostAdapters, Target};
use crate::params::{specs, Params};
use hip_kernels::params::DType;
use std::marker::PhantomData;

/// Saved activations of one layer (`N = B·T` rows): `T` tensors, `S` f32 statistics.
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
    resid_out: T,
}

/// Activations of the whole model plus the backward's scratch.
struct Acts<T, S> {
    encoded: T,
    layers: Vec<LayerActs<T, S>>,
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
}

/// A GPT-2 on a backend with storage type `T`: parameters, their gradients, f32 master weights
/// (when `T` is not f32), f32 AdamW moments and activations.
pub struct Gpt2<'b, T: TrainElement, B: Backend<T>> {
    backend: &'b B,
    /// Dimensions of a micro-batch.
    pub dims: Dims,
    layers: usize,
    /// Parameters in `T`.
    pub params: Params<B::Buf>,
    /// f32 master weights, when `T` is not f32.
    pub master: Option<Params<B::Stat>>,
    /// Gradients, accumulated over the micro-batches of a step (`None`: the base is frozen, LoRA).
    pub grads: Option<Params<B::Buf>>,
    /// AdamW first moments (`None` when frozen).
    pub exp_avg: Option<Params<B::Stat>>,
    /// AdamW second moments (`None` when frozen).
    pub exp_avg_sq: Option<Params<B::Stat>>,
    /// LoRA's adapters, the only trainable tensors when present.
    pub lora: Option<Adapters<T, B>>,
    /// With a frozen base: where the layer norms' unused weight gradients go (`[C]` each; the
    /// op always writes them).
    frozen_ln: Option<[B::Buf; 2]>,
    /// Weight decay applies (2-D tensors), in canonical order.
    decays: Vec<bool>,
    /// ZeRO stage 1: the rank that keeps each tensor's AdamW state (and f32 master weights)
    /// and updates it, in canonical order; `None`: every rank keeps and updates all.
    owners: Option<Vec<usize>>,
    acts: Acts<B::Buf, B::Stat>,
    _t: PhantomData<T>,
}

fn mm(m: usize, n: usize, k: usize, trans_a: bool, trans_b: bool) -> Gemm {
    Gemm {
        m,
        n,
        k,
        trans_a,
        trans_b,
    }
}

impl<'b, T: TrainElement, B: Backend<T>> Gpt2<'b, T, B> {
    /// Upload `[params, exp_avg, exp_avg_sq]` for micro-batches of `batch × seq`. With `zero`
    /// (ZeRO stage 1) and several ranks, this rank keeps the moments and master weights of its
    /// share of the tensors only ([`zero_owners`]); the others are empty.
    pub fn new(
        backend: &'b B,
        cfg: &GptConfig,
        [params, exp_avg, exp_avg_sq]: [&Params<Vec<f32>>; 3],
        batch: usize,
        seq: usize,
        zero: bool,
    ) -> Result<Self> {
        Self::build(
            backend,
            cfg,
            params,
            Some([exp_avg, exp_avg_sq]),
            None,
            [batch, seq],
            zero,
        )
    }

    /// Upload the frozen base `params` (no gradients, no optimizer state) and LoRA's `adapters`
    /// for micro-batches of `batch × seq`.
    pub fn with_lora(
        backend: &'b B,
        cfg: &GptConfig,
        params: &Params<Vec<f32>>,
        adapters: &HostAdapters,
        batch: usize,
        seq: usize,
    ) -> Result<Self> {
        Self::build(
            backend,
            cfg,
            params,
            None,
            Some(adapters),
            [batch, seq],
            false,
        )
    }

    fn build(
        backend: &'b B,
        cfg: &GptConfig,
        params: &Params<Vec<f32>>,
        moments: Option<[&Params<Vec<f32>>; 2]>,
        adapters: Option<&HostAdapters>,
        [batch, seq]: [usize; 2],
        zero: bool,
    ) -> Result<Self> {
        let owners = (zero && backend.world() > 1).then(|| {
            let lens: Vec<usize> = params.iter().iter().map(|t| t.len()).collect();
            zero_owners(&lens, backend.world())
        });
        let rank = backend.rank();
        let mine = |i: usize| owners.as_ref().map_or(true, |o| o[i] == rank);
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
        let up = |_: usize, t: &Vec<f32>| backend.upload(t);
        let up_stat = |i: usize, t: &Vec<f32>| match mine(i) {
            true => backend.upload_stat(t),
            false => backend.zeros_stat(0),
        };
        let zero = |_: usize, t: &Vec<f32>| backend.zeros(t.len());
        let (n, c, f) = (dims.rows(), dims.channels, dims.inner);
        let z = |len: usize| backend.zeros(len);
        let zs = |len: usize| backend.zeros_stat(len);
        let lse_len = batch * cfg.heads * seq;
        let layers = (0..cfg.layers)
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
                    resid_out: z(n * c)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let acts = Acts {
            encoded: z(n * c)?,
            layers,
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
            decays: specs(cfg).iter().map(|s| s.decays()).collect(),
            owners,
            acts,
            _t: PhantomData,
        })
    }

    /// Set every gradient to zero (start of a step).
    pub fn zero_grads(&mut self) -> Result<()> {
        for g in self.grads.iter_mut().flat_map(|g| g.iter_mut()) {
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
        be.cross_entropy(&d, &mut self.acts.logits, targets, accum, share, scalars)?;
        self.backward(inputs, last)?;
        if last {
            be.grads_reduced()?;
        }
        Ok(())
    }

    fn forward(&mut self, inputs: &B::Ids) -> Result<()> {
        let (be, d, p, a) = (self.backend, self.dims, &self.params, &mut self.acts);
        let mut lora = self.lora.as_mut();
        let (n, c, f) = (d.rows(), d.channels, d.inner);
        be.encoder_forward(&d, inputs, &p.wte, &p.wpe, &mut a.encoded)?;
        // The first layer norm reads the embeddings; every later one is fused with the residual
        // add before it (the next layer's ln_1, or ln_f after the last layer).
        if let Some(s) = a.layers.first_mut() {
            let w = &p.layers[0];
            be.layernorm_forward(
                &d,
                &a.encoded,
                &w.ln1_w,
                &w.ln1_b,
                &mut s.ln1,
                &mut s.ln1_mean,
                &mut s.ln1_rstd,
            )?;
        }
        for l in 0..self.layers {
            let (done, rest) = a.layers.split_at_mut(l);
            let x = done.last().map_or(&a.encoded, |prev| &prev.resid_out);
            let (s, later) = rest
                .split_first_mut()
                .ok_or_else(|| TrainError::Op(format!("layer {l} has no activations")))?;
            let w = &p.layers[l];
            be.matmul_bias(
                mm(n, 3 * c, c, false, false),
                &s.ln1,
                &w.qkv_w,
                &w.qkv_b,
                &mut s.qkv,
                None,
            )?;
            if let Some(lo) = lora.as_deref_mut() {
                lo.forward(be, l, Target::CAttn, &s.ln1, &mut s.qkv)?;
            }
            be.attention_forward(&d, &s.qkv, &mut s.atty, &mut s.lse)?;
            be.matmul_bias(
                mm(n, c, c, false, false),
                &s.atty,
                &w.proj_w,
                &w.proj_b,
                &mut a.branch,
                None,
            )?;
            if let Some(lo) = lora.as_deref_mut() {
                lo.forward(be, l, Target::AttnProj, &s.atty, &mut a.branch)?;
            }
            be.residual_layernorm_forward(
                &d,
                x,
                &a.branch,
                &w.ln2_w,
                &w.ln2_b,
                &mut s.resid_mid,
                &mut s.ln2,
                &mut s.ln2_mean,
                &mut s.ln2_rstd,
            )?;
            match lora.as_deref_mut().filter(|lo| lo.adapts(Target::CFc)) {
                // The adapter adds to GELU's input: the bias GEMM writes it, the adapter
                // accumulates into it, then GELU.
                Some(lo) => {
                    be.matmul_bias(
                        mm(n, f, c, false, false),
                        &s.ln2,
                        &w.fc_w,
                        &w.fc_b,
                        &mut s.fc_pre,
                        None,
                    )?;
                    lo.forward(be, l, Target::CFc, &s.ln2, &mut s.fc_pre)?;
                    be.gelu_forward(&s.fc_pre, &mut s.fc_gelu)?;
                }
                None => be.matmul_bias(
                    mm(n, f, c, false, false),
                    &s.ln2,
                    &w.fc_w,
                    &w.fc_b,
                    &mut s.fc_gelu,
                    Some(&mut s.fc_pre),
                )?,
            }
            be.matmul_bias(
                mm(n, c, f, false, false),
                &s.fc_gelu,
                &w.mproj_w,
                &w.mproj_b,
                &mut a.branch,
                None,
            )?;
            if let Some(lo) = lora.as_deref_mut() {
                lo.forward(be, l, Target::MlpProj, &s.fc_gelu, &mut a.branch)?;
            }
            let (ln_w, ln_b, y, mean, rstd) = match later.first_mut() {
                Some(next) => {
                    let nw = &p.layers[l + 1];
                    (
                        &nw.ln1_w,
                        &nw.ln1_b,
                        &mut next.ln1,
                        &mut next.ln1_mean,
                        &mut next.ln1_rstd,
                    )
                }
                None => (
                    &p.lnf_w,
                    &p.lnf_b,
                    &mut a.lnf,
                    &mut a.lnf_mean,
                    &mut a.lnf_rstd,
                ),
            };
            be.residual_layernorm_forward(
                &d,
                &s.resid_mid,
                &a.branch,
                ln_w,
                ln_b,
                &mut s.resid_out,
                y,
                mean,
                rstd,
            )?;
        }
        if self.layers == 0 {
            be.layernorm_forward(
                &d,
                &a.encoded,
                &p.lnf_w,
                &p.lnf_b,
                &mut a.lnf,
                &mut a.lnf_mean,
                &mut a.lnf_rstd,
            )?;
        }
        be.matmul(
            mm(n, d.vocab, c, false, true),
            &a.lnf,
            &p.wte,
            &mut a.logits,
            false,
        )
    }

    fn backward(&mut self, inputs: &B::Ids, last: bool) -> Result<()> {
        let (be, d, p, a) = (self.backend, self.dims, &self.params, &mut self.acts);
        // `None` with a frozen base (LoRA): no weight gradient is computed, only the input
        // gradients the adapters need.
        let mut g = self.grads.as_mut();
        let mut lora = self.lora.as_mut();
        let mut frozen = self.frozen_ln.as_mut();
        // ZeRO stage 1: the owners of canonical tensors `at..at + k` (where their sums go).
        let owners = self.owners.as_deref();
        let roots = |at: usize, k: usize| owners.map(|o| &o[at..at + k]);
        let (n, c, f, v) = (d.rows(), d.channels, d.inner, d.vocab);
        // logits = lnf · wteᵀ; `a.logits` now holds dlogits.
        if let Some(g) = g.as_deref_mut() {
            be.matmul(
                mm(v, c, n, true, false),
                &a.logits,
                &a.lnf,
                &mut g.wte,
                true,
            )?;
        }
        be.matmul(
            mm(n, c, v, false, false),
            &a.logits,
            &p.wte,
            &mut a.branch,
            false,
        )?;
        be.fill_zero(&mut a.dres)?;
        let x_last = a.layers.last().map_or(&a.encoded, |s| &s.resid_out);
        let (dw, db) = ln_grads(
            g.as_deref_mut().map(|g| (&mut g.lnf_w, &mut g.lnf_b)),
            frozen.as_deref_mut(),
        )?;
        be.layernorm_backward(
            &d,
            x_last,
            &p.lnf_w,
            &a.branch,
            &a.lnf_mean,
            &a.lnf_rstd,
            &mut a.dres,
            dw,
            db,
        )?;
        if let (true, Some(g)) = (last, g.as_deref_mut()) {
            let at = 2 + 12 * self.layers;
            be.grads_ready(&mut [&mut g.lnf_w, &mut g.lnf_b], roots(at, 2))?;
        }
        for l in (0..self.layers).rev() {
            let (done, rest) = a.layers.split_at(l);
            let x = done.last().map_or(&a.encoded, |prev| &prev.resid_out);
            let (w, s) = (&p.layers[l], &rest[0]);
            let mut gw = g.as_deref_mut().map(|g| &mut g.layers[l]);
            // MLP: resid_out = resid_mid + gelu(ln2·Wfc + bfc)·Wmproj + bmproj.
            if let Some(gw) = gw.as_deref_mut() {
                be.matmul(
                    mm(f, c, n, true, false),
                    &s.fc_gelu,
                    &a.dres,
                    &mut gw.mproj_w,
                    true,
                )?;
                be.bias_backward(n, &a.dres, &mut gw.mproj_b)?;
            }
            be.matmul(
                mm(n, f, c, false, true),
                &a.dres,
                &w.mproj_w,
                &mut a.dfc_gelu,
                false,
            )?;
            if let Some(lo) = lora.as_deref_mut() {
                lo.backward(be, l, Target::MlpProj, &s.fc_gelu, &a.dres, &mut a.dfc_gelu)?;
            }
            be.gelu_backward(&s.fc_pre, &a.dfc_gelu, &mut a.dfc_pre)?;
            if let Some(gw) = gw.as_deref_mut() {
                be.matmul(
                    mm(c, f, n, true, false),
                    &s.ln2,
                    &a.dfc_pre,
                    &mut gw.fc_w,
                    true,
                )?;
                be.bias_backward(n, &a.dfc_pre, &mut gw.fc_b)?;
            }
            be.matmul(
                mm(n, c, f, false, true),
                &a.dfc_pre,
                &w.fc_w,
                &mut a.branch,
                false,
            )?;
            if let Some(lo) = lora.as_deref_mut() {
                lo.backward(be, l, Target::CFc, &s.ln2, &a.dfc_pre, &mut a.branch)?;
            }
            let (dw, db) = ln_grads(
                gw.as_deref_mut().map(|g| (&mut g.ln2_w, &mut g.ln2_b)),
                frozen.as_deref_mut(),
            )?;
            be.layernorm_backward(
                &d,
                &s.resid_mid,
                &w.ln2_w,
                &a.branch,
                &s.ln2_mean,
                &s.ln2_rstd,
                &mut a.dres,
                dw,
                db,
            )?;
            // Attention: resid_mid = x + attn(ln1·Wqkv + bqkv)·Wproj + bproj.
            if let Some(gw) = gw.as_deref_mut() {
                be.matmul(
                    mm(c, c, n, true, false),
                    &s.atty,
                    &a.dres,
                    &mut gw.proj_w,
                    true,
                )?;
                be.bias_backward(n, &a.dres, &mut gw.proj_b)?;
            }
            be.matmul(
                mm(n, c, c, false, true),
                &a.dres,
                &w.proj_w,
                &mut a.datty,
                false,
            )?;
            if let Some(lo) = lora.as_deref_mut() {
                lo.backward(be, l, Target::AttnProj, &s.atty, &a.dres, &mut a.datty)?;
            }
            be.attention_backward(&d, &s.qkv, &s.atty, &a.datty, &s.lse, &mut a.dqkv)?;
            if let Some(gw) = gw.as_deref_mut() {
                be.matmul(
                    mm(c, 3 * c, n, true, false),
                    &s.ln1,
                    &a.dqkv,
                    &mut gw.qkv_w,
                    true,
                )?;
                be.bias_backward(n, &a.dqkv, &mut gw.qkv_b)?;
            }
            be.matmul(
                mm(n, c, 3 * c, false, true),
                &a.dqkv,
                &w.qkv_w,
                &mut a.branch,
                false,
            )?;
            if let Some(lo) = lora.as_deref_mut() {
                lo.backward(be, l, Target::CAttn, &s.ln1, &a.dqkv, &mut a.branch)?;
            }
            let (dw, db) = ln_grads(
                gw.as_deref_mut().map(|g| (&mut g.ln1_w, &mut g.ln1_b)),
                frozen.as_deref_mut(),
            )?;
            be.layernorm_backward(
                &d,
                x,
                &w.ln1_w,
                &a.branch,
                &s.ln1_mean,
                &s.ln1_rstd,
                &mut a.dres,
                dw,
                db,
            )?;
            if let (true, Some(gw)) = (last, gw) {
                // Layer l's twelve gradients are final: one bucket.
                be.grads_ready(&mut gw.iter_mut(), roots(2 + 12 * l, 12))?;
            }
        }
        if let (true, Some(lo)) = (last, lora) {
            // LoRA: the adapters' gradients are the only ones to sum across ranks (one bucket).
            be.grads_ready(&mut lo.grads.iter_mut().collect::<Vec<_>>(), None)?;
        }
        if let Some(g) = g {
            be.encoder_backward(&d, inputs, &a.dres, &mut g.wte, &mut g.wpe)?;
            if last {
                be.grads_ready(&mut [&mut g.wte, &mut g.wpe], roots(0, 2))?;
            }
        }
        // Frozen embeddings (LoRA): the residual gradient ends here.
        Ok(())
    }

    /// Store the global gradient norm in `scalars`. With ZeRO stage 1 this rank holds the sums
    /// of the tensors it owns only: the norm combines every rank's norm over its share.
    pub fn grad_norm(&self, scalars: &mut B::Scalars) -> Result<()> {
        let rank = self.backend.rank();
        match (&self.lora, &self.grads, &self.owners) {
            (Some(lo), _, _) => self.backend.grad_norm(&lo.grad_refs(), scalars),
            (None, Some(g), Some(o)) => {
                let owned: Vec<&B::Buf> = g
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
        let mut slots: Vec<AdamWSlot<'_, B::Buf, B::Stat>> = params
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
        self.backend
            .adamw_all(hyper, scaling, scalars, &mut slots)?;
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
        let (Some(exp_avg), Some(exp_avg_sq)) = (&self.exp_avg, &self.exp_avg_sq) else {
            return Err(TrainError::Op(
                "the base is frozen (LoRA): it has no optimizer state to download".into(),
            ));
        };
        if let Some(o) = &self.owners {
            let lens: Vec<usize> = self.params.iter().iter().map(|t| be.len_of(t)).collect();
            let gather = |p: &Params<B::Stat>| -> Result<Params<Vec<f32>>> {
                let mut full = p.try_map(|i, t| match o[i] == be.rank() {
                    true => be.download_stat(t).and_then(|h| be.upload_stat(&h)),
                    false => be.zeros_stat(lens[i]),
                })?;
                let mut bufs: Vec<_> = full.iter_mut().into_iter().zip(o.iter().copied()).collect();
                be.broadcast_stat(&mut bufs)?;
                full.try_map(|_, t| be.download_stat(t))
            };
            let params = match &self.master {
                Some(m) => gather(m)?,
                None => self.params.try_map(|_, t| be.download(t))?,
            };
            return Ok([params, gather(exp_avg)?, gather(exp_avg_sq)?]);
        }
        let stat = |_: usize, t: &B::Stat| be.download_stat(t);
        let params = match &self.master {
            Some(m) => m.try_map(stat)?,
            None => self.params.try_map(|_, t| be.download(t))?,
        };
        Ok([params, exp_avg.try_map(stat)?, exp_avg_sq.try_map(stat)?])
    }
}

/// Where a layer norm's weight and bias gradients go: the model's gradients, or with a frozen
/// base the scratch pair nobody reads.
fn ln_grads<'x, U>(
    trained: Option<(&'x mut U, &'x mut U)>,
    frozen: Option<&'x mut [U; 2]>,
) -> Result<(&'x mut U, &'x mut U)> {
    match (trained, frozen) {
        (Some(t), _) => Ok(t),
        (None, Some([w, b])) => Ok((w, b)),
        (None, None) => Err(TrainError::Op(
            "a layer norm's weight gradients have no buffer".into(),
        )),
    }
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
