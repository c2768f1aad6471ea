//! What the model needs from a compute backend: what differs between the CPU reference and a
//! device, for one storage type `T` of weights, activations and gradients (f32, bf16, f16;
//! statistics, master weights and optimizer moments are f32). The model ([`crate::model`])
//! builds each op's argument struct (`hip_kernels::ops`, named fields) on the backend's
//! [`Backend::Space`] and runs it with `.run(backend.queue())` ([`hip_kernels::ops::Run`]);
//! the backend supplies the buffers and their views, the queue, the per-step scalars (loss,
//! gradient norm, the token-id checks read at the step's end) and the communication between
//! ranks. Two implementations: [`crate::cpu_backend`] (the CPU reference, `hip_kernels::cpu`)
//! and [`crate::device_backend`] (the launchers on a `hip_rt` stream and a caching allocator:
//! every op only queues work, and the trainer's one host read per step is
//! [`Backend::read_step`]).

use crate::data::Batch;
use crate::error::{op, Result, TrainError};
use crate::sft::Slot;
use hip_kernels::ops::{
    AdamW, AdamWParams, AdamWTensor, AttentionLayout, AttentionParams, EncoderForward,
    EncoderParams, Kernels, LayerNormParams, MatmulLayout, MatmulParams, Qkv, Run,
    SoftmaxCrossEntropy,
};
use hip_kernels::params::{Space, TensorLen};

/// A storage type the trainer supports (f32, bf16, f16): the kernels have it, and RCCL can
/// sum it across ranks.
pub trait TrainElement: hip_kernels::params::DeviceElement + hip_rt::CommElement {}
impl<T: hip_kernels::params::DeviceElement + hip_rt::CommElement> TrainElement for T {}

/// Dimensions of one micro-batch's activations.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dims {
    /// Rows B.
    pub batch: usize,
    /// Sequence length T.
    pub seq: usize,
    /// Width C.
    pub channels: usize,
    /// Heads H.
    pub heads: usize,
    /// MLP width F.
    pub inner: usize,
    /// Vocabulary V.
    pub vocab: usize,
    /// Positions P (rows of wpe).
    pub positions: usize,
    /// Layer-norm epsilon.
    pub eps: f32,
}

impl Dims {
    /// Positions of a micro-batch, N = B·T.
    pub fn rows(&self) -> usize {
        self.batch * self.seq
    }

    /// Head dimension D = C / H.
    pub fn head_dim(&self) -> usize {
        self.channels / self.heads
    }
}

/// One row-major product `out = op(A)·op(B)`: `A` is `[m, k]` (`[k, m]` if `trans_a`), `B` is
/// `[k, n]` (`[n, k]` if `trans_b`), the output `[m, n]`, written (`beta = 0`); set `beta: 1.0`
/// to add to the output instead, `alpha` to scale the product.
pub fn gemm(m: usize, n: usize, k: usize, trans_a: bool, trans_b: bool) -> MatmulParams {
    MatmulParams {
        batch: 1,
        m,
        n,
        k,
        trans_a,
        trans_b,
        alpha: 1.0,
        beta: 0.0,
        layout: MatmulLayout::PACKED,
    }
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

    /// Where q, k and v sit in the fused projection `[B, T, 3, H, D]`.
    pub fn qkv_layouts(&self) -> [AttentionLayout; 3] {
        let (t, h, dd) = (self.seq, self.heads, self.head_dim());
        [Qkv::Q, Qkv::K, Qkv::V].map(|w| AttentionLayout::fused_qkv(w, t, h, dd))
    }

    /// The attention output's layout `[B, T, H, D]`.
    pub fn bthd(&self) -> AttentionLayout {
        AttentionLayout::bthd(self.seq, self.heads, self.head_dim())
    }

    /// The range check of the micro-batch's token ids `what` ("input token", "target token").
    pub fn token_check(&self, what: &'static str) -> IdCheck {
        IdCheck {
            what,
            seq: self.seq,
            vocab: self.vocab,
        }
    }
}

/// AdamW's hyper-parameters for one tensor at one step (torch.optim.AdamW's meaning).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWStep {
    /// Learning rate of this step.
    pub lr: f64,
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Added to the bias-corrected √v.
    pub eps: f64,
    /// Decoupled weight decay of this tensor (0 for biases and layer-norm parameters).
    pub weight_decay: f64,
    /// Step number (≥ 1) for the bias corrections.
    pub step: u64,
}

