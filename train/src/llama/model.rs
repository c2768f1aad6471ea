//! The LLaMA-family forward and backward (docs/TRAIN-LLAMA.md, "Forward"), written once over
//! [`Backend`]: each op is its argument struct (`hip_kernels::ops`, named fields) built on the
//! backend's space and run on its queue.
//!
//! q, k and v come out of one GEMM into one `[N, (H + 2K)·D]` tensor (the weights stacked by
//! rows, [`Trained`]); rotary and attention read their heads in place through strided layouts,
//! and the attention backward writes their gradients into one tensor of the same layout, which
//! one GEMM takes back to the input. The gate and up projections likewise form one `[N, 2F]`
//! tensor that SwiGLU reads fused. Each residual add is fused with the RMSNorm after it.

use super::config::LlamaConfig;
use super::params::{Linear, Trained, TrainedLayer};
use crate::backend::{
    adamw_all, gemm, AdamWSlot, AdamWStep, Backend, BatchIds, GradScaling, IdCheck, TrainElement,
    View,
};
use crate::data::Batch;
use crate::error::{Result, TrainError};
use crate::model::zero_owners;
use hip_kernels::ops::{
    AttentionBackwardStrided, AttentionForwardStrided, AttentionLayout, AttentionParams,
    BiasBackward, BiasParams, CrossEntropyParams, EncoderBackward, EncoderForward, EncoderParams,
    GateUp, GateUpGrad, Matmul, MatmulBias, MatmulBiasParams, MatmulParams, ResidualRmsNormForward,
    RmsNormBackward, RmsNormForward, RmsNormParams, Rope, RopeBackward, RopeParams, Run,
    SoftmaxCrossEntropy, Strided, SwigluBackward, SwigluForward, SwigluParams,
};
use hip_kernels::params::DType;
use std::marker::PhantomData;

/// Dimensions of one micro-batch of a LLaMA-family model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LlamaDims {
    /// Rows B.
    pub batch: usize,
    /// Positions per row T.
    pub seq: usize,
    /// Width C.
    pub channels: usize,
    /// Query heads H.
    pub heads: usize,
    /// Key/value heads K.
    pub kv_heads: usize,
    /// Head dimension D.
    pub head_dim: usize,
    /// MLP width F.
    pub inner: usize,
    /// Vocabulary V.
    pub vocab: usize,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// Dims of each head the rotary turns (the first R of D).
    pub rotary_dim: usize,
    /// Rotary pairs are adjacent dims (GLM) rather than dims R/2 apart.
    pub interleaved: bool,
}

impl LlamaDims {
    /// Positions of a micro-batch, N = B·T.
    pub fn rows(&self) -> usize {
        self.batch * self.seq
    }

    /// Width of the fused q/k/v rows, (H + 2K)·D.
    pub fn qkv_width(&self) -> usize {
        (self.heads + 2 * self.kv_heads) * self.head_dim
    }

    fn norm(&self) -> RmsNormParams {
        RmsNormParams {
            rows: self.rows(),
            cols: self.channels,
            eps: self.eps,
        }
    }

    /// Where q (`which` 0), k (1) and v (2) sit in the fused `[rows, (H + 2K)·D]` tensor, as
    /// `[batch, heads, seq, D]` views.
    fn qkv_layout(&self, which: usize, batch_rows: usize) -> AttentionLayout {
        let (h, k, d, w) = (self.heads, self.kv_heads, self.head_dim, self.qkv_width());
        let offset = match which {
            0 => 0,
            1 => h * d,
            _ => (h + k) * d,
        };
        AttentionLayout {
            offset,
            batch_stride: batch_rows * w,
            head_stride: d,
            seq_stride: w,
        }
    }

    fn rope(&self, heads: usize) -> RopeParams {
        RopeParams {
            batch: self.batch,
            seq: self.seq,
            heads,
            head_dim: self.head_dim,
            rotary_dim: self.rotary_dim,
            interleaved: self.interleaved,
        }
    }
}

/// Saved activations of one layer (`N = B·T` rows): `A` tensors, `S` f32 statistics. The
/// layer's output (the residual stream after it) lives in `Acts::resid`.
struct LayerActs<A, S> {
    /// The layer's input normed `[N, C]` and its `rstd`.
    h1: A,
    rstd1: S,
    /// q, k, v `[N, (H + 2K)·D]`, q and k rotated.
    qkv: A,
    /// Attention output `[N, H·D]` and its log-sum-exp.
    att: A,
    lse: S,
    /// Residual after attention `[N, C]`, normed, `rstd`.
    resid_mid: A,
    h2: A,
    rstd2: S,
    /// gate and up `[N, 2F]`, SwiGLU of them `[N, F]`.
    gate_up: A,
    act: A,
}

/// Activations of the whole model plus the backward's scratch.
struct Acts<A, S> {
    embedded: A,
    /// One set per layer; with activation checkpointing one set, which each layer's forward
    /// and its recomputation in the backward reuse.
    layers: Vec<LayerActs<A, S>>,
    /// The residual stream after each layer `[N, C]` (layer `l + 1`'s input): with
    /// checkpointing, what the forward keeps of the layers.
    resid: Vec<A>,
    /// Final norm `[N, C]` and its `rstd`.
    hf: A,
    rstdf: S,
    /// Logits `[N, V]`, then their gradient.
    logits: A,
    losses: S,
    /// `[N, C]` scratch: a branch output in the forward, a branch gradient in the backward.
    branch: A,
    /// Gradient of the residual stream `[N, C]`.
    dres: A,
    dqkv: A,
    datt: A,
    dgate_up: A,
    dact: A,
    /// The embedding op adds a position table: zeros `[T, C]` (LLaMA has none) and the
    /// gradient it writes, never read.
    no_positions: A,
    no_positions_grad: A,
}

