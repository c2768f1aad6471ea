//! The device backend (`--device N`): every op is a launcher of `hip_kernels::ops` queued on one
//! `hip_rt` stream, every buffer comes from a caching allocator (PyTorch's policy, stream-ordered
//! frees): the op structs the model builds on [`OnDevice`] run on its stream. Methods only queue
//! work; the one host wait of a step is [`Backend::read_step`], which reads the step's losses,
//! gradient norm and token-id flags.
//!
//! Has run on hip-emu (the CPU-emulated HIP device, `cargo build -p hip-emu`), never on a GPU.

use crate::backend::{
    host_ids, Backend, BatchIds, GradScaling, IdCheck, MemStats, StepRead, Tail, TrainElement,
    UpdateScalars, View,
};
use crate::data::Batch;
use crate::error::{dev, op, Result, TrainError};
use crate::feed::PinnedSlot;
use crate::graph_step::Phase;
use crate::sft::Slot;
use hip_kernels::ops::{
    self, AdamW, ClipGradScale, ClipParams, EncoderForward, Run, SoftmaxCrossEntropy, NO_ERROR,
};
use hip_kernels::params::OnDevice;
use hip_rt::{
    CaptureMode, Comm, Device, DeviceBuffer, DeviceSliceMut, DeviceView, DeviceViewMut, Event,
    EventOptions, Graph, GraphExec, PinnedHostBuffer, ReduceOp, Stream, StreamOptions,
};
use std::cell::{Cell, RefCell};
use std::mem::ManuallyDrop;
use std::rc::Rc;

/// Token-id tensors checked on the device per micro-batch: the encoder's inputs and the
/// cross-entropy's targets.
const CHECKS_PER_MICRO_BATCH: usize = 2;

/// The fixed token-id buffers of a captured step (graph mode), one per `ids` call of the step
/// in call order; a buffer is out (`None`) while a [`DeviceIds`] holds it.
type IdSlots = Rc<RefCell<Vec<Option<DeviceBuffer<i32>>>>>;

/// Token ids on the device, with the host copy they were uploaded from (to name a bad id that
/// the device flags).
pub struct DeviceIds {
    /// Taken only in `drop`.
    ids: ManuallyDrop<DeviceBuffer<i32>>,
    host: Rc<RefCell<Vec<i32>>>,
    /// Graph mode: the slot of the fixed buffer `ids` is, to which it returns on drop.
    home: Option<(IdSlots, usize)>,
}

impl Drop for DeviceIds {
    fn drop(&mut self) {
        // SAFETY: `ids` is taken once, here, and never used after.
        let ids = unsafe { ManuallyDrop::take(&mut self.ids) };
        let Some((slots, k)) = &self.home else {
            return drop(ids);
        };
        // A fixed buffer goes back to its slot (never freed while its graph may run).
        if let Ok(mut slots) = slots.try_borrow_mut() {
            if let Some(slot) = slots.get_mut(*k) {
                *slot = Some(ids);
                return;
            }
        }
        drop(ids)
    }
}

impl DeviceIds {
    /// `ids`, uploaded from `host`.
    pub fn new(ids: DeviceBuffer<i32>, host: Rc<[i32]>) -> Self {
        Self {
            ids: ManuallyDrop::new(ids),
            host: Rc::new(RefCell::new(host.to_vec())),
            home: None,
        }
    }

    /// The ids' device buffer.
    pub fn buffer(&self) -> &DeviceBuffer<i32> {
        &self.ids
    }
}

/// A token-id tensor whose range check the device reports in a flag slot.
#[derive(Clone)]
struct Check {
    what: &'static str,
    host: Rc<RefCell<Vec<i32>>>,
    seq: usize,
    vocab: usize,
}

/// Graph mode's state (`--graph`, [`crate::graph_step`]).
#[derive(Default)]
struct GraphState {
    phase: Cell<Phase>,
    /// The captured step and its executable.
    exec: RefCell<Option<(Graph, GraphExec)>>,
    /// The fixed token-id buffers and the host copies their flags name bad ids from.
    slots: IdSlots,
    hosts: RefCell<Vec<Rc<RefCell<Vec<i32>>>>>,
    /// The captured step's token-id checks, restored for each replay's read.
    checks: RefCell<Vec<Check>>,
    /// The loss scale AdamW unscales by, uploaded outside the graph.
    scale: RefCell<Option<DeviceBuffer<f32>>>,
}

/// What the backend keeps between the calls of a step.
struct StepState {
    /// Pinned staging of token-id uploads, reused step after step; `next` is the first one not
    /// used in this step.
    staging: Vec<PinnedHostBuffer<i32>>,
    /// Staging buffers of other lengths, kept for reuse (one per length met): never freed while
    /// training (see `upload_ids`).
    retired: Vec<PinnedHostBuffer<i32>>,
    next: usize,
    /// Pinned staging of the loss scale (f16) for AdamW's device-side grad scale. Rewritten only
    /// when no copy from it is queued: `scale_queued` says whether one may be (set by an upload,
    /// cleared by the step's read, which waits); a second upload in one step waits first.
    scale_staging: PinnedHostBuffer<f32>,
    scale_queued: bool,
    /// One flag per checked tensor of the step: the first bad row, or [`NO_ERROR`].
    flags: DeviceBuffer<u32>,
    /// Pinned read-back of `flags` and of the step's scalars (`DeviceScalars::values`):
    /// both copies are queued, then one wait covers both.
    flag_readback: PinnedHostBuffer<u32>,
    value_readback: PinnedHostBuffer<f32>,
    /// What each used flag slot checks, in slot order.
    checks: Vec<Check>,
}

