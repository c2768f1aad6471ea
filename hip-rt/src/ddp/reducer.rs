//! [`GradReducer`]: bucketed gradient all-reduce on a communication stream, overlapping the
//! backward pass (as PyTorch's DDP reducer, for one flat gradient buffer).

use std::marker::PhantomData;
use std::ops::Range;
use std::sync::Arc;

use super::buckets::{BucketPlan, DEFAULT_BUCKET_BYTES};
use super::error::DdpError;
use crate::comm::{group, Comm, CommElement, ReduceOp};
use crate::error::Error;
use crate::event::{Event, EventOptions};
use crate::memory::buffer::{DeviceBuffer, DeviceSliceMut};
use crate::stream::Stream;

/// How the reduced gradients become the mean over ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Averaging {
    /// `ncclAvg`: RCCL divides by the world size (for f32, f16 and bf16 NCCL scales each
    /// input by 1/W before summing). Needs an RCCL based on NCCL 2.10 or later, checked when
    /// the reducer or plan is used; hip-emu's emulated RCCL has it.
    #[default]
    Avg,
    /// `ncclSum`: the plain sum. The mean when every rank has already scaled its gradients by
    /// 1/W (e.g. by seeding the loss gradient with 1/(W·B·T) instead of 1/(B·T), which costs
    /// nothing); otherwise scale after [`GradReducer::finish`].
    Sum,
}

impl Averaging {
    /// [`Averaging::Avg`] when `comm`'s RCCL has `ncclAvg`, else [`Averaging::Sum`] (then
    /// pre-scale the gradients, or give the reducer a [`ScaleFn`]).
    pub fn best_for(comm: &Comm) -> Averaging {
        if comm.inner.rccl.check_op(ReduceOp::Avg.raw()).is_ok() {
            Averaging::Avg
        } else {
            Averaging::Sum
        }
    }

    /// The reduction it runs.
    pub fn op(self) -> ReduceOp {
        match self {
            Averaging::Avg => ReduceOp::Avg,
            Averaging::Sum => ReduceOp::Sum,
        }
    }
}

/// Scales a reduced range by a factor on a stream (a kernel the caller provides: hip-rt ships
/// none). Given to [`GradReducer::set_post_scale`], it runs on the communication stream after
/// each bucket's sum, with factor 1/W.
pub type ScaleFn<T> =
    Box<dyn FnMut(&mut DeviceSliceMut<'_, T>, f32, &Stream) -> crate::Result<()> + Send>;

/// How a [`GradReducer`] buckets and averages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReducerOptions {
    /// The most bytes per bucket (a larger tensor gets a bucket of its own). Default 25 MiB.
    pub bucket_bytes: usize,
    /// Default [`Averaging::Avg`].
    pub averaging: Averaging,
}

impl Default for ReducerOptions {
    fn default() -> Self {
        ReducerOptions {
            bucket_bytes: DEFAULT_BUCKET_BYTES,
            averaging: Averaging::Avg,
        }
    }
}

