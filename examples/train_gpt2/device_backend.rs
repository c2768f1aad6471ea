//! The device backend (`--device N`): every op is a launcher of `hip_kernels::ops` queued on one
//! `hip_rt` stream, every buffer comes from a caching allocator (PyTorch's policy, stream-ordered
//! frees). Methods only queue work; the one host wait of a step is [`Backend::read_step`], which
//! reads the step's losses, gradient norm and token-id flags.
//!
//! Has run on hip-emu (the CPU-emulated HIP device, `cargo build -p hip-emu`), never on a GPU.

use crate::backend::{AdamWSlot, AdamWStep, Backend, Dims, Gemm, GradScaling, MemStats, StepRead};
use crate::cpu_backend::{matmul_params, op};
use crate::error::{Result, TrainError};
use hip_kernels::ops::{
    self, AdamW, AdamWParams, AdamWTensor, BiasBackward, BiasParams, ClipGradScale, ClipParams,
    CrossEntropyParams, ElementwiseParams, EncoderBackward, EncoderForward, GeluBackward,
    LayerNormBackward, LayerNormForward, Matmul, MatmulBias, MatmulBiasParams,
    ResidualLayerNormForward, SoftmaxCrossEntropy, NO_ERROR,
};
use hip_kernels::params::{DeviceElement, OnDevice};
use hip_rt::{
    Device, DeviceBuffer, DeviceView, DeviceViewMut, PinnedHostBuffer, Stream, StreamOptions,
};
use std::cell::RefCell;
use std::rc::Rc;

/// Token-id tensors checked on the device per micro-batch: the encoder's inputs and the
/// cross-entropy's targets.
const CHECKS_PER_MICRO_BATCH: usize = 2;

fn dev(e: impl std::fmt::Display) -> TrainError {
    TrainError::Device(e.to_string())
}

/// Token ids on the device, with the host copy they were uploaded from (to name a bad id that
/// the device flags).
pub struct DeviceIds {
    ids: DeviceBuffer<i32>,
    host: Rc<[i32]>,
}

/// A token-id tensor whose range check the device reports in a flag slot.
struct Check {
    what: &'static str,
    host: Rc<[i32]>,
    seq: usize,
    vocab: usize,
}

/// What the backend keeps between the calls of a step.
struct StepState {
    /// Pinned staging of token-id uploads, reused step after step; `next` is the first one not
    /// used in this step.
    staging: Vec<PinnedHostBuffer<i32>>,
    next: usize,
    /// Pinned staging of the loss scale (f16) for AdamW's device-side grad scale. Rewritten only
    /// when no copy from it is queued: once per step (the previous step's read_step waited), or
    /// after a stream wait (see `adamw`).
    scale_staging: PinnedHostBuffer<f32>,
    /// One flag per checked tensor of the step: the first bad row, or [`NO_ERROR`].
    flags: DeviceBuffer<u32>,
    /// Pinned read-back of `flags` and of the step's scalars (`DeviceScalars::values`):
    /// both copies are queued, then one wait covers both.
    flag_readback: PinnedHostBuffer<u32>,
    value_readback: PinnedHostBuffer<f32>,
    /// What each used flag slot checks, in slot order.
    checks: Vec<Check>,
}

/// Per-step scalars, on the device until [`Backend::read_step`].
pub struct DeviceScalars {
    /// `[slots + 1]`: micro-batch i's mean loss at i, the gradient norm at `slots`.
    values: DeviceBuffer<f32>,
    /// The divisor (`accum`) of each micro-batch's loss, in slot order.
    divisors: Vec<usize>,
    /// AdamW's `grad_scale` and `found_inf`, computed for the scaling of the step's first update
    /// (again, after a stream wait, if a later update brings another scaling).
    update: RefCell<Option<(GradScaling, UpdateScalars)>>,
}