/// Per-step scalars, on the device until [`crate::backend::Backend::read_step`].
pub struct DeviceScalars {
    /// `[slots + 1]`: micro-batch i's mean loss at i, the gradient norm at `slots`.
    values: DeviceBuffer<f32>,
    /// The divisor (`accum`) of each micro-batch's loss, in slot order.
    divisors: Vec<usize>,
}

/// One rank of a data-parallel run: its communicator and a communication stream, ordered
/// against the compute stream by events only (the host never waits for a sum).
struct Ddp {
    comm: Comm,
    stream: Stream,
    /// Recorded on the compute stream when a bucket's gradients are final; the communication
    /// stream waits on that record before summing them.
    ready: Event,
    /// Recorded on the communication stream after a step's last bucket; the compute stream
    /// waits on it before the gradient norm and the update.
    done: Event,
}

/// One HIP device as a [`Backend`], alone or as one rank of
/// a data-parallel run ([`DeviceBackend::with_comm`]).
pub struct DeviceBackend {
    ordinal: i32,
    device: Device,
    stream: Stream,
    /// The copy stream of staged micro-batches ([`crate::feed`]): their copies run beside the
    /// compute stream's work.
    copy: Stream,
    /// The ring of pinned slots made by [`Backend::feed_slot`], kept (never freed) while the
    /// backend lives.
    ring: RefCell<Vec<PinnedSlot>>,
    /// Micro-batches per step (slots for their losses and token-id flags).
    slots: usize,
    state: RefCell<StepState>,
    ddp: Option<Ddp>,
    /// The few-launch optimizer's device-side tensor tables (gradient norm and AdamW), kept
    /// across steps: one launch each whatever the tensor count.
    tables: RefCell<ops::OptimizerTables>,
    /// ZeRO stage 2's shards (a `crate::zero2::Zero2<T>` of the storage type), once set up.
    zero2: RefCell<Option<Box<dyn std::any::Any>>>,
    /// ZeRO stage 2's bucket in elements ([`DeviceBackend::set_bucket_elems`]).
    bucket_elems: std::cell::Cell<usize>,
    /// `--offload-optimizer cpu`: whether models keep their optimizer state on the host.
    offload: Cell<bool>,
    /// The host optimizer state (a `crate::offload::HostOptimizer<T>`), once set up.
    host_opt: RefCell<Option<Box<dyn std::any::Any>>>,
    graph: GraphState,
}

impl DeviceBackend {
    /// Device `ordinal` through [`Device::get`] (the process's shared caching allocator of that
    /// device, configured by `HIPK_ALLOC_CONF`; its statistics are the `mem_*` figures) and one
    /// stream, for steps of `accum` micro-batches.
    pub fn new(ordinal: usize, accum: usize) -> Result<Self> {
        let ord = i32::try_from(ordinal)
            .map_err(|_| TrainError::Usage(format!("--device {ordinal}: not a device index")))?;
        let device = Device::get(ord).map_err(|e| dev(format!("--device {ordinal}: {e}")))?;
        Self::on(device, accum, None)
    }

    /// Rank `comm.rank()` of a data-parallel run on `comm`'s device: as [`DeviceBackend::new`],
    /// plus a communication stream on which each bucket of final gradients is summed across
    /// ranks while the backward pass goes on; the loss is averaged over ranks and the f16 skip
    /// decision taken by all of them together.
    pub fn with_comm(comm: Comm, accum: usize) -> Result<Self> {
        let device = comm.device().clone();
        let rank = comm.rank();
        let at = |e: &dyn std::fmt::Display| {
            dev(format!("rank {rank} (device {}): {e}", device.ordinal()))
        };
        let ddp = Ddp {
            stream: Stream::new(&device, StreamOptions::default()).map_err(|e| at(&e))?,
            ready: Event::new(&device, EventOptions::NO_TIMING).map_err(|e| at(&e))?,
            done: Event::new(&device, EventOptions::NO_TIMING).map_err(|e| at(&e))?,
            comm,
        };
        Self::on(device.clone(), accum, Some(ddp))
    }

    /// Before a host wait that may depend on another rank: wait for this rank's queued
    /// collectives for at most the communicator's timeout (`HIPK_COMM_TIMEOUT_S`), so that a
    /// dead, stopped or late rank (or an abort by the liveness watcher) ends the wait with an
    /// error instead of blocking the copy for ever. Nothing without a communicator.
    fn settle(&self) -> Result<()> {
        match &self.ddp {
            Some(d) => d.comm.wait().map_err(dev),
            None => Ok(()),
        }
    }

    /// The copy stream of staged micro-batches ([`crate::feed`]).
    pub fn copy_stream(&self) -> &Stream {
        &self.copy
    }

    /// An aborter of this rank's communicator (none without one).
    pub fn abort_handle(&self) -> Option<hip_rt::comm::AbortHandle> {
        self.ddp.as_ref().map(|d| d.comm.abort_handle())
    }