/// A LLaMA-family model on a backend with storage type `T`: parameters (in the [`Trained`]
/// order), their gradients, f32 master weights (when `T` is not f32), f32 AdamW moments and
/// activations.
pub struct Llama<'b, T: TrainElement, B: Backend<T>> {
    backend: &'b B,
    /// Dimensions of a micro-batch.
    pub dims: LlamaDims,
    layout: Trained,
    /// Parameters in `T`.
    pub params: Vec<B::Buf<T>>,
    /// f32 master weights, when `T` is not f32.
    pub master: Option<Vec<B::Buf<f32>>>,
    /// Gradients, accumulated over the micro-batches of a step.
    pub grads: Vec<B::Buf<T>>,
    /// AdamW first moments.
    pub exp_avg: Vec<B::Buf<f32>>,
    /// AdamW second moments.
    pub exp_avg_sq: Vec<B::Buf<f32>>,
    /// The rotary frequency table `[R/2]`.
    freqs: B::Buf<f32>,
    /// Positions 0..T of every row (the token stream's).
    stream_positions: B::Ids,
    /// Weight decay applies (2-D tensors), in the trained order.
    decays: Vec<bool>,
    /// ZeRO stage 1: the rank that keeps each tensor's AdamW state (and f32 master weights)
    /// and updates it; `None`: every rank keeps and updates all.
    owners: Option<Vec<usize>>,
    /// ZeRO stage 2: the backend keeps this rank's shards of the gradients and optimizer
    /// state; the model's gradients are empty outside the backward that produces them.
    zero2: bool,
    /// `--offload-optimizer cpu`: the backend keeps the master weights and moments in host
    /// memory ([`crate::offload`]); the model's are empty.
    offload: bool,
    /// Every trained tensor's length, in the trained order.
    grad_lens: Vec<usize>,
    /// LoRA: the base is never updated and has no gradients of its 2-D weights.
    frozen: bool,
    /// `--grad-checkpoint`: the forward keeps each layer's input only, and the backward
    /// recomputes each layer's activations (into the one set of `Acts::layers`) before its
    /// backward.
    grad_checkpoint: bool,
    acts: Acts<B::Buf<T>, B::Buf<f32>>,
    /// LoRA's adapters (`--lora-rank`): they add into the targets' outputs; the base is then
    /// not updated.
    pub lora: Option<super::lora::LlamaAdapters<T, B>>,
    _t: PhantomData<T>,
}

fn op(e: hip_kernels::ops::OpError) -> TrainError {
    TrainError::Op(e.to_string())
}

/// [`gemm`] adding to the output (a weight gradient accumulated over micro-batches).
fn gemm_acc(m: usize, n: usize, k: usize, trans_a: bool, trans_b: bool) -> MatmulParams {
    MatmulParams {
        beta: 1.0,
        ..gemm(m, n, k, trans_a, trans_b)
    }
}