/// One tensor of a fused AdamW call.
pub struct AdamWSlot<'a, Buf, Stat> {
    /// f32 master weights (low-precision training), updated in place.
    pub master: Option<&'a mut Stat>,
    /// The parameters, updated in place.
    pub param: &'a mut Buf,
    /// Their gradients.
    pub grad: &'a Buf,
    /// First moment.
    pub exp_avg: &'a mut Stat,
    /// Second moment.
    pub exp_avg_sq: &'a mut Stat,
    /// `true`: the step's weight decay applies (2-D weights); `false`: none (biases, layer
    /// norms).
    pub decay: bool,
}

/// The host-visible results of one step, read once at its end.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepRead {
    /// Mean loss over the step's tokens (unscaled).
    pub loss: f64,
    /// Global L2 norm of the gradients as stored (times the loss scale), before clipping.
    pub grad_norm: f64,
}

/// How AdamW treats the gradients of a step: divided by `loss_scale`, then clipped to `clip`
/// (by the norm in the step's scalars, without a host read); with a non-finite norm the whole
/// update is skipped (`found_inf`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GradScaling {
    /// The loss scale the backward used (1 without f16 loss scaling).
    pub loss_scale: f64,
    /// `--grad-clip`, when > 0.
    pub clip: Option<f64>,
}

/// The device allocator's figures, in bytes: what PyTorch users log with
/// `torch.cuda.memory_allocated()`, `memory_reserved()` and `max_memory_allocated()` (the peak
/// since [`Backend::reset_peak_memory`], which the trainer calls at the start of every step).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemStats {
    /// Bytes in live allocations.
    pub allocated: u64,
    /// Bytes the allocator holds from the device (allocated plus cached).
    pub reserved: u64,
    /// Highest `allocated` since the last reset.
    pub peak: u64,
}

/// A buffer as an op struct's tensor in the space `S`: a `Vec` on the host, a device buffer on
/// a device.
pub trait View<S: Space, U: hip_rt::Element> {
    /// The buffer as a tensor the op reads.
    fn view(&self) -> S::In<'_, U>;
    /// The buffer as a tensor the op writes.
    fn view_mut(&mut self) -> S::Out<'_, U>;
}

/// A buffer's elements from an offset on, as a buffer of its own: a column block of a wider
/// row-major tensor for an op with a leading dimension (LoRA's adapters on stacked q/k/v).
pub trait Tail<S: Space, U: hip_rt::Element> {
    /// The view from the offset on.
    type Of<'a>: View<S, U>
    where
        Self: 'a;
    /// Elements `offset..` of the buffer; an offset past the end is an error.
    fn tail_mut(&mut self, offset: usize) -> Result<Self::Of<'_>>;
}

/// A token-id tensor that an op range-checks, for the error that names a bad id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdCheck {
    /// What the ids are ("input token", "target token").
    pub what: &'static str,
    /// Positions per row (to name a bad id's `b` and `t`).
    pub seq: usize,
    /// The ids must be below it.
    pub vocab: usize,
}

/// AdamW's one-element scalars of a step, on the backend: what the update reads without a host
/// wait ([`Backend::update_scalars`]).
pub struct UpdateScalars<B> {
    /// Divides the stored gradients (loss scale and clipping); absent when it would be 1.
    pub grad_scale: Option<B>,
    /// 1 when the gradient norm is not finite: the update then changes nothing.
    pub found_inf: B,
}

/// An [`AdamWSlot`] of backend `B`'s buffers.
pub type BackendSlot<'a, B, T> =
    AdamWSlot<'a, <B as Backend<T>>::Buf<T>, <B as Backend<T>>::Buf<f32>>;

/// The queue of backend `B`'s space, what every op struct runs on.
pub type Queue<'q, B, T> = <<B as Backend<T>>::Space as Space>::Queue<'q>;

/// A micro-batch's token ids on a backend: [`Backend::ids`] of each array of a
/// [`Batch`].
pub struct BatchIds<I> {
    /// Input ids.
    pub inputs: I,
    /// Target ids.
    pub targets: I,
    /// Position ids (packed rows).
    pub positions: Option<I>,
    /// Sequence boundaries (packed rows).
    pub cu_seqlens: Option<I>,
}