    fn on(device: Device, accum: usize, ddp: Option<Ddp>) -> Result<Self> {
        let ord = device.ordinal();
        let at = |e: &dyn std::fmt::Display| dev(format!("device {ord}: {e}"));
        let stream = Stream::new(&device, StreamOptions::default()).map_err(|e| at(&e))?;
        let slots = accum.max(1);
        let state = StepState {
            staging: Vec::new(),
            retired: Vec::new(),
            next: 0,
            scale_staging: PinnedHostBuffer::new(&device, 1).map_err(|e| at(&e))?,
            scale_queued: false,
            flags: DeviceBuffer::alloc(&stream, CHECKS_PER_MICRO_BATCH * slots)
                .map_err(|e| at(&e))?,
            flag_readback: PinnedHostBuffer::new(&device, CHECKS_PER_MICRO_BATCH * slots)
                .map_err(|e| at(&e))?,
            value_readback: PinnedHostBuffer::new(&device, slots + 1).map_err(|e| at(&e))?,
            checks: Vec::new(),
        };
        Ok(Self {
            ordinal: ord,
            copy: Stream::new(&device, StreamOptions::default()).map_err(|e| at(&e))?,
            ring: RefCell::new(Vec::new()),
            device,
            stream,
            slots,
            state: RefCell::new(state),
            ddp,
            tables: RefCell::new(ops::OptimizerTables::new()),
            zero2: RefCell::new(None),
            bucket_elems: std::cell::Cell::new(crate::memory::estimate::DEFAULT_BUCKET_ELEMS),
            offload: Cell::new(false),
            host_opt: RefCell::new(None),
            graph: GraphState::default(),
        })
    }

    /// ZeRO stage 2's bucket: reduce the handed-over gradients once they hold `elems` elements
    /// (default DeepSpeed's `reduce_bucket_size`, 2e8).
    pub fn set_bucket_elems(&self, elems: usize) {
        self.bucket_elems.set(elems.max(1));
    }

    /// `--offload-optimizer cpu`: models built on this backend keep their optimizer state in
    /// host memory ([`crate::offload`]).
    pub fn set_offload_flag(&self, on: bool) {
        self.offload.set(on);
    }

    /// Offload (ZeRO 0/1): queue the copies of a bucket of final gradients down once `after`
    /// is done with them ([`crate::offload::HostOptimizer::copy_ready`]); nothing otherwise.
    fn offload_ready<T: TrainElement>(
        &self,
        after: &Stream,
        grads: &[&mut DeviceBuffer<T>],
    ) -> Result<()> {
        let mut guard = self.host_opt.borrow_mut();
        match guard
            .as_mut()
            .and_then(|b| b.downcast_mut::<crate::offload::HostOptimizer<T>>())
        {
            Some(h) => h.copy_ready(after, grads),
            None => Ok(()),
        }
    }

    /// Run `f` on ZeRO stage 2's state of storage type `T` and this rank's communicator.
    fn with_zero2<T: TrainElement, R>(
        &self,
        f: impl FnOnce(&mut crate::zero2::Zero2<T>, &Ddp) -> Result<R>,
    ) -> Result<R> {
        let mut guard = self.zero2.borrow_mut();
        let z = guard
            .as_mut()
            .and_then(|b| b.downcast_mut::<crate::zero2::Zero2<T>>())
            .ok_or_else(|| TrainError::Op("ZeRO 2 used before zero2_init".into()))?;
        let d = self
            .ddp
            .as_ref()
            .ok_or_else(|| TrainError::Op("ZeRO 2 without a communicator".into()))?;
        f(z, d)
    }

    /// Graph mode's `ids`: the step's next fixed buffer (allocated on first use), into which
    /// [`Phase::Upload`] copies `host`. In [`Phase::Capture`] the upload pass just before has
    /// copied it already (checked: the same ids in the same order), so nothing is queued: a copy
    /// from pinned memory inside the graph would wait for the staging buffer.
    fn slot_ids(&self, host: &[i32], capture: bool) -> Result<DeviceIds> {
        let captured = self.graph.exec.borrow().is_some();
        let k = {
            let mut st = self.state.borrow_mut();
            st.next += 1;
            st.next - 1
        };
        let shape_changed = |had: usize| {
            TrainError::Op(format!(
                "graph step: token-id tensor {k} of the step holds {} ids, the captured step's \
                 {had}; run with --no-graph",
                host.len()
            ))
        };
        let buf = {
            let mut slots = self.graph.slots.borrow_mut();
            if slots.len() <= k {
                slots.resize_with(k + 1, || None);
            }
            match slots[k].take() {
                Some(b) if b.len() == host.len() => b,
                Some(b) if captured => {
                    let had = b.len();
                    slots[k] = Some(b);
                    return Err(shape_changed(had));
                }
                None if captured => {
                    return Err(TrainError::Op(format!(
                        "graph step: token-id buffer {k} is still in use; run with --no-graph"
                    )))
                }
                _ => DeviceBuffer::alloc(&self.stream, host.len()).map_err(dev)?,
            }
        };
        let host_copy = {
            let mut hosts = self.graph.hosts.borrow_mut();
            while hosts.len() <= k {
                hosts.push(Rc::default());
            }
            hosts[k].clone()
        };
        let uploaded = *host_copy.borrow() == host;
        let mut ids = DeviceIds {
            ids: ManuallyDrop::new(buf),
            host: host_copy,
            home: Some((self.graph.slots.clone(), k)),
        };
        if capture {
            return match uploaded {
                true => Ok(ids),
                false => Err(TrainError::Op(format!(
                    "graph step: token-id tensor {k} of the captured step is not the one \
                     uploaded before the capture; run with --no-graph"
                ))),
            };
        }
        ids.host.borrow_mut().clone_from(&host.to_vec());
        self.stage(k, host)?;
        let st = self.state.borrow();
        self.stream
            .copy_htod_async(&st.staging[k], &mut *ids.ids)
            .map_err(dev)?;
        drop(st);
        Ok(ids)
    }

