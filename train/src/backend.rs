//! What the model needs from a compute backend: buffers and the ops of a GPT-2 training step,
//! with llm.c's accumulate-into-gradient semantics, for one storage type `T` of weights,
//! activations and gradients (f32, bf16, f16); statistics, master weights and optimizer moments
//! are f32. The model ([`crate::model`]) is written once against this trait, and the trait is
//! implemented once, in [`crate::op_runner`], over the two places ops run: [`crate::cpu_backend`] (the
//! CPU reference, `hip_kernels::cpu`) and [`crate::device_backend`] (the launchers of
//! `hip_kernels::ops` on a `hip_rt` stream and a caching allocator: every method only queues
//! work, and the trainer's one host read per step is [`Backend::read_step`]).

use crate::error::Result;

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

/// A row-major product `op(A)·op(B)`: `A` is `[m, k]` (`[k, m]` if `trans_a`), `B` is `[k, n]`
/// (`[n, k]` if `trans_b`), the output `[m, n]`. The trainer's own type, so that the model does
/// not change when the crate's op structs do; each backend converts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gemm {
    /// Rows of op(A) and of the output.
    pub m: usize,
    /// Columns of op(B) and of the output.
    pub n: usize,
    /// Inner dimension.
    pub k: usize,
    /// A is stored transposed.
    pub trans_a: bool,
    /// B is stored transposed.
    pub trans_b: bool,
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

/// A compute backend for training with storage type `T`. Buffers are `T` (`Buf`), f32
/// (`Stat`: layer-norm statistics, lse, master weights, AdamW moments) or token ids (`Ids`).
///
/// "Accumulates" means the result is added to what the output holds (gradient accumulation over
/// micro-batches starts from zeroed gradients); "writes" means the output is overwritten.
pub trait Backend<T: TrainElement> {
    /// A tensor of `T`.
    type Buf;
    /// An f32 tensor.
    type Stat;
    /// Token ids (i32).
    type Ids;
    /// Per-step scalars kept on the backend until [`Backend::read_step`].
    type Scalars;

    /// Human-readable name for the progress output.
    fn name(&self) -> String;
    /// Elements in `buf`.
    fn len_of(&self, buf: &Self::Buf) -> usize;
    /// A zero-filled buffer of `len` elements.
    fn zeros(&self, len: usize) -> Result<Self::Buf>;
    /// A zero-filled f32 buffer of `len` elements.
    fn zeros_stat(&self, len: usize) -> Result<Self::Stat>;
    /// A buffer holding `host` rounded to `T`.
    fn upload(&self, host: &[f32]) -> Result<Self::Buf>;
    /// The contents of `buf`, widened to f32 (a host wait on a device).
    fn download(&self, buf: &Self::Buf) -> Result<Vec<f32>>;
    /// An f32 buffer holding `host`.
    fn upload_stat(&self, host: &[f32]) -> Result<Self::Stat>;
    /// The contents of an f32 buffer (a host wait on a device).
    fn download_stat(&self, buf: &Self::Stat) -> Result<Vec<f32>>;
    /// Set every element of `buf` to 0.
    fn fill_zero(&self, buf: &mut Self::Buf) -> Result<()>;
    /// Token ids on the backend.
    fn ids(&self, host: &[i32]) -> Result<Self::Ids>;
    /// Fresh per-step scalars (loss sum 0, norm unset).
    fn scalars(&self) -> Result<Self::Scalars>;