/// AdamW's device-side scalars of a step.
struct UpdateScalars {
    /// Divides the stored gradients (loss scale and clipping), absent when it would be 1.
    grad_scale: Option<DeviceBuffer<f32>>,
    /// 1.0 when the gradient norm is not finite (the update is then skipped).
    found_inf: DeviceBuffer<f32>,
}

/// One HIP device as a [`crate::backend::Backend`].
pub struct DeviceBackend {
    ordinal: i32,
    device: Device,
    stream: Stream,
    /// Micro-batches per step (slots for their losses and token-id flags).
    slots: usize,
    state: RefCell<StepState>,
}

impl DeviceBackend {
    /// Device `ordinal` through [`Device::get`] (the process's shared caching allocator of that
    /// device, configured by `HIPK_ALLOC_CONF`; its statistics are the `mem_*` figures) and one
    /// stream, for steps of `accum` micro-batches.
    pub fn new(ordinal: usize, accum: usize) -> Result<Self> {
        let ord = i32::try_from(ordinal)
            .map_err(|_| TrainError::Usage(format!("--device {ordinal}: not a device index")))?;
        let at = |e: &dyn std::fmt::Display| dev(format!("--device {ordinal}: {e}"));
        let device = Device::get(ord).map_err(|e| at(&e))?;
        let stream = Stream::new(&device, StreamOptions::default()).map_err(|e| at(&e))?;
        let slots = accum.max(1);
        let state = StepState {
            staging: Vec::new(),
            next: 0,
            scale_staging: PinnedHostBuffer::new(&device, 1).map_err(|e| at(&e))?,
            flags: DeviceBuffer::alloc(&stream, CHECKS_PER_MICRO_BATCH * slots)
                .map_err(|e| at(&e))?,
            flag_readback: PinnedHostBuffer::new(&device, CHECKS_PER_MICRO_BATCH * slots)
                .map_err(|e| at(&e))?,
            value_readback: PinnedHostBuffer::new(&device, slots + 1).map_err(|e| at(&e))?,
            checks: Vec::new(),
        };
        Ok(Self {
            ordinal: ord,
            device,
            stream,
            slots,
            state: RefCell::new(state),
        })
    }

    /// Queue the upload of `host` through a pinned staging buffer (no host wait: the staging
    /// buffer is reused only after the step's read has waited for its copy).
    fn upload_ids(&self, host: &[i32]) -> Result<DeviceBuffer<i32>> {
        let mut st = self.state.borrow_mut();
        let i = st.next;
        st.next += 1;
        if st.staging.get(i).map_or(true, |b| b.len() != host.len()) {
            let fresh = PinnedHostBuffer::new(&self.device, host.len()).map_err(dev)?;
            match st.staging.get_mut(i) {
                Some(slot) => *slot = fresh,
                None => st.staging.push(fresh),
            }
        }
        let staging = &mut st.staging[i];
        staging.as_mut_slice().map_err(dev)?.copy_from_slice(host);
        let mut ids = DeviceBuffer::alloc(&self.stream, host.len()).map_err(dev)?;
        self.stream
            .copy_htod_async(staging, &mut ids)
            .map_err(dev)?;
        Ok(ids)
    }

    /// Run `f` with the next flag slot of the step, which will check `ids` (`what`).
    fn with_flag<R>(
        &self,
        what: &'static str,
        ids: &DeviceIds,
        d: &Dims,
        f: impl FnOnce(&mut dyn DeviceViewMut<u32>) -> Result<R>,
    ) -> Result<R> {
        let mut st = self.state.borrow_mut();
        let slot = st.checks.len();
        if slot >= st.flags.len() {
            return Err(TrainError::Op(format!(
                "the device backend was made for {} micro-batches per step; a step ran more",
                self.slots
            )));
        }
        st.checks.push(Check {
            what,
            host: ids.host.clone(),
            seq: d.seq,
            vocab: d.vocab,
        });
        let mut flag = st.flags.slice_mut(slot..slot + 1).map_err(dev)?;
        f(&mut flag)
    }