    /// `host` into staging buffer `k` (made or swapped for one of its length first).
    fn stage(&self, k: usize, host: &[i32]) -> Result<()> {
        let mut guard = self.state.borrow_mut();
        let st = &mut *guard;
        while st.staging.len() < k {
            st.staging
                .push(PinnedHostBuffer::new(&self.device, 1).map_err(dev)?);
        }
        if st.staging.get(k).map_or(true, |b| b.len() != host.len()) {
            let fresh = match st.retired.iter().position(|b| b.len() == host.len()) {
                Some(j) => st.retired.swap_remove(j),
                None => PinnedHostBuffer::new(&self.device, host.len()).map_err(dev)?,
            };
            match st.staging.get_mut(k) {
                Some(slot) => st.retired.push(std::mem::replace(slot, fresh)),
                None => st.staging.push(fresh),
            }
        }
        st.staging[k]
            .as_mut_slice()
            .map_err(dev)?
            .copy_from_slice(host);
        Ok(())
    }

    fn phase(&self) -> Phase {
        self.graph.phase.get()
    }

    /// Queue the upload of `host` through a pinned staging buffer (no host wait: the staging
    /// buffer is reused only after the step's read has waited for its copy).
    fn upload_ids(&self, host: &[i32]) -> Result<DeviceBuffer<i32>> {
        let mut guard = self.state.borrow_mut();
        let st = &mut *guard;
        let i = st.next;
        st.next += 1;
        if st.staging.get(i).map_or(true, |b| b.len() != host.len()) {
            let fresh = match st.retired.iter().position(|b| b.len() == host.len()) {
                Some(k) => st.retired.swap_remove(k),
                None => PinnedHostBuffer::new(&self.device, host.len()).map_err(dev)?,
            };
            match st.staging.get_mut(i) {
                // The old buffer is kept, not freed: `hipHostFree` waits for the devices, which
                // with several ranks in one process deadlocks on a device waiting in a collective
                // for this rank (packed rows' `cu_seqlens` change length between micro-batches).
                Some(slot) => st.retired.push(std::mem::replace(slot, fresh)),
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

    /// Run `f` with the next flag slot of the step, which will check `ids` as `check` says.
    fn with_flag<R>(
        &self,
        check: IdCheck,
        ids: &DeviceIds,
        f: impl FnOnce(&mut dyn DeviceViewMut<u32>) -> Result<R>,
    ) -> Result<R> {
        let mut st = self.state.borrow_mut();
        let slot = st.checks.len();
        if slot >= st.flags.len() {
            return Err(self.too_many_micro_batches());
        }
        st.checks.push(Check {
            what: check.what,
            host: ids.host.clone(),
            seq: check.seq,
            vocab: check.vocab,
        });
        let mut flag = st.flags.slice_mut(slot..slot + 1).map_err(dev)?;
        f(&mut flag)
    }

    /// Graph mode's [`Backend::update_scalars`] outside the graph: the loss scale into the
    /// one-float buffer the graph copies it from; no kernel (the buffers returned are
    /// placeholders: only the table upload of the AdamW call that follows uses them).
    fn upload_scale(&self, scaling: GradScaling) -> Result<UpdateScalars<DeviceBuffer<f32>>> {
        let s = &self.stream;
        if scaling.loss_scale != 1.0 {
            let mut st = self.state.borrow_mut();
            if st.scale_queued {
                s.synchronize().map_err(dev)?;
            }
            st.scale_staging.as_mut_slice().map_err(dev)?[0] = scaling.loss_scale as f32;
            let mut held = self.graph.scale.borrow_mut();
            if held.is_none() {
                *held = Some(DeviceBuffer::<f32>::alloc(s, 1).map_err(dev)?);
            }
            if let Some(buf) = held.as_mut() {
                s.copy_htod_async(&st.scale_staging, buf).map_err(dev)?;
            }
            st.scale_queued = true;
        }
        Ok(UpdateScalars {
            grad_scale: None,
            found_inf: DeviceBuffer::<f32>::alloc(s, 1).map_err(dev)?,
        })
    }

    fn too_many_micro_batches(&self) -> TrainError {
        TrainError::Op(format!(
            "the device backend was made for {} micro-batches per step; a step ran more",
            self.slots
        ))
    }

    /// Ranks of the data-parallel run (1 without one).
    fn world_size(&self) -> usize {
        self.ddp.as_ref().map_or(1, |d| d.comm.world())
    }

    /// [`Backend::grad_norm`] of any storage type.
    fn norm_into<T: TrainElement>(
        &self,
        grads: &[&DeviceBuffer<T>],
        scalars: &mut DeviceScalars,
    ) -> Result<()> {
        if let Some(d) = &self.ddp {
            // The micro-batch losses summed over ranks (divided by W at the read).
            let mut losses = scalars.values.slice_mut(0..self.slots).map_err(dev)?;
            d.comm
                .all_reduce_in_place(&mut losses, ReduceOp::Sum, &self.stream)
                .map_err(dev)?;
        }
        let views: Vec<&dyn DeviceView<T>> =
            grads.iter().map(|g| *g as &dyn DeviceView<T>).collect();
        let mut norm = scalars
            .values
            .slice_mut(self.slots..self.slots + 1)
            .map_err(dev)?;
        // One launch over every gradient plus the final reduction (device-side table).
        let mut tables = self.tables.borrow_mut();
        match self.phase() {
            Phase::Eager => {
                ops::l2_norm_tabled(&self.stream, &views, &mut norm, None, &mut tables).map_err(op)
            }
            Phase::Upload => tables.upload_norm(&self.stream, &views).map_err(op),
            Phase::Capture => {
                // SAFETY: uploaded just before the capture from these gradients, which the
                // model keeps for its whole run (the only run that launches this graph).
                unsafe { tables.launch_norm::<T>(&self.stream, &mut norm, None) }.map_err(op)
            }
        }
    }
}

impl<U: hip_rt::Element> View<OnDevice, U> for DeviceBuffer<U> {
    fn view(&self) -> &dyn DeviceView<U> {
        self
    }

    fn view_mut(&mut self) -> &mut dyn DeviceViewMut<U> {
        self
    }
}

impl<U: hip_rt::Element> View<OnDevice, U> for DeviceSliceMut<'_, U> {
    fn view(&self) -> &dyn DeviceView<U> {
        self
    }

    fn view_mut(&mut self) -> &mut dyn DeviceViewMut<U> {
        self
    }
}

impl<U: hip_rt::Element> Tail<OnDevice, U> for DeviceBuffer<U> {
    type Of<'a> = DeviceSliceMut<'a, U>;

    fn tail_mut(&mut self, offset: usize) -> Result<DeviceSliceMut<'_, U>> {
        self.slice_mut(offset..).map_err(dev)
    }
}

impl View<OnDevice, i32> for DeviceIds {
    fn view(&self) -> &dyn DeviceView<i32> {
        &*self.ids
    }