/// The ids of `batch` uploaded from its host arrays with [`Backend::ids`].
pub fn host_ids<T: TrainElement, B: Backend<T> + ?Sized>(
    be: &B,
    batch: &Batch,
) -> Result<BatchIds<B::Ids>> {
    Ok(BatchIds {
        inputs: be.ids(&batch.inputs)?,
        targets: be.ids(&batch.targets)?,
        positions: batch.positions.as_deref().map(|p| be.ids(p)).transpose()?,
        cu_seqlens: batch.cu_seqlens.as_deref().map(|c| be.ids(c)).transpose()?,
    })
}

/// A compute backend for training with storage type `T`: buffers (`Buf<T>` for the storage type,
/// `Buf<f32>` for statistics, master weights and AdamW moments, `Ids` for token ids), where the
/// op structs built on them run ([`Backend::Space`], [`Backend::queue`]), and what differs
/// between the CPU and a device besides: the step's scalars, token-id checks and
/// communication.
///
/// The ops follow llm.c's accumulate-into-gradient semantics: a step's gradients start zeroed
/// and each micro-batch adds into them.
pub trait Backend<T: TrainElement> {
    /// Where the op structs' tensors live; it runs every op for `T` and f32.
    type Space: Kernels<T> + Kernels<f32>;
    /// A tensor of `U` (`T`, or f32 for statistics and optimizer state).
    type Buf<U: TrainElement>: View<Self::Space, U> + Tail<Self::Space, U>;
    /// Token ids (i32), with whatever the backend keeps to report a bad one.
    type Ids: View<Self::Space, i32>;
    /// Per-step scalars kept on the backend until [`Backend::read_step`].
    type Scalars;