    /// The device-side `grad_scale` and `found_inf` for `scaling`, from the norm in `values`.
    fn update_scalars(
        &self,
        scaling: GradScaling,
        values: &DeviceBuffer<f32>,
    ) -> Result<UpdateScalars> {
        let s = &self.stream;
        let norm = values.slice(self.slots..self.slots + 1).map_err(dev)?;
        let mut found_inf = DeviceBuffer::<f32>::alloc(s, 1).map_err(dev)?;
        ops::non_finite::<f32>(s, &[&norm], &mut found_inf).map_err(op)?;
        let loss_scale = match scaling.loss_scale {
            1.0 => None,
            x => {
                let mut st = self.state.borrow_mut();
                st.scale_staging.as_mut_slice().map_err(dev)?[0] = x as f32;
                let mut buf = DeviceBuffer::<f32>::alloc(s, 1).map_err(dev)?;
                s.copy_htod_async(&st.scale_staging, &mut buf)
                    .map_err(dev)?;
                Some(buf)
            }
        };
        let grad_scale = match scaling.clip {
            None => loss_scale,
            Some(max_norm) => {
                let mut g = DeviceBuffer::<f32>::alloc(s, 1).map_err(dev)?;
                ops::clip_grad_scale(
                    s,
                    ClipGradScale::<OnDevice> {
                        params: ClipParams {
                            max_norm: max_norm as f32,
                        },
                        norm: &norm,
                        loss_scale: loss_scale.as_ref().map(|b| b as &dyn DeviceView<f32>),
                        grad_scale: &mut g,
                    },
                )
                .map_err(op)?;
                Some(g)
            }
        };
        Ok(UpdateScalars {
            grad_scale,
            found_inf,
        })
    }
}

impl<T: DeviceElement> Backend<T> for DeviceBackend {
    type Buf = DeviceBuffer<T>;
    type Stat = DeviceBuffer<f32>;
    type Ids = DeviceIds;
    type Scalars = DeviceScalars;

    fn name(&self) -> String {
        let emu = if self.device.is_emulated() {
            format!("; {}", hip_rt::EMULATED_FIGURE_LABEL)
        } else {
            String::new()
        };
        format!(
            "device {} ({}, {}, {} CUs{emu})",
            self.ordinal,
            self.device.name(),
            T::DTYPE,
            self.device.compute_units()
        )
    }

    fn zeros(&self, len: usize) -> Result<DeviceBuffer<T>> {
        DeviceBuffer::zeroed(&self.stream, len).map_err(dev)
    }

    fn zeros_stat(&self, len: usize) -> Result<DeviceBuffer<f32>> {
        DeviceBuffer::zeroed(&self.stream, len).map_err(dev)
    }

    /// A host wait (a synchronous copy): used when the model is set up, not in a step.
    fn upload(&self, host: &[f32]) -> Result<DeviceBuffer<T>> {
        let data: Vec<T> = host.iter().map(|&x| T::from_f32(x)).collect();
        DeviceBuffer::from_slice(&self.stream, &data).map_err(dev)
    }

    fn download(&self, buf: &DeviceBuffer<T>) -> Result<Vec<f32>> {
        let data = buf.to_vec(&self.stream).map_err(dev)?;
        Ok(data.iter().map(|x| x.to_f32()).collect())
    }

    fn upload_stat(&self, host: &[f32]) -> Result<DeviceBuffer<f32>> {
        DeviceBuffer::from_slice(&self.stream, host).map_err(dev)
    }

    fn download_stat(&self, buf: &DeviceBuffer<f32>) -> Result<Vec<f32>> {
        buf.to_vec(&self.stream).map_err(dev)
    }

    fn fill_zero(&self, buf: &mut DeviceBuffer<T>) -> Result<()> {
        self.stream.memset_zero(buf).map_err(dev)
    }

    fn ids(&self, host: &[i32]) -> Result<DeviceIds> {
        Ok(DeviceIds {
            ids: self.upload_ids(host)?,
            host: host.into(),
        })
    }