    fn view_mut(&mut self) -> &mut dyn DeviceViewMut<i32> {
        &mut *self.ids
    }
}

impl<T: TrainElement> Backend<T> for DeviceBackend {
    type Space = OnDevice;
    type Buf<U: TrainElement> = DeviceBuffer<U>;
    type Ids = DeviceIds;
    type Scalars = DeviceScalars;

    fn queue(&self) -> &Stream {
        &self.stream
    }

    fn name(&self) -> String {
        let dtype = <T as hip_kernels::params::Element>::DTYPE;
        let emu = if self.device.is_emulated() {
            format!("; {}", hip_rt::EMULATED_FIGURE_LABEL)
        } else {
            String::new()
        };
        format!(
            "device {} ({}, {dtype}, {} CUs{emu})",
            self.ordinal,
            self.device.name(),
            self.device.compute_units()
        )
    }

    fn zeros<U: TrainElement>(&self, len: usize) -> Result<DeviceBuffer<U>> {
        DeviceBuffer::zeroed(&self.stream, len).map_err(dev)
    }

    /// A host wait (a synchronous copy): used when the model is set up, not in a step.
    fn upload<U: TrainElement>(&self, host: &[f32]) -> Result<DeviceBuffer<U>> {
        self.settle()?;
        let data: Vec<U> = host.iter().map(|&x| U::from_f32(x)).collect();
        DeviceBuffer::from_slice(&self.stream, &data).map_err(dev)
    }

    fn download<U: TrainElement>(&self, buf: &DeviceBuffer<U>) -> Result<Vec<f32>> {
        self.settle()?;
        let data = buf.to_vec(&self.stream).map_err(dev)?;
        Ok(data.iter().map(|x| x.to_f32()).collect())
    }

    fn fill_zero<U: TrainElement>(&self, buf: &mut DeviceBuffer<U>) -> Result<()> {
        self.stream.memset_zero(buf).map_err(dev)
    }

    fn ids(&self, host: &[i32]) -> Result<DeviceIds> {
        match self.phase() {
            Phase::Eager => Ok(DeviceIds {
                ids: ManuallyDrop::new(self.upload_ids(host)?),
                host: Rc::new(RefCell::new(host.to_vec())),
                home: None,
            }),
            Phase::Upload => self.slot_ids(host, false),
            Phase::Capture => self.slot_ids(host, true),
        }
    }

    /// A pinned slot of the ring (allocated now, once per slot of the run, kept until the
    /// backend drops: see [`crate::feed`]).
    fn feed_slot(&self, rows: std::ops::Range<usize>) -> Result<Option<Box<dyn Slot>>> {
        let slot = PinnedSlot::new(&self.device, rows)?;
        self.ring.borrow_mut().push(slot.clone());
        Ok(Some(Box::new(slot)))
    }

    /// A staged micro-batch: its copies queued on the copy stream, the compute stream waiting
    /// for them by an event (no host wait).
    fn batch_ids(&self, batch: &Batch, slot: Option<&dyn Slot>) -> Result<BatchIds<DeviceIds>> {
        match slot.and_then(|s| s.as_any().downcast_ref::<PinnedSlot>()) {
            Some(p) => p.upload(batch, &self.copy, &self.stream),
            None => host_ids::<T, Self>(self, batch),
        }
    }

    fn scalars(&self) -> Result<DeviceScalars> {
        Ok(DeviceScalars {
            values: DeviceBuffer::zeroed(&self.stream, self.slots + 1).map_err(dev)?,
            divisors: Vec::with_capacity(self.slots),
        })
    }

    fn encoder_forward(
        &self,
        a: EncoderForward<'_, OnDevice, T>,
        ids: &DeviceIds,
        check: IdCheck,
    ) -> Result<()> {
        self.with_flag(check, ids, |flag| {
            EncoderForward::<OnDevice, T> {
                error: Some(flag),
                params: a.params,
                tokens: a.tokens,
                wte: a.wte,
                wpe: a.wpe,
                out: a.out,
            }
            .run(&self.stream)
            .map_err(op)
        })
    }

    /// The mean loss goes to the step's slot for this micro-batch (read by [`Backend::read_step`]).
    fn cross_entropy(
        &self,
        a: SoftmaxCrossEntropy<'_, OnDevice, T>,
        targets: &DeviceIds,
        check: IdCheck,
        accum: usize,
        scalars: &mut DeviceScalars,
    ) -> Result<()> {
        let slot = scalars.divisors.len();
        if slot >= self.slots {
            return Err(self.too_many_micro_batches());
        }
        let mut loss = scalars.values.slice_mut(slot..slot + 1).map_err(dev)?;
        self.with_flag(check, targets, |flag| {
            SoftmaxCrossEntropy::<OnDevice, T> {
                loss: Some(&mut loss),
                error: Some(flag),
                params: a.params,
                logits: a.logits,
                targets: a.targets,
                losses: a.losses,
                // Behind `Option` the view needs an explicit coercion to the shorter lifetime.
                totals: a.totals.map(|t| t as &mut dyn DeviceViewMut<f32>),
            }
            .run(&self.stream)
            .map_err(op)
        })?;
        scalars.divisors.push(accum);
        Ok(())
    }