    /// What op structs of [`Backend::Space`] run on (`()` on the CPU, the compute stream).
    fn queue(&self) -> <Self::Space as Space>::Queue<'_>;
    /// `buf` as a tensor an op reads.
    fn view<'a, U: hip_rt::Element>(
        &self,
        buf: &'a impl View<Self::Space, U>,
    ) -> <Self::Space as Space>::In<'a, U> {
        buf.view()
    }
    /// `buf` as a tensor an op writes.
    fn view_mut<'a, U: hip_rt::Element>(
        &self,
        buf: &'a mut impl View<Self::Space, U>,
    ) -> <Self::Space as Space>::Out<'a, U> {
        buf.view_mut()
    }
    /// Elements in `buf`.
    fn len_of<U: TrainElement>(&self, buf: &Self::Buf<U>) -> usize {
        buf.view().numel()
    }

    /// Human-readable name for the progress output.
    fn name(&self) -> String;
    /// A zero-filled buffer of `len` elements.
    fn zeros<U: TrainElement>(&self, len: usize) -> Result<Self::Buf<U>>;
    /// A buffer holding `host` rounded to `U`.
    fn upload<U: TrainElement>(&self, host: &[f32]) -> Result<Self::Buf<U>>;
    /// The contents of `buf`, widened to f32 (a host wait on a device).
    fn download<U: TrainElement>(&self, buf: &Self::Buf<U>) -> Result<Vec<f32>>;
    /// Set every element of `buf` to 0.
    fn fill_zero<U: TrainElement>(&self, buf: &mut Self::Buf<U>) -> Result<()>;
    /// Token ids on the backend.
    fn ids(&self, host: &[i32]) -> Result<Self::Ids>;
    /// A slot of the ring the SFT producer thread stages micro-batches into: this rank's
    /// positions `rows` of each global micro-batch, in memory the backend copies from (pinned
    /// host memory on a device, allocated here once and kept until the backend drops). `None`,
    /// the default, where [`Backend::ids`] reads the host arrays directly (the CPU).
    fn feed_slot(&self, rows: std::ops::Range<usize>) -> Result<Option<Box<dyn Slot>>> {
        let _ = rows;
        Ok(None)
    }
    /// The ids of `batch` (this rank's rows): from `slot` if this backend staged it there
    /// ([`Backend::feed_slot`]; a device queues the copies on its copy stream, ordered before
    /// the compute stream's next work by an event), else from the host arrays
    /// ([`Backend::ids`]).
    fn batch_ids(&self, batch: &Batch, slot: Option<&dyn Slot>) -> Result<BatchIds<Self::Ids>> {
        let _ = slot;
        host_ids(self, batch)
    }
    /// Fresh per-step scalars (loss sum 0, norm unset).
    fn scalars(&self) -> Result<Self::Scalars>;

    /// Runs the embedding `a` of the token ids `ids` (built with `error: None`): on a device
    /// with a slot of the step's flags for a bad id, read and reported (named as `check` says)
    /// by [`Backend::read_step`]; on the CPU the reference returns the error itself.
    fn encoder_forward(
        &self,
        a: EncoderForward<'_, Self::Space, T>,
        ids: &Self::Ids,
        check: IdCheck,
    ) -> Result<()>;
    /// Runs the fused softmax cross-entropy `a` of one of `accum` micro-batches (built with
    /// `loss: None, error: None`) and adds its mean loss divided by `accum` to the step's loss
    /// in `scalars` (on a device, in the step's slot for it: no host wait); a bad target of
    /// `targets` is reported as [`Backend::encoder_forward`] reports a bad token.
    fn cross_entropy(
        &self,
        a: SoftmaxCrossEntropy<'_, Self::Space, T>,
        targets: &Self::Ids,
        check: IdCheck,
        accum: usize,
        scalars: &mut Self::Scalars,
    ) -> Result<()>;
    /// Runs the fused AdamW `a` over every tensor of a step (the device backend: one launch over
    /// a device-side table, whatever the tensor count).
    fn run_adamw(&self, a: AdamW<'_, '_, Self::Space, T>) -> Result<()> {
        a.run(self.queue()).map_err(op)
    }
    /// Stores the global L2 norm of `grads` in `scalars` (non-finite iff a gradient is).
    fn grad_norm(&self, grads: &[&Self::Buf<T>], scalars: &mut Self::Scalars) -> Result<()>;
    /// ZeRO stage 1: [`Backend::grad_norm`] of every rank's gradients when this rank holds the
    /// summed gradients of `owned` only (its share, see [`Backend::grads_ready`]'s `roots`):
    /// each rank's norm over its share, combined across ranks (the same value on every rank).
    fn grad_norm_sharded(&self, owned: &[&Self::Buf<T>], scalars: &mut Self::Scalars)
        -> Result<()>;
    /// AdamW's one-element `grad_scale` (absent when 1: the loss scale, clipped by the norm in
    /// `scalars` as `scaling` says) and `found_inf` (1 when that norm is not finite), computed
    /// without a host read.
    fn update_scalars(
        &self,
        scaling: GradScaling,
        scalars: &Self::Scalars,
    ) -> Result<UpdateScalars<Self::Buf<f32>>>;
    /// Data parallel: `grads` are final for this step (their last contribution is queued).
    /// Starts their sum across ranks on a communication stream, ordered after that work by an
    /// event, while the rest of the backward pass runs. `roots`: `None` sums into every rank
    /// (all-reduce); ZeRO stage 1 gives each tensor's owner (one per tensor), and the sum lands
    /// on the owner only (a reduce to it; the other ranks' buffers keep their own
    /// contribution). Nothing on one device.
    fn grads_ready(&self, grads: &mut [&mut Self::Buf<T>], roots: Option<&[usize]>) -> Result<()>;
    /// Data parallel: makes the work queued from now on wait (on the device) for every sum
    /// started by [`Backend::grads_ready`]. Nothing on one device. With ZeRO stage 2 it is
    /// called after every micro-batch's backward: it reduces the partly filled bucket, and
    /// waits only after the step's last.
    fn grads_reduced(&self) -> Result<()>;
    /// Ranks the gradients are summed over (1 without data parallelism).
    fn world(&self) -> usize;
    /// This backend's rank (0 without data parallelism).
    fn rank(&self) -> usize;
    /// Data parallel: every `(buffer, root)` becomes rank `root`'s contents on every rank
    /// (one group of broadcasts on the compute stream). Nothing on one device.
    fn broadcast<U: TrainElement>(&self, bufs: &mut [(&mut Self::Buf<U>, usize)]) -> Result<()>;
    /// The step's loss and gradient norm: the one host read of a step.
    fn read_step(&self, scalars: &Self::Scalars) -> Result<StepRead>;
    /// The allocator's figures now (`None` on the CPU, which has no device allocator).
    fn memory(&self) -> Option<MemStats>;
    /// Whether the backend is an emulated device (hip-emu): its timings are no performance figure.
    fn emulated(&self) -> bool;
    /// Start a new peak for [`MemStats::peak`] (nothing on the CPU).
    fn reset_peak_memory(&self);

    /// `--graph` ([`crate::graph_step`]): `Ok` when this backend can capture a step as a graph
    /// and replay it, else why not (the CPU has no graphs).
    fn graph_capable(&self) -> std::result::Result<(), String> {
        Err("the CPU backend runs no graphs".into())
    }
    /// What the next calls do in graph mode ([`crate::graph_step::Phase`]); nothing on the CPU.
    fn graph_phase(&self, _phase: crate::graph_step::Phase) {}
    /// Start capturing the step (phase [`crate::graph_step::Phase::Capture`]).
    fn graph_begin(&self) -> Result<()> {
        Err(TrainError::Op("this backend runs no graphs".into()))
    }
    /// End the capture and instantiate the graph; an error leaves no graph (the step then runs
    /// eagerly).
    fn graph_end(&self) -> Result<()> {
        Err(TrainError::Op("this backend runs no graphs".into()))
    }
    /// Launch the captured step (one graph launch).
    fn graph_launch(&self) -> Result<()> {
        Err(TrainError::Op("this backend runs no graphs".into()))
    }
    /// Drop the captured graph (its held memory returns to the allocator).
    fn graph_reset(&self) {}
    /// Zero `scalars` again for a step that reuses them (a captured step's, replayed).
    fn clear_scalars(&self, _scalars: &mut Self::Scalars) -> Result<()> {
        Ok(())
    }
    /// ZeRO stage 2 (docs/MEMORY.md): keep this rank's element-granular share of the flat
    /// gradient, f32 master weight and AdamW moment buffers (`state`: every tensor's full f32
    /// parameters and moments, in canonical order, of which only the share is kept; `decays`:
    /// weight decay per tensor). A backend without data parallelism refuses it.
    fn zero2_init(&self, state: [&[&[f32]]; 3], decays: &[bool]) -> Result<()> {
        let _ = (state, decays);
        Err(no_zero2())
    }
    /// ZeRO stage 2: the gradients `grads` (canonical index, buffer) of a micro-batch (`last`:
    /// the step's last) are final; the backend takes them, reduces each element to its owner's
    /// gradient shard (written by a step's first micro-batch, added to by the later ones) once
    /// their bucket is full (on the communication stream) and frees them.
    fn zero2_ready(&self, grads: Vec<(usize, Self::Buf<T>)>, last: bool) -> Result<()> {
        let _ = (grads, last);
        Err(no_zero2())
    }
    /// ZeRO stage 2: the global gradient norm from the ranks' gradient shards into `scalars`.
    fn zero2_norm(&self, scalars: &mut Self::Scalars) -> Result<()> {
        let _ = scalars;
        Err(no_zero2())
    }
    /// ZeRO stage 2: AdamW over this rank's share (as [`adamw_all`]), then every rank's
    /// updated share of `params` (canonical order) gathered into every rank's.
    fn zero2_update(
        &self,
        hyper: &AdamWStep,
        scaling: GradScaling,
        scalars: &Self::Scalars,
        params: &mut [&mut Self::Buf<T>],
    ) -> Result<()> {
        let _ = (hyper, scaling, scalars, params);
        Err(no_zero2())
    }
    /// ZeRO stage 2: every tensor's full f32 master weights (`None` when `T` is f32 and the
    /// parameters are their own master), first and second moments on the host, gathered from
    /// every rank (all ranks call it at the same point).
    fn zero2_download(&self) -> Result<Zero2Host> {
        Err(no_zero2())
    }
    /// `--offload-optimizer cpu` (crate::offload): keep the optimizer state on the host from
    /// now on. A backend without device memory refuses it.
    fn set_offload(&self, on: bool) -> Result<()> {
        match on {
            true => Err(no_offload()),
            false => Ok(()),
        }
    }
    /// Whether the optimizer state lives on the host ([`Backend::set_offload`]).
    fn offloads(&self) -> bool {
        false
    }
    /// Offload: take every tensor's full f32 parameters and moments (`state`, canonical order)
    /// and weight decay flags into host memory.
    fn offload_init(&self, state: [&[&[f32]]; 3], decays: &[bool]) -> Result<()> {
        let _ = (state, decays);
        Err(no_offload())
    }
    /// Offload: AdamW of every tensor on the host (as [`adamw_all`]) from `grads`, the updated
    /// `params` queued up without waiting: work that reads them asks first
    /// ([`Backend::offload_params_ready`]).
    fn offload_update(
        &self,
        hyper: &AdamWStep,
        scaling: GradScaling,
        scalars: &Self::Scalars,
        grads: &[&Self::Buf<T>],
        params: &mut [&mut Self::Buf<T>],
    ) -> Result<()> {
        let _ = (hyper, scaling, scalars, grads, params);
        Err(no_offload())
    }
    /// Offload: the host state (as [`Backend::zero2_download`]).
    fn offload_download(&self) -> Result<Zero2Host> {
        Err(no_offload())
    }
    /// Offload: the backend's next work waits for the updated parameters of the tensors
    /// before canonical index `upto` (`usize::MAX`: all), which [`Backend::offload_update`]
    /// queued up without waiting. A forward asks layer by layer (so that the later layers'
    /// uploads overlap the earlier layers' work); anything else that reads the parameters asks
    /// for all of them first. Nothing to do without offload.
    fn offload_params_ready(&self, upto: usize) -> Result<()> {
        let _ = upto;
        Ok(())
    }
}