    fn scalars(&self) -> Result<DeviceScalars> {
        Ok(DeviceScalars {
            values: DeviceBuffer::zeroed(&self.stream, self.slots + 1).map_err(dev)?,
            divisors: Vec::with_capacity(self.slots),
            update: RefCell::new(None),
        })
    }

    fn encoder_forward(
        &self,
        d: &Dims,
        tokens: &DeviceIds,
        wte: &DeviceBuffer<T>,
        wpe: &DeviceBuffer<T>,
        out: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        self.with_flag("input token", tokens, d, |flag| {
            ops::encoder_forward(
                &self.stream,
                EncoderForward::<OnDevice, T> {
                    params: d.encoder(false),
                    tokens: &tokens.ids,
                    wte,
                    wpe,
                    out,
                    error: Some(flag),
                },
            )
            .map_err(op)
        })
    }

    fn encoder_backward(
        &self,
        d: &Dims,
        tokens: &DeviceIds,
        dout: &DeviceBuffer<T>,
        dwte: &mut DeviceBuffer<T>,
        dwpe: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        // The forward's flag already covers these ids; the kernel never indexes with a bad one.
        ops::encoder_backward(
            &self.stream,
            EncoderBackward::<OnDevice, T> {
                params: d.encoder(true),
                tokens: &tokens.ids,
                dout,
                dwte,
                dwpe,
                error: None,
            },
        )
        .map_err(op)
    }

    fn matmul(
        &self,
        shape: Gemm,
        a: &DeviceBuffer<T>,
        b: &DeviceBuffer<T>,
        out: &mut DeviceBuffer<T>,
        accumulate: bool,
    ) -> Result<()> {
        let beta = if accumulate { 1.0 } else { 0.0 };
        ops::matmul(
            &self.stream,
            Matmul::<OnDevice, T> {
                params: matmul_params(shape, beta),
                a,
                b,
                out,
            },
        )
        .map_err(op)
    }

    fn matmul_bias(
        &self,
        shape: Gemm,
        a: &DeviceBuffer<T>,
        b: &DeviceBuffer<T>,
        bias: &DeviceBuffer<T>,
        out: &mut DeviceBuffer<T>,
        pre_gelu: Option<&mut DeviceBuffer<T>>,
    ) -> Result<()> {
        ops::matmul_bias(
            &self.stream,
            MatmulBias::<OnDevice, T> {
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
                pre_gelu: pre_gelu.map(|p| p as &mut dyn DeviceViewMut<T>),
            },
        )
        .map_err(op)
    }

    fn bias_backward(
        &self,
        rows: usize,
        dout: &DeviceBuffer<T>,
        dbias: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        let cols = dbias.len();
        ops::bias_backward(
            &self.stream,
            BiasBackward::<OnDevice, T> {
                params: BiasParams {
                    rows,
                    cols,
                    accumulate: true,
                },
                dout,
                dbias,
            },
        )
        .map_err(op)
    }

    fn layernorm_forward(
        &self,
        d: &Dims,
        x: &DeviceBuffer<T>,
        weight: &DeviceBuffer<T>,
        bias: &DeviceBuffer<T>,
        y: &mut DeviceBuffer<T>,
        mean: &mut DeviceBuffer<f32>,
        rstd: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        ops::layernorm_forward(
            &self.stream,
            LayerNormForward::<OnDevice, T> {
                params: d.ln(),
                x,
                weight,
                bias,
                y,
                mean,
                rstd,
            },
        )
        .map_err(op)
    }

    fn residual_layernorm_forward(
        &self,
        d: &Dims,
        a: &DeviceBuffer<T>,
        b: &DeviceBuffer<T>,
        weight: &DeviceBuffer<T>,
        bias: &DeviceBuffer<T>,
        residual: &mut DeviceBuffer<T>,
        y: &mut DeviceBuffer<T>,
        mean: &mut DeviceBuffer<f32>,
        rstd: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        ops::residual_layernorm_forward(
            &self.stream,
            ResidualLayerNormForward::<OnDevice, T> {
                params: d.ln(),
                a,
                b,
                weight,
                bias,
                residual,
                y,
                mean,
                rstd,
            },
        )
        .map_err(op)
    }