    /// One AdamW launch whatever the tensor count (a device-side table, uploaded with one
    /// asynchronous copy).
    fn run_adamw(&self, a: AdamW<'_, '_, OnDevice, T>) -> Result<()> {
        let mut tables = self.tables.borrow_mut();
        match self.phase() {
            Phase::Eager => ops::adamw_tabled(&self.stream, a, &mut tables).map_err(op),
            // Graph mode: the table (learning rate, bias corrections, tensors) outside the
            // graph, the launch inside.
            Phase::Upload => tables.upload_adamw(&self.stream, &a).map_err(op),
            Phase::Capture => {
                // SAFETY: the table was uploaded (Phase::Upload, just before the capture) from
                // the same model tensors `a` holds; the model keeps them for its whole run, and
                // the graph is launched only in the run that captured it (a run starts by
                // dropping any graph an earlier one left: `GraphStep::new`).
                unsafe { tables.launch_adamw::<T>(&self.stream, a.grad_scale, a.found_inf) }
                    .map_err(op)
            }
        }
    }

    fn grad_norm(&self, grads: &[&DeviceBuffer<T>], scalars: &mut DeviceScalars) -> Result<()> {
        self.norm_into(grads, scalars)
    }

    fn grad_norm_sharded(
        &self,
        owned: &[&DeviceBuffer<T>],
        scalars: &mut DeviceScalars,
    ) -> Result<()> {
        let Some(d) = &self.ddp else {
            return self.norm_into(owned, scalars);
        };
        // This rank's norm over the tensors it owns (it alone holds their sums), then every
        // rank's, gathered: √(Σ_r n_r²) is the norm over all tensors, the same on every rank.
        self.norm_into(owned, scalars)?;
        let s = &self.stream;
        let mut parts = DeviceBuffer::<f32>::alloc(s, d.comm.world()).map_err(dev)?;
        {
            let mine = scalars
                .values
                .slice(self.slots..self.slots + 1)
                .map_err(dev)?;
            d.comm.all_gather(&mine, &mut parts, s).map_err(dev)?;
        }
        let mut norm = scalars
            .values
            .slice_mut(self.slots..self.slots + 1)
            .map_err(dev)?;
        ops::l2_norm::<f32>(s, &[&parts], &mut norm).map_err(op)
    }