    /// Writes `out[b,t,:] = wte[tok[b,t],:] + wpe[t,:]`.
    fn encoder_forward(
        &self,
        d: &Dims,
        tokens: &Self::Ids,
        wte: &Self::Buf,
        wpe: &Self::Buf,
        out: &mut Self::Buf,
    ) -> Result<()>;
    /// Accumulates the embedding gradients of `dout` into `dwte`, `dwpe`.
    fn encoder_backward(
        &self,
        d: &Dims,
        tokens: &Self::Ids,
        dout: &Self::Buf,
        dwte: &mut Self::Buf,
        dwpe: &mut Self::Buf,
    ) -> Result<()>;
    /// `out = op(A)·op(B)`, written, or added to `out` with `accumulate`.
    fn matmul(
        &self,
        shape: Gemm,
        a: &Self::Buf,
        b: &Self::Buf,
        out: &mut Self::Buf,
        accumulate: bool,
    ) -> Result<()>;
    /// `out = alpha·op(A)·op(B) + beta·out` (LoRA's scaled adapter products, folded into the
    /// target's output or gradient with `beta = 1`).
    fn matmul_scaled(
        &self,
        shape: Gemm,
        a: &Self::Buf,
        b: &Self::Buf,
        out: &mut Self::Buf,
        alpha: f32,
        beta: f32,
    ) -> Result<()>;
    /// Writes `out = gelu_tanh(x)` (the MLP's activation when LoRA adds to its input first).
    fn gelu_forward(&self, x: &Self::Buf, out: &mut Self::Buf) -> Result<()>;
    /// Writes `out = A·B + bias`; with `pre_gelu`, writes the sum there and `gelu_tanh` of it
    /// to `out`.
    fn matmul_bias(
        &self,
        shape: Gemm,
        a: &Self::Buf,
        b: &Self::Buf,
        bias: &Self::Buf,
        out: &mut Self::Buf,
        pre_gelu: Option<&mut Self::Buf>,
    ) -> Result<()>;
    /// Accumulates the column sums of `dout` `[rows, cols]` into `dbias` `[cols]`.
    fn bias_backward(&self, rows: usize, dout: &Self::Buf, dbias: &mut Self::Buf) -> Result<()>;
    /// Layer norm over rows of `d.channels`: writes `y`, `mean`, `rstd`.
    #[allow(clippy::too_many_arguments)]
    fn layernorm_forward(
        &self,
        d: &Dims,
        x: &Self::Buf,
        weight: &Self::Buf,
        bias: &Self::Buf,
        y: &mut Self::Buf,
        mean: &mut Self::Stat,
        rstd: &mut Self::Stat,
    ) -> Result<()>;
    /// The residual add fused with the next layer norm (one launch on a device): writes
    /// `residual = a + b` (rounded to `T`) and the layer norm of that stored residual into `y`,
    /// `mean`, `rstd`; the same values as an add then [`Backend::layernorm_forward`].
    #[allow(clippy::too_many_arguments)]
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
    ) -> Result<()>;
    /// Layer norm backward: accumulates `dx` into `dresidual`, and `dweight`, `dbias`.
    #[allow(clippy::too_many_arguments)]
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
    ) -> Result<()>;
    /// Causal attention reading q, k, v from `qkv` `[B, T, 3, H, D]`: writes `out` `[B, T, H, D]`
    /// and `lse` `[B, H, T]`.
    fn attention_forward(
        &self,
        d: &Dims,
        qkv: &Self::Buf,
        out: &mut Self::Buf,
        lse: &mut Self::Stat,
    ) -> Result<()>;
    /// Attention backward: writes `dqkv` `[B, T, 3, H, D]`.
    #[allow(clippy::too_many_arguments)]
    fn attention_backward(
        &self,
        d: &Dims,
        qkv: &Self::Buf,
        out: &Self::Buf,
        dout: &Self::Buf,
        lse: &Self::Stat,
        dqkv: &mut Self::Buf,
    ) -> Result<()>;
    /// Writes `dx = dout · gelu_tanh'(pre)`.
    fn gelu_backward(&self, pre: &Self::Buf, dout: &Self::Buf, dx: &mut Self::Buf) -> Result<()>;
    /// Fused softmax cross-entropy over `logits` `[N, V]` of one of `accum` micro-batches: adds
    /// the mean loss divided by `accum` to the step's loss in `scalars`, and overwrites `logits`
    /// with its gradient `loss_scale·(softmax − onehot)/(N·accum)`.
    fn cross_entropy(
        &self,
        d: &Dims,
        logits: &mut Self::Buf,
        targets: &Self::Ids,
        accum: usize,
        loss_scale: f64,
        scalars: &mut Self::Scalars,
    ) -> Result<()>;
    /// Stores the global L2 norm of `grads` in `scalars` (non-finite iff a gradient is).
    fn grad_norm(&self, grads: &[&Self::Buf], scalars: &mut Self::Scalars) -> Result<()>;
    /// ZeRO stage 1: [`Backend::grad_norm`] of every rank's gradients when this rank holds the
    /// summed gradients of `owned` only (its share, see [`Backend::grads_ready`]'s `roots`):
    /// each rank's norm over its share, combined across ranks (the same value on every rank).
    fn grad_norm_sharded(&self, owned: &[&Self::Buf], scalars: &mut Self::Scalars) -> Result<()>;
    /// One AdamW update of `param` (through f32 `master` weights when given: `param` is then
    /// rewritten as their rounding), the gradient scaled as `scaling` says with the norm taken
    /// from `scalars` (on the backend, no host read); nothing changes when that norm is not
    /// finite.
    ///
    /// All `tensors` in one fused call (one launch per table of tensors on a device), each with
    /// `hyper`'s weight decay or none ([`AdamWSlot::decay`]).
    fn adamw_all(
        &self,
        hyper: &AdamWStep,
        scaling: GradScaling,
        scalars: &Self::Scalars,
        tensors: &mut [AdamWSlot<'_, Self::Buf, Self::Stat>],
    ) -> Result<()>;
    /// [`Backend::adamw_all`] of one tensor with `hyper`'s weight decay (the tests' entry).
    /// Only the device tests call it.
    #[cfg(all(test, feature = "device"))]
    #[allow(clippy::too_many_arguments)]
    fn adamw(
        &self,
        hyper: &AdamWStep,
        scaling: GradScaling,
        scalars: &Self::Scalars,
        master: Option<&mut Self::Stat>,
        param: &mut Self::Buf,
        grad: &Self::Buf,
        exp_avg: &mut Self::Stat,
        exp_avg_sq: &mut Self::Stat,
    ) -> Result<()> {
        let slot = AdamWSlot {
            master,
            param,
            grad,
            exp_avg,
            exp_avg_sq,
            decay: true,
        };
        self.adamw_all(hyper, scaling, scalars, &mut [slot])
    }
    /// Data parallel: `grads` are final for this step (their last contribution is queued).
    /// Starts their sum across ranks on a communication stream, ordered after that work by an
    /// event, while the rest of the backward pass runs. `roots`: `None` sums into every rank
    /// (all-reduce); ZeRO stage 1 gives each tensor's owner (one per tensor), and the sum lands
    /// on the owner only (a reduce to it; the other ranks' buffers keep their own
    /// contribution). Nothing on one device.
    fn grads_ready(&self, grads: &mut [&mut Self::Buf], roots: Option<&[usize]>) -> Result<()>;
    /// Data parallel: makes the work queued from now on wait (on the device) for every sum
    /// started by [`Backend::grads_ready`]. Nothing on one device.
    fn grads_reduced(&self) -> Result<()>;
    /// Ranks the gradients are summed over (1 without data parallelism).
    fn world(&self) -> usize;
    /// This backend's rank (0 without data parallelism).
    fn rank(&self) -> usize;
    /// Data parallel: every `(buffer, root)` becomes rank `root`'s contents on every rank
    /// (one group of broadcasts on the compute stream). Nothing on one device.
    fn broadcast(&self, bufs: &mut [(&mut Self::Buf, usize)]) -> Result<()>;
    /// [`Backend::broadcast`] of f32 buffers.
    fn broadcast_stat(&self, bufs: &mut [(&mut Self::Stat, usize)]) -> Result<()>;
    /// The step's loss and gradient norm: the one host read of a step.
    fn read_step(&self, scalars: &Self::Scalars) -> Result<StepRead>;
    /// The allocator's figures now (`None` on the CPU, which has no device allocator).
    fn memory(&self) -> Option<MemStats>;
    /// Whether the backend is an emulated device (hip-emu): its timings are no performance figure.
    fn emulated(&self) -> bool;
    /// Start a new peak for [`MemStats::peak`] (nothing on the CPU).
    fn reset_peak_memory(&self);
}