/// Averages a flat gradient buffer across ranks while the backward pass still runs.
///
/// Built with the element range of every gradient tensor in the order backward finishes them.
/// Each step, call [`mark_ready`](GradReducer::mark_ready) as soon as tensor `i`'s gradient
/// has been queued on the compute stream: the reducer records an event there, and once every
/// tensor of a bucket (and of every earlier bucket) is ready, its communication stream waits on
/// those events and all-reduces the bucket. [`finish`](GradReducer::finish) then makes the
/// compute stream wait for the communication stream, so whatever is queued after it (the
/// gradient norm, the optimizer) sees the averaged gradients. The two streams are ordered only
/// through events; the host never waits.
///
/// Buckets are launched in plan order on every rank, whatever order the tensors are marked in,
/// so the ranks' collectives always match. Every rank must build its reducer with the same
/// ranges and options. Mark a tensor only once its gradient is complete: a gradient that two
/// parts of the model accumulate into (a tied embedding) is ready after the later one, and with
/// gradient accumulation over micro-batches, mark only during the last micro-batch's backward
/// (what PyTorch's `no_sync` does for the earlier ones).
///
/// One thread driving several devices (`Comm::init_all`): RCCL needs the collectives of one
/// step on all devices in one group, so either drive each device's reducer from its own thread,
/// or call the devices' `mark_ready` for the same tensor inside one
/// [`GroupGuard`](crate::comm::GroupGuard) / [`group`](crate::comm::group). `finish` must be
/// called outside any group (it records an event after the collectives, which a group queues
/// only when it ends). In one process, avoid calls that wait for every device (freeing pinned
/// host memory does, on HIP and on hip-emu) between a rank's first launched bucket and the other
/// ranks' launches: the wait would stall a rank that another rank's collective waits for.
///
/// ```no_run
/// use std::sync::Arc;
/// use hip_rt::ddp::{GradReducer, ReducerOptions};
/// use hip_rt::{Device, DeviceBuffer, Stream, StreamOptions};
/// # fn demo(comm: hip_rt::Comm) -> Result<(), Box<dyn std::error::Error>> {
/// let device = comm.device().clone();
/// let compute = Stream::new(&device, StreamOptions::default())?;
/// let comm_stream = Stream::new(&device, StreamOptions::default())?;
/// // Three tensors of a 1000-element flat buffer, in the order backward produces them.
/// let tensors = [600..1000, 100..600, 0..100];
/// let mut grads = DeviceBuffer::<f32>::zeroed(&compute, 1000)?;
/// let mut reducer = GradReducer::new(Arc::new(comm), comm_stream, &tensors, 1000,
///                                    ReducerOptions::default())?;
/// for step in 0..10 {
///     for i in 0..tensors.len() {
///         // ... queue the kernels writing grads[tensors[i]] on `compute` ...
///         reducer.mark_ready(i, &mut grads, &compute)?;
///     }
///     reducer.finish(&compute)?;
///     // ... the optimizer, queued on `compute`, reads the averaged gradients ...
/// }
/// # Ok(()) }
/// ```
pub struct GradReducer<T: CommElement> {
    comm: Arc<Comm>,
    stream: Stream,
    plan: BucketPlan,
    op: ReduceOp,
    /// One per tensor, recorded on the compute stream when it is marked ready.
    events: Vec<Event>,
    /// Recorded on the communication stream by `finish`.
    done: Event,
    ready: Vec<bool>,
    /// Per bucket: its tensors not yet marked this step.
    waiting: Vec<usize>,
    /// Buckets launched this step (always a prefix of the plan).
    launched: usize,
    /// Run on each reduced range after a sum (see [`ScaleFn`]).
    post_scale: Option<ScaleFn<T>>,
    _elem: PhantomData<fn() -> T>,
}

impl<T: CommElement> GradReducer<T> {
    /// A reducer over a flat gradient buffer of `len` elements of `T` whose tensors cover
    /// `tensors` (disjoint ranges, in the order backward produces them), all-reducing through
    /// `comm` on `comm_stream` (a stream of the communicator's device, used for nothing else).
    pub fn new(
        comm: Arc<Comm>,
        comm_stream: Stream,
        tensors: &[Range<usize>],
        len: usize,
        options: ReducerOptions,
    ) -> Result<GradReducer<T>, DdpError> {
        let device = comm.device().clone();
        if comm_stream.device().ordinal() != device.ordinal() {
            return Err(Error::WrongDevice {
                what: "the communication stream",
                expected: device.ordinal(),
                found: comm_stream.device().ordinal(),
            }
            .into());
        }
        let plan = BucketPlan::new(tensors, len, std::mem::size_of::<T>(), options.bucket_bytes)?;
        let op = options.averaging.op();
        comm.inner
            .rccl
            .check_op(op.raw())
            .map_err(|source| crate::comm::CommError::Rccl {
                op: "GradReducer (Averaging::Avg needs ncclAvg; use Averaging::Sum with gradients pre-scaled by 1/world)",
                rank: comm.rank(),
                source,
            })?;
        let events = (0..tensors.len())
            .map(|_| Event::new(&device, EventOptions::NO_TIMING))
            .collect::<Result<Vec<_>, Error>>()?;
        let done = Event::new(&device, EventOptions::NO_TIMING)?;
        let waiting = plan.buckets().iter().map(|b| b.tensors.len()).collect();
        Ok(GradReducer {
            comm,
            stream: comm_stream,
            ready: vec![false; tensors.len()],
            plan,
            op,
            events,
            done,
            waiting,
            launched: 0,
            post_scale: None,
            _elem: PhantomData,
        })
    }

    /// Tensor `index`'s gradient is final once the work queued so far on `compute` has run:
    /// record that, and launch every bucket that is now complete (in plan order) on the
    /// communication stream. `grads` is the flat gradient buffer (`len` elements).
    ///
    /// Errors: an index past the tensors, a tensor marked twice in one step, a buffer of
    /// another length, a stream of another device; or a failure queueing a collective.
    pub fn mark_ready(
        &mut self,
        index: usize,
        grads: &mut DeviceBuffer<T>,
        compute: &Stream,
    ) -> Result<(), DdpError> {
        let count = self.ready.len();
        if index >= count {
            return Err(DdpError::NoSuchTensor { index, count });
        }
        if self.ready[index] {
            let r = &self.plan.tensors()[index];
            return Err(DdpError::MarkedTwice {
                index,
                start: r.start,
                end: r.end,
            });
        }
        self.check_grads(grads)?;
        self.events[index].record(compute)?;
        self.ready[index] = true;
        if let Some(b) = self.plan.bucket_of(index) {
            self.waiting[b] -= 1;
        }
        self.launch_ready(grads)
    }