    fn update_scalars(
        &self,
        scaling: GradScaling,
        scalars: &DeviceScalars,
    ) -> Result<UpdateScalars<DeviceBuffer<f32>>> {
        let s = &self.stream;
        if self.phase() == Phase::Upload {
            return self.upload_scale(scaling);
        }
        let norm = scalars
            .values
            .slice(self.slots..self.slots + 1)
            .map_err(dev)?;
        let mut found_inf = DeviceBuffer::<f32>::alloc(s, 1).map_err(dev)?;
        ops::non_finite::<f32>(s, &[&norm], &mut found_inf).map_err(op)?;
        if let Some(d) = &self.ddp {
            // Skip on every rank when any rank saw a non-finite gradient (the sums make the
            // norms agree already; this makes the decision itself agreed).
            d.comm
                .all_reduce_in_place(&mut found_inf, ReduceOp::Max, s)
                .map_err(dev)?;
        }
        let loss_scale = match scaling.loss_scale {
            1.0 => None,
            // In the graph: a copy of the scale uploaded outside it (Phase::Upload).
            _ if self.phase() == Phase::Capture => {
                let held = self.graph.scale.borrow();
                let Some(src) = held.as_ref() else {
                    return Err(TrainError::Op(
                        "graph step: the loss scale was not uploaded before the capture".into(),
                    ));
                };
                let mut buf = DeviceBuffer::<f32>::alloc(s, 1).map_err(dev)?;
                s.copy_dtod(src, &mut buf).map_err(dev)?;
                Some(buf)
            }
            x => {
                let mut st = self.state.borrow_mut();
                if st.scale_queued {
                    // A second update in one step (tests do this; the trainer never does):
                    // the first upload from the staging buffer may still be queued.
                    self.settle()?;
                    s.synchronize().map_err(dev)?;
                }
                st.scale_staging.as_mut_slice().map_err(dev)?[0] = x as f32;
                let mut buf = DeviceBuffer::<f32>::alloc(s, 1).map_err(dev)?;
                s.copy_htod_async(&st.scale_staging, &mut buf)
                    .map_err(dev)?;
                st.scale_queued = true;
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

    /// The step's one host wait (a replayed graph's too): queues the copies of the token-id flags and of the losses and
    /// norm into pinned memory, then waits once for the stream (so reading either buffer does
    /// not wait again).
    fn read_step(&self, scalars: &DeviceScalars) -> Result<StepRead> {
        // The step's collectives first, bounded: the pinned read-back below has no timeout.
        self.settle()?;
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
        // The wait, always taken: reading the pinned buffers alone would wait only when their
        // copies are still running (an event query first), so the count would depend on timing.
        // The copy of the values is the stream's last work: this waits no longer than for it.
        self.stream.synchronize().map_err(dev)?;
        let values = st.value_readback.as_slice().map_err(dev)?.to_vec();
        st.scale_queued = false;
        let flags = st.flag_readback.as_slice().map_err(dev)?;
        for (c, &row) in checks.iter().zip(flags) {
            if row != NO_ERROR {
                let i = row as usize;
                return Err(TrainError::BadToken {
                    what: c.what,
                    b: i / c.seq.max(1),
                    t: i % c.seq.max(1),
                    value: c.host.borrow().get(i).copied().unwrap_or(-1),
                    vocab: c.vocab,
                });
            }
        }
        let loss = scalars
            .divisors
            .iter()
            .zip(&values)
            .map(|(&k, &l)| f64::from(l) / k as f64)
            .sum::<f64>()
            / self.world_size() as f64;
        Ok(StepRead {
            loss,
            grad_norm: f64::from(values[self.slots]),
        })
    }

    fn grads_ready(
        &self,
        grads: &mut [&mut DeviceBuffer<T>],
        roots: Option<&[usize]>,
    ) -> Result<()> {
        let Some(d) = &self.ddp else {
            // Offload: final on the compute stream, they can go down now.
            return self.offload_ready::<T>(&self.stream, grads);
        };
        if roots.is_some_and(|r| r.len() != grads.len()) {
            return Err(TrainError::Op(format!(
                "{} gradients handed to the reduction with {} owners",
                grads.len(),
                roots.map_or(0, <[usize]>::len)
            )));
        }
        d.ready.record(&self.stream).map_err(dev)?;
        d.stream.wait(&d.ready).map_err(dev)?;
        hip_rt::comm::group(|| {
            grads
                .iter_mut()
                .enumerate()
                .try_for_each(|(i, g)| match roots {
                    // ZeRO-1: only the tensor's owner receives the sum (reduce-scatter at tensor
                    // granularity); the others keep their own contribution.
                    Some(r) => d
                        .comm
                        .reduce_in_place(&mut **g, ReduceOp::Sum, r[i], &d.stream),
                    None => d
                        .comm
                        .all_reduce_in_place(&mut **g, ReduceOp::Sum, &d.stream),
                })
        })
        .map_err(dev)?;
        // Offload: down as soon as the communication stream has summed them.
        self.offload_ready::<T>(&d.stream, grads)
    }

    fn grads_reduced(&self) -> Result<()> {
        let Some(d) = &self.ddp else {
            return Ok(());
        };
        if self.zero2.borrow().is_some() {
            // ZeRO 2: the micro-batch's last, partly filled bucket; the compute stream waits
            // only after the step's last micro-batch.
            let last = self.with_zero2::<T, _>(|z, d| {
                z.end_micro_batch(&d.comm, [&self.stream, &d.stream], &d.ready)
            })?;
            if !last {
                return Ok(());
            }
        }
        d.done.record(&d.stream).map_err(dev)?;
        self.stream.wait(&d.done).map_err(dev)
    }

    fn world(&self) -> usize {
        self.world_size()
    }

    fn rank(&self) -> usize {
        self.ddp.as_ref().map_or(0, |d| d.comm.rank())
    }

    fn broadcast<U: TrainElement>(&self, bufs: &mut [(&mut DeviceBuffer<U>, usize)]) -> Result<()> {
        let Some(d) = &self.ddp else {
            return Ok(());
        };
        hip_rt::comm::group(|| {
            bufs.iter_mut()
                .try_for_each(|(b, root)| d.comm.broadcast_in_place(&mut **b, *root, &self.stream))
        })
        .map_err(dev)
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

    fn graph_capable(&self) -> std::result::Result<(), String> {
        if let Some(d) = &self.ddp {
            return Err(format!(
                "{} ranks (the collectives of data parallelism are not captured)",
                d.comm.world()
            ));
        }
        match hip_rt::graph::supported() {
            true => Ok(()),
            false => Err("the HIP runtime has no graph entry points".into()),
        }
    }

    fn graph_phase(&self, phase: Phase) {
        if phase != Phase::Eager {
            // The fixed buffers are numbered from the step's first `ids` call.
            self.state.borrow_mut().next = 0;
        }
        self.graph.phase.set(phase);
    }

    /// A host wait, once per capture: the stream's queued work (the upload pass's frees
    /// included) completes before the capture starts, so that no block handed out during the
    /// capture is still being given back by work queued before it (hip-emu's memory checker
    /// marks such a block live at once, and a queued free would mark it dead after).
    fn graph_begin(&self) -> Result<()> {
        self.state.borrow_mut().next = 0;
        self.stream
            .synchronize()
            .map_err(|e| dev(format!("graph capture: {e}")))?;
        self.stream
            .begin_capture(CaptureMode::Global)
            .map_err(|e| dev(format!("graph capture: {e}")))?;
        self.graph.phase.set(Phase::Capture);
        Ok(())
    }

    fn graph_end(&self) -> Result<()> {
        self.graph.phase.set(Phase::Eager);
        let made = self
            .stream
            .end_capture()
            .and_then(|g| g.instantiate().map(|e| (g, e)));
        let mut st = self.state.borrow_mut();
        let graph = match made {
            Ok(g) => g,
            Err(e) => {
                // Nothing ran: the step starts again, eagerly.
                st.checks.clear();
                st.next = 0;
                return Err(dev(format!("graph capture: {e}")));
            }
        };
        *self.graph.checks.borrow_mut() = st.checks.clone();
        *self.graph.exec.borrow_mut() = Some(graph);
        Ok(())
    }

    fn graph_launch(&self) -> Result<()> {
        let exec = self.graph.exec.borrow();
        let Some((_, exec)) = exec.as_ref() else {
            return Err(TrainError::Op("graph step: nothing was captured".into()));
        };
        self.state.borrow_mut().checks = self.graph.checks.borrow().clone();
        // SAFETY: the graph reads and writes the model's tensors (kept by the model for the
        // run, the only one that launches this graph: `GraphStep::new` drops an earlier run's),
        // the fixed token-id buffers and the optimizer's tables (kept by
        // this backend until `graph_reset`), the step's scalars (kept by the step driver with
        // the graph) and the blocks freed during the capture (held by the graph); every kernel
        // argument was validated when captured, as for the eager launches.
        unsafe { exec.launch(&self.stream) }.map_err(dev)
    }

    fn graph_reset(&self) {
        self.graph.exec.borrow_mut().take();
        self.graph.checks.borrow_mut().clear();
        // A failed capture's checks: the step starts again, eagerly.
        let mut st = self.state.borrow_mut();
        st.checks.clear();
        st.next = 0;
    }

    fn clear_scalars(&self, scalars: &mut DeviceScalars) -> Result<()> {
        scalars.divisors.clear();
        self.stream.memset_zero(&mut scalars.values).map_err(dev)
    }

    fn reset_peak_memory(&self) {
        // `Device::get` always allocates through the caching allocator, the one case where this
        // can fail; a device without one has no peak to reset.
        let _ = self.device.reset_peak_memory_stats();
    }

    fn zero2_init(&self, state: [&[&[f32]]; 3], decays: &[bool]) -> Result<()> {
        let Some(d) = &self.ddp else {
            return Err(TrainError::Usage(
                "--zero 2 with 1 rank: ZeRO shards across ranks; run on several devices \
                 (--devices 0,1,… or one process per device) or drop --zero"
                    .into(),
            ));
        };
        let z = crate::zero2::Zero2::<T>::new(
            &d.comm,
            &self.stream,
            state,
            decays,
            (self.bucket_elems.get(), self.offload.get()),
        )?;
        *self.zero2.borrow_mut() = Some(Box::new(z));
        Ok(())
    }

    fn zero2_ready(&self, grads: Vec<(usize, DeviceBuffer<T>)>, last: bool) -> Result<()> {
        self.with_zero2::<T, _>(|z, d| {
            z.ready(grads, last, &d.comm, [&self.stream, &d.stream], &d.ready)
        })
    }

    fn zero2_norm(&self, scalars: &mut DeviceScalars) -> Result<()> {
        let guard = self.zero2.borrow();
        let z = guard
            .as_ref()
            .and_then(|b| b.downcast_ref::<crate::zero2::Zero2<T>>())
            .ok_or_else(|| TrainError::Op("ZeRO 2 used before zero2_init".into()))?;
        <Self as Backend<T>>::grad_norm_sharded(self, &[z.grads()], scalars)
    }

    fn zero2_update(
        &self,
        hyper: &crate::backend::AdamWStep,
        scaling: GradScaling,
        scalars: &DeviceScalars,
        params: &mut [&mut DeviceBuffer<T>],
    ) -> Result<()> {
        let update = <Self as Backend<T>>::update_scalars(self, scaling, scalars)?;
        if self.offload.get() {
            // Offload reads the step's scalars on the host: they depend on the other ranks'
            // collectives.
            self.settle()?;
        }
        let mut tables = self.tables.borrow_mut();
        self.with_zero2::<T, _>(|z, d| {
            z.update(&d.comm, &self.stream, &mut tables, hyper, &update, params)
        })
    }

    fn zero2_download(&self) -> Result<crate::backend::Zero2Host> {
        self.settle()?;
        self.with_zero2::<T, _>(|z, d| z.download(&d.comm, &self.stream))
    }

    fn set_offload(&self, on: bool) -> Result<()> {
        self.set_offload_flag(on);
        Ok(())
    }

    fn offloads(&self) -> bool {
        self.offload.get()
    }

    fn offload_init(&self, state: [&[&[f32]]; 3], decays: &[bool]) -> Result<()> {
        let h = crate::offload::HostOptimizer::<T>::new(&self.device, state, decays)?;
        *self.host_opt.borrow_mut() = Some(Box::new(h));
        Ok(())
    }

    fn offload_update(
        &self,
        hyper: &crate::backend::AdamWStep,
        scaling: GradScaling,
        scalars: &DeviceScalars,
        grads: &[&DeviceBuffer<T>],
        params: &mut [&mut DeviceBuffer<T>],
    ) -> Result<()> {
        let update = <Self as Backend<T>>::update_scalars(self, scaling, scalars)?;
        // The scalars read on the host may depend on the other ranks' collectives.
        self.settle()?;
        let mut guard = self.host_opt.borrow_mut();
        let h = guard
            .as_mut()
            .and_then(|b| b.downcast_mut::<crate::offload::HostOptimizer<T>>())
            .ok_or_else(|| TrainError::Op("offload used before offload_init".into()))?;
        h.update(&self.stream, hyper, &update, grads, params)
    }

    fn offload_params_ready(&self, upto: usize) -> Result<()> {
        let mut guard = self.host_opt.borrow_mut();
        match guard
            .as_mut()
            .and_then(|b| b.downcast_mut::<crate::offload::HostOptimizer<T>>())
        {
            Some(h) => h.params_ready(&self.stream, upto),
            None => Ok(()),
        }
    }

    fn offload_download(&self) -> Result<crate::backend::Zero2Host> {
        let guard = self.host_opt.borrow();
        let h = guard
            .as_ref()
            .and_then(|b| b.downcast_ref::<crate::offload::HostOptimizer<T>>())
            .ok_or_else(|| TrainError::Op("offload used before offload_init".into()))?;
        h.download()
    }
}