impl<'b, T: TrainElement, B: Backend<T>> Llama<'b, T, B> {
    /// Upload `[params, exp_avg, exp_avg_sq]` (in the [`Trained`] order) for micro-batches of
    /// `batch × seq`. With ZeRO stage `zero` 1 and several ranks, this rank keeps the moments
    /// and master weights of its share of the tensors only ([`zero_owners`]); with stage 2 the
    /// backend keeps an element-granular share of them and of the gradients
    /// ([`crate::zero2`]). With `frozen`
    /// (LoRA) the model is never updated: no master weights, no moments, and no gradient
    /// buffers for the 2-D weights (the backward skips their products); only the small 1-D
    /// tensors keep a gradient buffer, written and never read. With `grad_checkpoint` the
    /// activations of one layer are kept at a time (`--grad-checkpoint`).
    pub fn new(
        backend: &'b B,
        cfg: &LlamaConfig,
        [params, exp_avg, exp_avg_sq]: [&[Vec<f32>]; 3],
        [batch, seq]: [usize; 2],
        zero: u8,
        frozen: bool,
        grad_checkpoint: bool,
    ) -> Result<Self> {
        let layout = Trained::new(cfg);
        if params.len() != layout.specs.len() {
            return Err(TrainError::Op(format!(
                "{} tensors for {}, which trains {}",
                params.len(),
                cfg.describe(),
                layout.specs.len()
            )));
        }
        let zero2 = zero == 2 && backend.world() > 1 && !frozen;
        let owners = (zero == 1 && backend.world() > 1).then(|| {
            let lens: Vec<usize> = params.iter().map(Vec::len).collect();
            zero_owners(&lens, backend.world())
        });
        // --offload-optimizer cpu: the master weights and moments live on the host.
        let offload = backend.offloads() && !frozen && !zero2;
        let rank = backend.rank();
        let mine = |i: usize| !zero2 && !offload && owners.as_ref().map_or(true, |o| o[i] == rank);
        let dims = LlamaDims {
            batch,
            seq,
            channels: cfg.channels,
            heads: cfg.heads,
            kv_heads: cfg.kv_heads,
            head_dim: cfg.head_dim,
            inner: cfg.inner,
            vocab: cfg.vocab,
            eps: cfg.eps as f32,
            rotary_dim: cfg.rotary_dim,
            interleaved: cfg.interleaved,
        };
        let up_stat = |(i, t): (usize, &Vec<f32>)| match mine(i) && !frozen {
            true => backend.upload::<f32>(t),
            false => backend.zeros::<f32>(0),
        };
        let decays: Vec<bool> = layout.specs.iter().map(|s| s.decays()).collect();
        fn host(g: &[Vec<f32>]) -> Vec<&[f32]> {
            g.iter().map(|t| &t[..]).collect()
        }
        if zero2 {
            backend.zero2_init([&host(params), &host(exp_avg), &host(exp_avg_sq)], &decays)?;
        }
        if offload {
            // ZeRO 1: only the tensors this rank owns.
            let own = |g| crate::offload::owned_only(host(g), owners.as_deref(), rank);
            backend.offload_init([&own(params), &own(exp_avg), &own(exp_avg_sq)], &decays)?;
        }
        let (n, c, f) = (dims.rows(), dims.channels, dims.inner);
        let hd = dims.heads * dims.head_dim;
        let z = |len: usize| backend.zeros::<T>(len);
        let zs = |len: usize| backend.zeros::<f32>(len);
        let sets = match grad_checkpoint {
            true => cfg.layers.min(1),
            false => cfg.layers,
        };
        let layers = (0..sets)
            .map(|_| {
                Ok(LayerActs {
                    h1: z(n * c)?,
                    rstd1: zs(n)?,
                    qkv: z(n * dims.qkv_width())?,
                    att: z(n * hd)?,
                    lse: zs(n * dims.heads)?,
                    resid_mid: z(n * c)?,
                    h2: z(n * c)?,
                    rstd2: zs(n)?,
                    gate_up: z(n * 2 * f)?,
                    act: z(n * f)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let acts = Acts {
            embedded: z(n * c)?,
            layers,
            resid: (0..cfg.layers).map(|_| z(n * c)).collect::<Result<_>>()?,
            hf: z(n * c)?,
            rstdf: zs(n)?,
            logits: z(n * dims.vocab)?,
            losses: zs(n)?,
            branch: z(n * c)?,
            dres: z(n * c)?,
            dqkv: z(n * dims.qkv_width())?,
            datt: z(n * hd)?,
            dgate_up: z(n * 2 * f)?,
            dact: z(n * f)?,
            no_positions: z(seq * c)?,
            no_positions_grad: z(seq * c)?,
        };
        let positions: Vec<i32> = (0..n)
            .map(|i| i32::try_from(i % seq.max(1)).unwrap_or(i32::MAX))
            .collect();
        let stat = |group: &[Vec<f32>]| -> Result<Vec<B::Buf<f32>>> {
            group.iter().enumerate().map(up_stat).collect()
        };
        Ok(Self {
            backend,
            dims,
            params: params
                .iter()
                .map(|t| backend.upload::<T>(t))
                .collect::<Result<_>>()?,
            master: match (<T as hip_kernels::params::Element>::DTYPE, frozen) {
                (DType::F32, _) | (_, true) => None,
                _ => Some(stat(params)?),
            },
            grads: params
                .iter()
                .zip(&decays)
                // ZeRO 2: allocated by the backward (`zero2_alloc`).
                .map(|(t, &d)| backend.zeros::<T>(if (frozen && d) || zero2 { 0 } else { t.len() }))
                .collect::<Result<_>>()?,
            exp_avg: stat(exp_avg)?,
            exp_avg_sq: stat(exp_avg_sq)?,
            freqs: backend.upload::<f32>(&cfg.frequencies()?)?,
            stream_positions: backend.ids(&positions)?,
            decays,
            frozen,
            grad_checkpoint,
            grad_lens: params.iter().map(Vec::len).collect(),
            layout,
            owners,
            zero2,
            offload,
            acts,
            lora: None,
            _t: PhantomData,
        })
    }

    /// Set every gradient to zero (start of a step).
    pub fn zero_grads(&mut self) -> Result<()> {
        // ZeRO 2: the backward allocates them zeroed.
        for g in self.grads.iter_mut().filter(|_| !self.zero2) {
            self.backend.fill_zero(g)?;
        }
        if let Some(lo) = self.lora.as_mut() {
            lo.zero_grads(self.backend)?;
        }
        self.backend.fill_zero(&mut self.acts.no_positions_grad)
    }

    /// Forward and backward of one micro-batch (this rank's rows of `batch`): its summed loss
    /// over counted targets divided by `divisor` (the step's counted targets over every
    /// micro-batch and rank) is added to `scalars`, and the gradients of that times
    /// `loss_scale` accumulate. With several ranks the gradients are summed across ranks (each
    /// rank's share already divided by the global count), and `last` (the step's last
    /// micro-batch) hands each layer's gradients to the backend's all-reduce (with ZeRO stage 1:
    /// a reduce to each tensor's owner) as soon as the backward has produced them.
    pub fn forward_backward(
        &mut self,
        batch: &Batch,
        divisor: usize,
        loss_scale: f64,
        scalars: &mut B::Scalars,
        last: bool,
    ) -> Result<()> {
        let ids = self.backend.batch_ids(batch, None)?;
        self.forward_backward_ids(batch, ids, divisor, loss_scale, scalars, last)
    }

    /// [`Llama::forward_backward`] on `ids`, the backend's ids of `batch` (made ahead, e.g.
    /// staged by the SFT producer and copied on the device's copy stream).
    pub fn forward_backward_ids(
        &mut self,
        batch: &Batch,
        ids: BatchIds<B::Ids>,
        divisor: usize,
        loss_scale: f64,
        scalars: &mut B::Scalars,
        last: bool,
    ) -> Result<()> {
        let be = self.backend;
        let d = self.dims;
        let n = d.rows();
        if batch.inputs.len() != n || batch.targets.len() != n {
            return Err(TrainError::Op(format!(
                "a micro-batch of {} inputs and {} targets for {} rows × {} positions",
                batch.inputs.len(),
                batch.targets.len(),
                d.batch,
                d.seq
            )));
        }
        let BatchIds {
            inputs,
            targets,
            positions: own_positions,
            cu_seqlens,
        } = ids;
        // Packed rows bring their positions and sequence boundaries; a token stream uses 0..T.
        let (positions, cu) = (own_positions.as_ref(), cu_seqlens.as_ref());
        self.forward(&inputs, positions, cu)?;
        let check = self.check("target token");
        let a = &mut self.acts;
        // The backend's step read sums each micro-batch's `loss` over the W ranks and divides
        // by W (GPT-2's mean of per-rank means). Here every rank's `loss` is already its share
        // of the global mean (its sum over the global count), so the op divides by count / W
        // (a W-fold `loss`, which that read brings back) and the gradient's `dloss` is
        // `loss_scale / W` (so the gradient is `loss_scale · (softmax − onehot) / count`). With
        // W = 1, and for any power-of-two W, both factors are exact.
        let world = be.world() as f64;
        let ce = SoftmaxCrossEntropy::<B::Space, T> {
            params: CrossEntropyParams {
                dloss: Some((loss_scale / world) as f32),
                divisor: Some((divisor as f64 / world) as f32),
                ..CrossEntropyParams::new(n, d.vocab)
            },
            logits: a.logits.view_mut(),
            targets: targets.view(),
            losses: a.losses.view_mut(),
            loss: None,
            totals: None,
            error: None,
        };
        be.cross_entropy(ce, &targets, check, 1, scalars)?;
        self.backward(&inputs, positions, cu, last)?;
        // ZeRO 2: every micro-batch's gradients go to their owners' shards.
        if last || self.zero2 {
            be.grads_reduced()?;
        }
        Ok(())
    }

    /// The held-out loss of one micro-batch (this rank's rows of `batch`): its summed loss over
    /// counted targets divided by `divisor` is added to `scalars`. Forward only: no gradient,
    /// the weights and gradients untouched.
    pub fn eval_loss(
        &mut self,
        batch: &Batch,
        divisor: usize,
        scalars: &mut B::Scalars,
    ) -> Result<()> {
        let be = self.backend;
        let d = self.dims;
        let n = d.rows();
        if batch.inputs.len() != n || batch.targets.len() != n {
            return Err(TrainError::Op(format!(
                "an eval micro-batch of {} inputs and {} targets for {} rows × {} positions",
                batch.inputs.len(),
                batch.targets.len(),
                d.batch,
                d.seq
            )));
        }
        let inputs = be.ids(&batch.inputs)?;
        let targets = be.ids(&batch.targets)?;
        let own_positions = batch.positions.as_deref().map(|p| be.ids(p)).transpose()?;
        let cu_seqlens = batch.cu_seqlens.as_deref().map(|c| be.ids(c)).transpose()?;
        self.forward(&inputs, own_positions.as_ref(), cu_seqlens.as_ref())?;
        let check = self.check("target token");
        let a = &mut self.acts;
        let ce = SoftmaxCrossEntropy::<B::Space, T> {
            params: CrossEntropyParams {
                dloss: None,
                divisor: Some(divisor as f32),
                ..CrossEntropyParams::new(n, d.vocab)
            },
            logits: a.logits.view_mut(),
            targets: targets.view(),
            losses: a.losses.view_mut(),
            loss: None,
            totals: None,
            error: None,
        };
        be.cross_entropy(ce, &targets, check, 1, scalars)
    }

    fn check(&self, what: &'static str) -> IdCheck {
        IdCheck {
            what,
            seq: self.dims.seq,
            vocab: self.dims.vocab,
        }
    }

    /// Attention's parameters and the rows of its `[batch, seq]` view: the micro-batch's rows,
    /// or (packed sequences) one row of all N positions whose `cu_seqlens` keep them apart.
    fn attention(&self, packed: bool) -> (AttentionParams, usize) {
        let d = self.dims;
        let (batch, t) = match packed {
            false => (d.batch, d.seq),
            true => (1, d.rows()),
        };
        let params = AttentionParams {
            batch,
            heads: d.heads,
            n_kv_heads: d.kv_heads,
            tq: t,
            tk: t,
            head_dim: d.head_dim,
            causal: true,
            scale: AttentionParams::default_scale(d.head_dim),
        };
        (params, t)
    }

    fn forward(
        &mut self,
        inputs: &B::Ids,
        positions: Option<&B::Ids>,
        cu: Option<&B::Ids>,
    ) -> Result<()> {
        let (be, d, p, lo) = (self.backend, self.dims, &self.params, &self.layout);
        let (attn, t_rows) = self.attention(cu.is_some());
        let check = self.check("input token");
        let positions = positions.unwrap_or(&self.stream_positions);
        let a = &mut self.acts;
        let mut lora = self.lora.as_mut();
        let queue = be.queue();
        let (n, c, f) = (d.rows(), d.channels, d.inner);
        // Offload: each stretch of the forward waits for the uploads of the weights it reads.
        be.offload_params_ready(lo.read_before(0))?;
        let embed = EncoderForward::<B::Space, T> {
            params: EncoderParams {
                batch: d.batch,
                seq: d.seq,
                channels: c,
                vocab: d.vocab,
                positions: d.seq,
                accumulate: false,
            },
            tokens: inputs.view(),
            wte: p[lo.embed].view(),
            wpe: a.no_positions.view(),
            out: a.embedded.view_mut(),
            error: None,
        };
        be.encoder_forward(embed, inputs, check)?;
        if let Some(s) = a.layers.first_mut() {
            RmsNormForward::<B::Space, T> {
                params: d.norm(),
                x: a.embedded.view(),
                weight: p[lo.layers[0].input_norm].view(),
                y: s.h1.view_mut(),
                rstd: s.rstd1.view_mut(),
            }
            .run(queue)
            .map_err(op)?;
        }
        let cx = LayerCtx::<T, B> {
            be,
            d,
            attn,
            t_rows,
            positions,
            freqs: &self.freqs,
            cu,
        };
        let ckpt = self.grad_checkpoint;
        for l in 0..lo.layers.len() {
            be.offload_params_ready(lo.read_before(l + 1))?;
            let (done, rest) = a.resid.split_at_mut(l);
            let x = done.last().unwrap_or(&a.embedded);
            let out = rest
                .first_mut()
                .ok_or_else(|| TrainError::Op(format!("layer {l} has no output buffer")))?;
            // With checkpointing every layer runs in the one set of activations.
            let (cur, later) = a.layers.split_at_mut(if ckpt { 1 } else { l + 1 });
            let s = cur
                .last_mut()
                .ok_or_else(|| TrainError::Op(format!("layer {l} has no activations")))?;
            let li = lo.layers[l];
            layer_front(&cx, p, li, l, x, s, &mut a.branch, lora.as_deref_mut())?;
            linear_forward::<T, B>(
                queue,
                [n, c, f],
                &s.act,
                &p[li.down_w],
                li.down_b.map(|b| &p[b]),
                &mut a.branch,
            )?;
            if let Some(lo) = lora.as_deref_mut() {
                lo.forward(be, l, Linear::Down, &s.act, &mut a.branch)?;
            }
            // The next layer's input norm (into the same set with checkpointing), or the final.
            let (weight, resid_mid, y, rstd) = match (l + 1 < lo.layers.len(), ckpt) {
                (true, true) => {
                    let LayerActs {
                        resid_mid,
                        h1,
                        rstd1,
                        ..
                    } = s;
                    (&p[lo.layers[l + 1].input_norm], &*resid_mid, h1, rstd1)
                }
                (true, false) => {
                    let next = later.first_mut().ok_or_else(|| {
                        TrainError::Op(format!("layer {} has no activations", l + 1))
                    })?;
                    (
                        &p[lo.layers[l + 1].input_norm],
                        &s.resid_mid,
                        &mut next.h1,
                        &mut next.rstd1,
                    )
                }
                (false, _) => (&p[lo.norm], &s.resid_mid, &mut a.hf, &mut a.rstdf),
            };
            ResidualRmsNormForward::<B::Space, T> {
                params: d.norm(),
                a: resid_mid.view(),
                b: a.branch.view(),
                weight: weight.view(),
                residual: out.view_mut(),
                y: y.view_mut(),
                rstd: rstd.view_mut(),
            }
            .run(queue)
            .map_err(op)?;
        }
        be.offload_params_ready(usize::MAX)?;
        if lo.layers.is_empty() {
            RmsNormForward::<B::Space, T> {
                params: d.norm(),
                x: a.embedded.view(),
                weight: p[lo.norm].view(),
                y: a.hf.view_mut(),
                rstd: a.rstdf.view_mut(),
            }
            .run(queue)
            .map_err(op)?;
        }
        let head = &p[lo.lm_head.unwrap_or(lo.embed)];
        Matmul::<B::Space, T> {
            params: gemm(n, d.vocab, c, false, true),
            a: a.hf.view(),
            b: head.view(),
            out: a.logits.view_mut(),
        }
        .run(queue)
        .map_err(op)?;
        Ok(())
    }

    fn backward(
        &mut self,
        inputs: &B::Ids,
        positions: Option<&B::Ids>,
        cu: Option<&B::Ids>,
        last: bool,
    ) -> Result<()> {
        let (be, d, p, lo) = (self.backend, self.dims, &self.params, &self.layout);
        let (attn, t_rows) = self.attention(cu.is_some());
        let positions = positions.unwrap_or(&self.stream_positions);
        let g = &mut self.grads;
        let a = &mut self.acts;
        let mut lora = self.lora.as_mut();
        let queue = be.queue();
        let owners = self.owners.as_deref();
        // ZeRO stage 2: gradients exist only from the backward that writes them to the bucket
        // that reduces them (lengths `z2`).
        let z2 = self.zero2.then_some(&self.grad_lens[..]);
        if let Some(lens) = z2 {
            let mut first = vec![lo.embed, lo.norm];
            first.extend(lo.lm_head);
            zero2_alloc_ids::<T, B>(be, g, &first, lens)?;
        }
        let (n, c, f, v) = (d.rows(), d.channels, d.inner, d.vocab);
        let (hd, w) = (d.heads * d.head_dim, d.qkv_width());
        // logits = hf · Wlmᵀ; `a.logits` now holds dlogits.
        let head = lo.lm_head.unwrap_or(lo.embed);
        let frozen = self.frozen;
        if !frozen {
            Matmul::<B::Space, T> {
                params: gemm_acc(v, c, n, true, false),
                a: a.logits.view(),
                b: a.hf.view(),
                out: g[head].view_mut(),
            }
            .run(queue)
            .map_err(op)?;
        }
        Matmul::<B::Space, T> {
            params: gemm(n, c, v, false, false),
            a: a.logits.view(),
            b: p[head].view(),
            out: a.branch.view_mut(),
        }
        .run(queue)
        .map_err(op)?;
        be.fill_zero(&mut a.dres)?;
        let x_last = a.resid.last().unwrap_or(&a.embedded);
        RmsNormBackward::<B::Space, T> {
            params: d.norm(),
            x: x_last.view(),
            weight: p[lo.norm].view(),
            dy: a.branch.view(),
            rstd: a.rstdf.view(),
            dx: a.dres.view_mut(),
            dweight: g[lo.norm].view_mut(),
            accumulate: true,
        }
        .run(queue)
        .map_err(op)?;
        // A frozen base (LoRA): its 1-D gradients are scratch nobody reads; only the adapters'
        // gradients are summed across ranks.
        // ZeRO 2: every micro-batch's gradients go to their owners' shards.
        if (last || z2.is_some()) && !frozen {
            let mut ready = vec![lo.norm];
            ready.extend(lo.lm_head);
            match z2 {
                Some(_) => zero2_hand_ids::<T, B>(be, g, &ready, last)?,
                None => ready_bucket::<T, B>(be, g, &ready, owners)?,
            }
        }
        let cx = LayerCtx::<T, B> {
            be,
            d,
            attn,
            t_rows,
            positions,
            freqs: &self.freqs,
            cu,
        };
        let ckpt = self.grad_checkpoint;
        for l in (0..lo.layers.len()).rev() {
            let x = match l {
                0 => &a.embedded,
                _ => &a.resid[l - 1],
            };
            let li = lo.layers[l];
            let s = a
                .layers
                .get_mut(if ckpt { 0 } else { l })
                .ok_or_else(|| TrainError::Op(format!("layer {l} has no activations")))?;
            if ckpt {
                // Recompute the layer's activations from its input, exactly as the forward
                // made them (the standalone norm equals the fused one of the forward: both
                // normalise the stored residual).
                RmsNormForward::<B::Space, T> {
                    params: d.norm(),
                    x: x.view(),
                    weight: p[li.input_norm].view(),
                    y: s.h1.view_mut(),
                    rstd: s.rstd1.view_mut(),
                }
                .run(queue)
                .map_err(op)?;
                layer_front(&cx, p, li, l, x, s, &mut a.branch, lora.as_deref_mut())?;
            }
            let s = &*s;
            let mut layer_ids = vec![li.input_norm, li.qkv_w, li.o_w, li.post_norm];
            layer_ids.extend([li.gate_up_w, li.down_w]);
            layer_ids.extend(
                [li.qkv_b, li.o_b, li.gate_up_b, li.down_b]
                    .into_iter()
                    .flatten(),
            );
            if let Some(lens) = z2 {
                zero2_alloc_ids::<T, B>(be, g, &layer_ids, lens)?;
            }
            // MLP: resid_out = resid_mid + swiglu(h2·Wguᵀ)·Wdᵀ.
            linear_backward::<T, B>(
                queue,
                [n, c, f],
                &s.act,
                &p[li.down_w],
                &a.dres,
                &mut a.dact,
                g,
                (li.down_w, li.down_b),
                frozen,
            )?;
            if let Some(lo) = lora.as_deref_mut() {
                lo.backward(be, l, Linear::Down, &s.act, &mut a.dres, &mut a.dact)?;
            }
            SwigluBackward::<B::Space, T> {
                params: SwigluParams { rows: n, ffn: f },
                input: GateUp::Fused {
                    gate_up: s.gate_up.view(),
                },
                dh: a.dact.view(),
                grad: GateUpGrad::Fused {
                    dgate_up: a.dgate_up.view_mut(),
                },
            }
            .run(queue)
            .map_err(op)?;
            linear_backward::<T, B>(
                queue,
                [n, 2 * f, c],
                &s.h2,
                &p[li.gate_up_w],
                &a.dgate_up,
                &mut a.branch,
                g,
                (li.gate_up_w, li.gate_up_b),
                frozen,
            )?;
            if let Some(lo) = lora.as_deref_mut() {
                for t in [Linear::Gate, Linear::Up] {
                    lo.backward(be, l, t, &s.h2, &mut a.dgate_up, &mut a.branch)?;
                }
            }
            RmsNormBackward::<B::Space, T> {
                params: d.norm(),
                x: s.resid_mid.view(),
                weight: p[li.post_norm].view(),
                dy: a.branch.view(),
                rstd: s.rstd2.view(),
                dx: a.dres.view_mut(),
                dweight: g[li.post_norm].view_mut(),
                accumulate: true,
            }
            .run(queue)
            .map_err(op)?;
            // Attention: resid_mid = x + attn(rope(h1·Wqkvᵀ))·Woᵀ.
            linear_backward::<T, B>(
                queue,
                [n, c, hd],
                &s.att,
                &p[li.o_w],
                &a.dres,
                &mut a.datt,
                g,
                (li.o_w, li.o_b),
                frozen,
            )?;
            if let Some(lo) = lora.as_deref_mut() {
                lo.backward(be, l, Linear::O, &s.att, &mut a.dres, &mut a.datt)?;
            }
            let [q, k, vv] = [0, 1, 2].map(|which| Strided::<B::Space, T> {
                data: s.qkv.view(),
                layout: d.qkv_layout(which, t_rows),
            });
            let att_layout = AttentionLayout::bthd(t_rows, d.heads, d.head_dim);
            // `dqkv` is written whole: the three layouts tile [N, (H + 2K)·D].
            AttentionBackwardStrided::<B::Space, T> {
                params: attn,
                q,
                k,
                v: vv,
                out: Strided {
                    data: s.att.view(),
                    layout: att_layout,
                },
                dout: Strided {
                    data: a.datt.view(),
                    layout: att_layout,
                },
                lse: s.lse.view(),
                dqkv: a.dqkv.view_mut(),
                dq: d.qkv_layout(0, t_rows),
                dk: d.qkv_layout(1, t_rows),
                dv: d.qkv_layout(2, t_rows),
                cu_seqlens: cu.map(View::view),
            }
            .run(queue)
            .map_err(op)?;
            for (which, heads) in [(0, d.heads), (1, d.kv_heads)] {
                RopeBackward::<B::Space, T> {
                    grad: Rope {
                        params: d.rope(heads),
                        x: a.dqkv.view_mut(),
                        layout: d.qkv_layout(which, d.seq),
                        positions: positions.view(),
                        freqs: self.freqs.view(),
                    },
                }
                .run(queue)
                .map_err(op)?;
            }
            linear_backward::<T, B>(
                queue,
                [n, w, c],
                &s.h1,
                &p[li.qkv_w],
                &a.dqkv,
                &mut a.branch,
                g,
                (li.qkv_w, li.qkv_b),
                frozen,
            )?;
            if let Some(lo) = lora.as_deref_mut() {
                for t in [Linear::Q, Linear::K, Linear::V] {
                    lo.backward(be, l, t, &s.h1, &mut a.dqkv, &mut a.branch)?;
                }
            }
            RmsNormBackward::<B::Space, T> {
                params: d.norm(),
                x: x.view(),
                weight: p[li.input_norm].view(),
                dy: a.branch.view(),
                rstd: s.rstd1.view(),
                dx: a.dres.view_mut(),
                dweight: g[li.input_norm].view_mut(),
                accumulate: true,
            }
            .run(queue)
            .map_err(op)?;
            if let (true, Some(lo)) = (last, lora.as_deref_mut()) {
                // Layer l's adapters' gradients are final: one bucket.
                lo.grads_ready(be, l)?;
            }
            if (last || z2.is_some()) && !frozen {
                match z2 {
                    Some(_) => zero2_hand_ids::<T, B>(be, g, &layer_ids, last)?,
                    None => ready_bucket::<T, B>(be, g, &layer_ids, owners)?,
                }
            }
        }
        if frozen {
            return Ok(());
        }
        // The forward checked these ids; the kernel never indexes with a bad one.
        EncoderBackward::<B::Space, T> {
            params: EncoderParams {
                batch: d.batch,
                seq: d.seq,
                channels: c,
                vocab: v,
                positions: d.seq,
                accumulate: true,
            },
            tokens: inputs.view(),
            dout: a.dres.view(),
            dwte: g[lo.embed].view_mut(),
            dwpe: a.no_positions_grad.view_mut(),
            error: None,
        }
        .run(queue)
        .map_err(op)?;
        if last || z2.is_some() {
            match z2 {
                Some(_) => zero2_hand_ids::<T, B>(be, g, &[lo.embed], last)?,
                None => ready_bucket::<T, B>(be, g, &[lo.embed], owners)?,
            }
        }
        Ok(())
    }

    /// Store the global gradient norm in `scalars` (with ZeRO stage 1 the norm combines every
    /// rank's norm over the tensors it owns).
    pub fn grad_norm(&self, scalars: &mut B::Scalars) -> Result<()> {
        let rank = self.backend.rank();
        if self.zero2 {
            return self.backend.zero2_norm(scalars);
        }
        match &self.owners {
            Some(o) => {
                let owned: Vec<&B::Buf<T>> = self
                    .grads
                    .iter()
                    .zip(o)
                    .filter(|(_, &r)| r == rank)
                    .map(|(t, _)| t)
                    .collect();
                self.backend.grad_norm_sharded(&owned, scalars)
            }
            None => {
                let all: Vec<&B::Buf<T>> = self.grads.iter().collect();
                self.backend.grad_norm(&all, scalars)
            }
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
        if self.offload {
            let grads: Vec<&B::Buf<T>> = self.grads.iter().collect();
            let mut params: Vec<&mut B::Buf<T>> = self.params.iter_mut().collect();
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
        if self.zero2 {
            let mut params: Vec<&mut B::Buf<T>> = self.params.iter_mut().collect();
            return self
                .backend
                .zero2_update(hyper, scaling, scalars, &mut params);
        }
        let rank = self.backend.rank();
        let owners = self.owners.as_deref();
        let mut masters = self.master.as_mut().map(|m| m.iter_mut());
        let mut slots: Vec<AdamWSlot<'_, B::Buf<T>, B::Buf<f32>>> = self
            .params
            .iter_mut()
            .zip(&self.grads)
            .zip(self.exp_avg.iter_mut())
            .zip(self.exp_avg_sq.iter_mut())
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
            let mut bufs: Vec<_> = self.params.iter_mut().zip(o.iter().copied()).collect();
            self.backend.broadcast(&mut bufs)?;
        }
        Ok(())
    }

    /// This rank's gradient buffers on the host as they stand (trained order).
    pub fn download_grads(&self) -> Result<Vec<Vec<f32>>> {
        self.grads
            .iter()
            .map(|t| self.backend.download(t))
            .collect()
    }

    /// f32 parameters (the master weights when there are) and moments on the host, in the
    /// trained order. With ZeRO every rank must call it at the same point: each tensor's state
    /// comes from its owner.
    pub fn download(&self) -> Result<[Vec<Vec<f32>>; 3]> {
        let be = self.backend;
        be.offload_params_ready(usize::MAX)?;
        let down = |group: &[B::Buf<f32>]| -> Result<Vec<Vec<f32>>> {
            group.iter().map(|t| be.download(t)).collect()
        };
        if self.zero2 || self.offload {
            let (master, m, v) = match self.offload {
                true => {
                    let lens: Vec<usize> = self.params.iter().map(|t| be.len_of(t)).collect();
                    crate::model::offload_gather(
                        be,
                        self.owners.as_deref(),
                        &lens,
                        be.offload_download()?,
                    )?
                }
                false => be.zero2_download()?,
            };
            let params = match master {
                Some(h) => h,
                None => self
                    .params
                    .iter()
                    .map(|t| be.download(t))
                    .collect::<Result<_>>()?,
            };
            return Ok([params, m, v]);
        }
        if let Some(o) = &self.owners {
            let lens: Vec<usize> = self.params.iter().map(|t| be.len_of(t)).collect();
            let gather = |group: &[B::Buf<f32>]| -> Result<Vec<Vec<f32>>> {
                let mut full = group
                    .iter()
                    .enumerate()
                    .map(|(i, t)| match o[i] == be.rank() {
                        true => be.download(t).and_then(|h| be.upload::<f32>(&h)),
                        false => be.zeros::<f32>(lens[i]),
                    })
                    .collect::<Result<Vec<_>>>()?;
                let mut bufs: Vec<_> = full.iter_mut().zip(o.iter().copied()).collect();
                be.broadcast(&mut bufs)?;
                down(&full)
            };
            let params = match &self.master {
                Some(m) => gather(m)?,
                None => self
                    .params
                    .iter()
                    .map(|t| be.download(t))
                    .collect::<Result<_>>()?,
            };
            return Ok([params, gather(&self.exp_avg)?, gather(&self.exp_avg_sq)?]);
        }
        let params = match &self.master {
            Some(m) => down(m)?,
            None => self
                .params
                .iter()
                .map(|t| be.download(t))
                .collect::<Result<_>>()?,
        };
        Ok([params, down(&self.exp_avg)?, down(&self.exp_avg_sq)?])
    }
}

/// What every layer's forward shares: the backend, dimensions, attention's parameters and the
/// rows of its view, the positions, the rotary table and the packed sequences' bounds.
struct LayerCtx<'x, T: TrainElement, B: Backend<T>> {
    be: &'x B,
    d: LlamaDims,
    attn: AttentionParams,
    t_rows: usize,
    positions: &'x B::Ids,
    freqs: &'x B::Buf<f32>,
    cu: Option<&'x B::Ids>,
}

/// Layer `l`'s forward from its input `x` and its normed input (`h1`, already in `s`) up to
/// SwiGLU: every activation its backward reads, written into `s` (`branch` is scratch). The
/// forward runs it for each layer and then the down projection and the residual add; with
/// activation checkpointing the backward runs it again, from the kept input, to recompute the
/// layer's activations bit for bit.
#[allow(clippy::too_many_arguments)]
fn layer_front<T: TrainElement, B: Backend<T>>(
    cx: &LayerCtx<'_, T, B>,
    p: &[B::Buf<T>],
    li: TrainedLayer,
    l: usize,
    x: &B::Buf<T>,
    s: &mut LayerActs<B::Buf<T>, B::Buf<f32>>,
    branch: &mut B::Buf<T>,
    mut lora: Option<&mut super::lora::LlamaAdapters<T, B>>,
) -> Result<()> {
    let (be, d) = (cx.be, cx.d);
    let queue = be.queue();
    let (n, c, f) = (d.rows(), d.channels, d.inner);
    let (hd, w) = (d.heads * d.head_dim, d.qkv_width());
    linear_forward::<T, B>(
        queue,
        [n, w, c],
        &s.h1,
        &p[li.qkv_w],
        li.qkv_b.map(|b| &p[b]),
        &mut s.qkv,
    )?;
    if let Some(lo) = lora.as_deref_mut() {
        for t in [Linear::Q, Linear::K, Linear::V] {
            lo.forward(be, l, t, &s.h1, &mut s.qkv)?;
        }
    }
    for (which, heads) in [(0, d.heads), (1, d.kv_heads)] {
        Rope::<B::Space, T> {
            params: d.rope(heads),
            x: s.qkv.view_mut(),
            layout: d.qkv_layout(which, d.seq),
            positions: cx.positions.view(),
            freqs: cx.freqs.view(),
        }
        .run(queue)
        .map_err(op)?;
    }
    let [q, k, v] = [0, 1, 2].map(|which| Strided::<B::Space, T> {
        data: s.qkv.view(),
        layout: d.qkv_layout(which, cx.t_rows),
    });
    AttentionForwardStrided::<B::Space, T> {
        params: cx.attn,
        q,
        k,
        v,
        out: s.att.view_mut(),
        out_layout: AttentionLayout::bthd(cx.t_rows, d.heads, d.head_dim),
        lse: s.lse.view_mut(),
        cu_seqlens: cx.cu.map(View::view),
    }
    .run(queue)
    .map_err(op)?;
    linear_forward::<T, B>(
        queue,
        [n, c, hd],
        &s.att,
        &p[li.o_w],
        li.o_b.map(|b| &p[b]),
        branch,
    )?;
    if let Some(lo) = lora.as_deref_mut() {
        lo.forward(be, l, Linear::O, &s.att, branch)?;
    }
    ResidualRmsNormForward::<B::Space, T> {
        params: d.norm(),
        a: x.view(),
        b: branch.view(),
        weight: p[li.post_norm].view(),
        residual: s.resid_mid.view_mut(),
        y: s.h2.view_mut(),
        rstd: s.rstd2.view_mut(),
    }
    .run(queue)
    .map_err(op)?;
    linear_forward::<T, B>(
        queue,
        [n, 2 * f, c],
        &s.h2,
        &p[li.gate_up_w],
        li.gate_up_b.map(|b| &p[b]),
        &mut s.gate_up,
    )?;
    if let Some(lo) = lora {
        for t in [Linear::Gate, Linear::Up] {
            lo.forward(be, l, t, &s.h2, &mut s.gate_up)?;
        }
    }
    SwigluForward::<B::Space, T> {
        params: SwigluParams { rows: n, ffn: f },
        input: GateUp::Fused {
            gate_up: s.gate_up.view(),
        },
        h: s.act.view_mut(),
    }
    .run(queue)
    .map_err(op)?;
    Ok(())
}

/// ZeRO stage 2: give each empty gradient of `ids` its zeroed buffer.
fn zero2_alloc_ids<T: TrainElement, B: Backend<T>>(
    be: &B,
    grads: &mut [B::Buf<T>],
    ids: &[usize],
    lens: &[usize],
) -> Result<()> {
    let picked = grads
        .iter_mut()
        .enumerate()
        .filter(|(i, _)| ids.contains(i))
        .collect();
    crate::model::zero2_alloc::<T, B>(be, picked, lens)
}

/// ZeRO stage 2: hand a micro-batch's final gradients `ids` (`last`: the step's last
/// micro-batch) to the backend's bucket (in index order).
fn zero2_hand_ids<T: TrainElement, B: Backend<T>>(
    be: &B,
    grads: &mut [B::Buf<T>],
    ids: &[usize],
    last: bool,
) -> Result<()> {
    let picked = grads
        .iter_mut()
        .enumerate()
        .filter(|(i, _)| ids.contains(i))
        .collect();
    crate::model::zero2_hand::<T, B>(be, picked, last)
}

/// Hand the gradients `ids` to the backend's reduction across ranks (one bucket; with ZeRO
/// stage 1 each to its owner).
fn ready_bucket<T: TrainElement, B: Backend<T>>(
    be: &B,
    grads: &mut [B::Buf<T>],
    ids: &[usize],
    owners: Option<&[usize]>,
) -> Result<()> {
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    // The buffers in index order, and their roots in the same order.
    let roots: Option<Vec<usize>> = owners.map(|o| sorted.iter().map(|&i| o[i]).collect());
    let mut bufs: Vec<&mut B::Buf<T>> = grads
        .iter_mut()
        .enumerate()
        .filter(|(i, _)| sorted.binary_search(i).is_ok())
        .map(|(_, g)| g)
        .collect();
    be.grads_ready(&mut bufs, roots.as_deref())
}

/// `out = x·Wᵀ (+ b)`: `x` `[rows, inputs]`, `W` `[outputs, inputs]` (HF Linear), `[rows,
/// outputs, inputs]` in `dims`.
fn linear_forward<T: TrainElement, B: Backend<T>>(
    queue: crate::backend::Queue<'_, B, T>,
    [rows, outputs, inputs]: [usize; 3],
    x: &B::Buf<T>,
    weight: &B::Buf<T>,
    bias: Option<&B::Buf<T>>,
    out: &mut B::Buf<T>,
) -> Result<()> {
    match bias {
        Some(bias) => MatmulBias::<B::Space, T> {
            params: MatmulBiasParams {
                trans_b: true,
                ..MatmulBiasParams::new(rows, outputs, inputs)
            },
            a: x.view(),
            b: weight.view(),
            bias: bias.view(),
            out: out.view_mut(),
            pre_gelu: None,
        }
        .run(queue),
        None => Matmul::<B::Space, T> {
            params: gemm(rows, outputs, inputs, false, true),
            a: x.view(),
            b: weight.view(),
            out: out.view_mut(),
        }
        .run(queue),
    }
    .map_err(op)
}

/// The backward of [`linear_forward`]: `dW += doutᵀ·x`, `db += Σ_rows dout` (the gradients
/// `grads[w]`, `grads[b]`; skipped when `frozen`), then `dx = dout·W` (written).
#[allow(clippy::too_many_arguments)]
fn linear_backward<T: TrainElement, B: Backend<T>>(
    queue: crate::backend::Queue<'_, B, T>,
    [rows, outputs, inputs]: [usize; 3],
    x: &B::Buf<T>,
    weight: &B::Buf<T>,
    dout: &B::Buf<T>,
    dx: &mut B::Buf<T>,
    grads: &mut [B::Buf<T>],
    (w, b): (usize, Option<usize>),
    frozen: bool,
) -> Result<()> {
    if frozen {
        return Matmul::<B::Space, T> {
            params: gemm(rows, inputs, outputs, false, false),
            a: dout.view(),
            b: weight.view(),
            out: dx.view_mut(),
        }
        .run(queue)
        .map_err(op);
    }
    let dw = grads
        .get_mut(w)
        .ok_or_else(|| TrainError::Op(format!("no gradient {w}")))?;
    Matmul::<B::Space, T> {
        params: gemm_acc(outputs, inputs, rows, true, false),
        a: dout.view(),
        b: x.view(),
        out: dw.view_mut(),
    }
    .run(queue)
    .map_err(op)?;
    if let Some(b) = b {
        let db = grads
            .get_mut(b)
            .ok_or_else(|| TrainError::Op(format!("no gradient {b}")))?;
        BiasBackward::<B::Space, T> {
            params: BiasParams {
                rows,
                cols: outputs,
                accumulate: true,
            },
            dout: dout.view(),
            dbias: db.view_mut(),
        }
        .run(queue)
        .map_err(op)?;
    }
    Matmul::<B::Space, T> {
        params: gemm(rows, inputs, outputs, false, false),
        a: dout.view(),
        b: weight.view(),
        out: dx.view_mut(),
    }
    .run(queue)
    .map_err(op)
}