    /// End the step: make `compute` wait (on the device, not the host) for every bucket's
    /// all-reduce, then forget this step's marks. Errors, leaving the step open, when some
    /// tensor was not marked ready ([`DdpError::Unmarked`]).
    ///
    /// Call it outside any RCCL group.
    pub fn finish(&mut self, compute: &Stream) -> Result<(), DdpError> {
        let missing: Vec<usize> = (0..self.ready.len()).filter(|&i| !self.ready[i]).collect();
        if !missing.is_empty() {
            return Err(DdpError::Unmarked {
                count: missing.len(),
                first: missing.into_iter().take(8).collect(),
            });
        }
        if self.launched != self.plan.buckets().len() {
            // Every tensor is marked, so every bucket was launched unless a launch failed.
            return Err(DdpError::NotLaunched {
                launched: self.launched,
                buckets: self.plan.buckets().len(),
            });
        }
        self.done.record(&self.stream)?;
        compute.wait(&self.done)?;
        self.reset();
        Ok(())
    }

    /// Forget this step's marks (e.g. after an error). Buckets already launched stay queued.
    pub fn reset(&mut self) {
        self.ready.iter_mut().for_each(|r| *r = false);
        for (w, b) in self.waiting.iter_mut().zip(self.plan.buckets()) {
            *w = b.tensors.len();
        }
        self.launched = 0;
    }

    /// With [`Averaging::Sum`]: after each bucket's all-reduce, call `scale` on every reduced
    /// range with factor 1/W, on the communication stream, so that `finish` yields the mean.
    /// (With `Averaging::Avg` the factor passed is 1/W too, which would scale twice: use it
    /// with `Sum` only.)
    pub fn set_post_scale(&mut self, scale: ScaleFn<T>) {
        self.post_scale = Some(scale);
    }

    /// The bucket plan.
    pub fn plan(&self) -> &BucketPlan {
        &self.plan
    }

    /// Buckets launched so far this step.
    pub fn launched(&self) -> usize {
        self.launched
    }

    /// The communicator.
    pub fn comm(&self) -> &Arc<Comm> {
        &self.comm
    }

    /// The communication stream.
    pub fn comm_stream(&self) -> &Stream {
        &self.stream
    }

    /// The reduction each bucket runs (`Avg` or `Sum`).
    pub fn op(&self) -> ReduceOp {
        self.op
    }

    fn check_grads(&self, grads: &DeviceBuffer<T>) -> Result<(), DdpError> {
        if grads.len() != self.plan.len() {
            return Err(DdpError::Length {
                what: "GradReducer::mark_ready",
                found: grads.len(),
                expected: self.plan.len(),
                rule: "the flat gradient buffer the reducer was built for".into(),
            });
        }
        Ok(())
    }

    fn launch_ready(&mut self, grads: &mut DeviceBuffer<T>) -> Result<(), DdpError> {
        while self.launched < self.waiting.len() && self.waiting[self.launched] == 0 {
            let bucket = &self.plan.buckets()[self.launched];
            for &t in &bucket.tensors {
                self.stream.wait(&self.events[t])?;
            }
            let (comm, stream, op) = (&self.comm, &self.stream, self.op);
            if let [range] = bucket.ranges.as_slice() {
                comm.all_reduce_in_place(&mut grads.slice_mut(range.clone())?, op, stream)?;
            } else {
                group(|| {
                    for range in &bucket.ranges {
                        comm.all_reduce_in_place(&mut grads.slice_mut(range.clone())?, op, stream)?;
                    }
                    Ok(())
                })?;
            }
            if let Some(scale) = self.post_scale.as_mut() {
                let factor = 1.0 / self.comm.world() as f32;
                for range in &bucket.ranges {
                    scale(&mut grads.slice_mut(range.clone())?, factor, &self.stream)?;
                }
            }
            self.launched += 1;
        }
        Ok(())
    }
}

impl<T: CommElement> std::fmt::Debug for GradReducer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GradReducer")
            .field("rank", &self.comm.rank())
            .field("world", &self.comm.world())
            .field("tensors", &self.ready.len())
            .field("buckets", &self.plan.buckets().len())
            .field("op", &self.op)
            .field("launched", &self.launched)
            .finish_non_exhaustive()
    }
}