    fn layernorm_backward(
        &self,
        d: &Dims,
        x: &DeviceBuffer<T>,
        weight: &DeviceBuffer<T>,
        dy: &DeviceBuffer<T>,
        mean: &DeviceBuffer<f32>,
        rstd: &DeviceBuffer<f32>,
        dresidual: &mut DeviceBuffer<T>,
        dweight: &mut DeviceBuffer<T>,
        dbias: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        // Accumulates into the step's gradients in place (f32 sums, one rounding to T): no
        // scratch, no add-back launches.
        ops::layernorm_backward(
            &self.stream,
            LayerNormBackward::<OnDevice, T> {
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
            },
        )
        .map_err(op)
    }

    fn attention_forward(
        &self,
        d: &Dims,
        qkv: &DeviceBuffer<T>,
        out: &mut DeviceBuffer<T>,
        lse: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        crate::device_attention::forward(&self.stream, d, qkv, out, lse)
    }

    fn attention_backward(
        &self,
        d: &Dims,
        qkv: &DeviceBuffer<T>,
        out: &DeviceBuffer<T>,
        dout: &DeviceBuffer<T>,
        lse: &DeviceBuffer<f32>,
        dqkv: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        crate::device_attention::backward(&self.stream, d, qkv, out, dout, lse, dqkv)
    }

    fn gelu_backward(
        &self,
        pre: &DeviceBuffer<T>,
        dout: &DeviceBuffer<T>,
        dx: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        ops::gelu_backward(
            &self.stream,
            GeluBackward::<OnDevice, T> {
                params: ElementwiseParams { len: pre.len() },
                x: pre,
                dout,
                dx,
            },
        )
        .map_err(op)
    }

    fn cross_entropy(
        &self,
        d: &Dims,
        logits: &mut DeviceBuffer<T>,
        targets: &DeviceIds,
        accum: usize,
        loss_scale: f64,
        scalars: &mut DeviceScalars,
    ) -> Result<()> {
        let slot = scalars.divisors.len();
        if slot >= self.slots {
            return Err(TrainError::Op(format!(
                "the device backend was made for {} micro-batches per step; a step ran more",
                self.slots
            )));
        }
        let mut losses = DeviceBuffer::<f32>::alloc(&self.stream, d.rows()).map_err(dev)?;
        let mut loss = scalars.values.slice_mut(slot..slot + 1).map_err(dev)?;
        self.with_flag("target token", targets, d, |flag| {
            ops::softmax_cross_entropy(
                &self.stream,
                SoftmaxCrossEntropy::<OnDevice, T> {
                    params: CrossEntropyParams {
                        dloss: Some((loss_scale / accum as f64) as f32),
                        ..CrossEntropyParams::new(d.rows(), d.vocab)
                    },
                    logits,
                    targets: &targets.ids,
                    losses: &mut losses,
                    loss: Some(&mut loss),
                    error: Some(flag),
                },
            )
            .map_err(op)
        })?;
        scalars.divisors.push(accum);
        Ok(())
    }

    fn grad_norm(&self, grads: &[&DeviceBuffer<T>], scalars: &mut DeviceScalars) -> Result<()> {
        let views: Vec<&dyn DeviceView<T>> =
            grads.iter().map(|g| *g as &dyn DeviceView<T>).collect();
        let mut norm = scalars
            .values
            .slice_mut(self.slots..self.slots + 1)
            .map_err(dev)?;
        ops::l2_norm(&self.stream, &views, &mut norm).map_err(op)?;
        *scalars.update.get_mut() = None;
        Ok(())
    }