/// ZeRO stage 2's optimizer state on the host: `[master (None when T is f32), exp_avg,
/// exp_avg_sq]`, one vector per tensor in canonical order.
pub type Zero2Host = (Option<Vec<Vec<f32>>>, Vec<Vec<f32>>, Vec<Vec<f32>>);

fn no_offload() -> TrainError {
    TrainError::Usage(
        "--offload-optimizer cpu moves the optimizer state off a device's memory; the CPU \
         backend has none (train on a device: --device N or --devices 0,1,…, or drop the flag)"
            .into(),
    )
}

fn no_zero2() -> TrainError {
    TrainError::Usage(
        "--zero 2 shards gradients across the ranks of a data-parallel device run; this \
         backend has none (run with --devices 0,1,… or one process per device)"
            .into(),
    )
}

/// One AdamW update of every tensor of `tensors` in one fused op (one launch on a device, over
/// a device-side table of the tensors): `param` updated (through f32 `master` weights when given: `param` is
/// then rewritten as their rounding), the gradient scaled as `scaling` says with the norm taken
/// from `scalars` (on the backend, no host read), each with `hyper`'s weight decay or none
/// ([`AdamWSlot::decay`]); nothing changes when that norm is not finite.
pub fn adamw_all<T: TrainElement, B: Backend<T>>(
    be: &B,
    hyper: &AdamWStep,
    scaling: GradScaling,
    scalars: &B::Scalars,
    tensors: &mut [BackendSlot<'_, B, T>],
) -> Result<()> {
    let UpdateScalars {
        grad_scale,
        found_inf,
    } = be.update_scalars(scaling, scalars)?;
    let mut slots: Vec<AdamWTensor<'_, B::Space, T>> = tensors
        .iter_mut()
        .map(|t| AdamWTensor {
            param: t.param.view_mut(),
            grad: t.grad.view(),
            exp_avg: t.exp_avg.view_mut(),
            exp_avg_sq: t.exp_avg_sq.view_mut(),
            max_exp_avg_sq: None,
            master: t.master.as_deref_mut().map(View::view_mut),
            weight_decay: (!t.decay).then_some(0.0),
            lr_scale: None,
        })
        .collect();
    be.run_adamw(AdamW::<B::Space, T> {
        params: AdamWParams {
            lr: hyper.lr,
            beta1: hyper.beta1,
            beta2: hyper.beta2,
            eps: hyper.eps,
            weight_decay: hyper.weight_decay,
            maximize: false,
            amsgrad: false,
            step: hyper.step,
        },
        grad_scale: grad_scale.as_ref().map(View::view),
        found_inf: Some(found_inf.view()),
        tensors: &mut slots,
    })
}