    fn adamw_all(
        &self,
        hyper: &AdamWStep,
        scaling: GradScaling,
        scalars: &DeviceScalars,
        tensors: &mut [AdamWSlot<'_, DeviceBuffer<T>, DeviceBuffer<f32>>],
    ) -> Result<()> {
        let mut cached = scalars.update.borrow_mut();
        match cached.as_ref() {
            None => {}
            Some((k, _)) if *k == scaling => {}
            // Another scaling within one step (the trainer never does this; tests do): the
            // loss-scale staging buffer is about to be rewritten while the first upload from it
            // may still be queued, so wait for the stream first.
            Some(_) => self.stream.synchronize().map_err(dev)?,
        }
        if cached.as_ref().map_or(true, |(k, _)| *k != scaling) {
            *cached = Some((scaling, self.update_scalars(scaling, &scalars.values)?));
        }
        let Some((_, u)) = cached.as_ref() else {
            return Err(TrainError::Op("AdamW scalars missing".into()));
        };
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
        ops::adamw(
            &self.stream,
            AdamW::<OnDevice, T> {
                params,
                grad_scale: u.grad_scale.as_ref().map(|b| b as &dyn DeviceView<f32>),
                found_inf: Some(&u.found_inf),
                tensors: &mut tensors
                    .iter_mut()
                    .map(|t| AdamWTensor {
                        param: &mut *t.param as &mut dyn DeviceViewMut<T>,
                        grad: t.grad as &dyn DeviceView<T>,
                        exp_avg: &mut *t.exp_avg as &mut dyn DeviceViewMut<f32>,
                        exp_avg_sq: &mut *t.exp_avg_sq as &mut dyn DeviceViewMut<f32>,
                        max_exp_avg_sq: None,
                        master: t
                            .master
                            .as_deref_mut()
                            .map(|m| m as &mut dyn DeviceViewMut<f32>),
                        weight_decay: (!t.decay).then_some(0.0),
                        lr_scale: None,
                    })
                    .collect::<Vec<_>>(),
            },
        )
        .map_err(op)
    }

    /// The step's one host wait: queues the copies of the token-id flags and of the losses and
    /// norm into pinned memory, then waits once (for the later copy: the stream runs them in
    /// order, so the flags are complete by then and reading them does not wait again).
    fn read_step(&self, scalars: &DeviceScalars) -> Result<StepRead> {
        let mut guard = self.state.borrow_mut();
        let st = &mut *guard;
        st.next = 0;
        let checks = std::mem::take(&mut st.checks);
        self.stream
            .copy_dtoh_async(&st.flags, &mut st.flag_readback)
            .map_err(dev)?;
        self.stream
            .copy_dtoh_async(&scalars.values, &mut st.value_readback)
            .map_err(dev)?;
        let values = st.value_readback.as_slice().map_err(dev)?.to_vec();
        let flags = st.flag_readback.as_slice().map_err(dev)?;
        for (c, &row) in checks.iter().zip(flags) {
            if row != NO_ERROR {
                let i = row as usize;
                return Err(TrainError::BadToken {
                    what: c.what,
                    b: i / c.seq.max(1),
                    t: i % c.seq.max(1),
                    value: c.host.get(i).copied().unwrap_or(-1),
                    vocab: c.vocab,
                });
            }
        }
        let loss = scalars
            .divisors
            .iter()
            .zip(&values)
            .map(|(&k, &l)| f64::from(l) / k as f64)
            .sum();
        Ok(StepRead {
            loss,
            grad_norm: f64::from(values[self.slots]),
        })
    }

    fn memory(&self) -> Option<MemStats> {
        let s = self.device.memory_stats().ok()?;
        Some(MemStats {
            allocated: s.allocated_bytes.all().current,
            reserved: s.reserved_bytes.all().current,
            peak: s.allocated_bytes.all().peak,
        })
    }

    fn emulated(&self) -> bool {
        self.device.is_emulated()
    }

    fn reset_peak_memory(&self) {
        // `Device::get` always allocates through the caching allocator, the one case where this
        // can fail; a device without one has no peak to reset.
        let _ = self.device.reset_peak_memory_stats();
    }
}
