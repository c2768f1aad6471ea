//! CPU optimizer offload on the device backend (`--offload-optimizer cpu`, docs/MEMORY.md):
//! the f32 master weights and AdamW moments live in pinned host memory; the device keeps only
//! the parameters (storage type) and their gradients.
//!
//! A step, after the backward (and the gradient all-reduce of a data-parallel run): the copy
//! stream waits (on the device) for the compute stream and copies every gradient down into
//! pinned staging buffers, bucket by bucket as the backward hands them over and (with several
//! ranks) the communication stream has summed them ([`HostOptimizer::copy_ready`]; with ZeRO 2,
//! [`crate::zero2`], each bucket's owned pieces: [`HostOptimizer::copy_down`]); the host reads the step's two scalars (gradient divisor and
//! non-finite flag, computed on the device as without offload), runs AdamW on the host
//! ([`hip_kernels::cpu::adamw`], the same formula and rounding order as the device kernel)
//! over chunks of the tensors on several threads, and queues the updated parameters (storage
//! type) back up on the copy stream, one event recorded after each tensor's copy. The compute
//! stream does not wait for them all: the next step's forward asks, layer by layer, for the
//! tensors that layer reads ([`HostOptimizer::params_ready`], through
//! `Backend::offload_params_ready`), so the upload of layer `l + 1` overlaps the forward of
//! layer `l`; anything else that reads the parameters asks for all of them first.

use crate::backend::{AdamWStep, TrainElement, UpdateScalars, Zero2Host};
use crate::error::{dev, op, Result, TrainError};
use hip_kernels::ops::{AdamW, AdamWParams, AdamWTensor};
use hip_kernels::params::{DType, Element, Host};
use hip_rt::{
    Device, DeviceBuffer, DeviceView, Event, EventOptions, PinnedHostBuffer, Stream, StreamOptions,
};
use std::ops::Range;

/// Elements of one host work item (a tensor is cut into chunks of this many).
const CHUNK: usize = 1 << 16;

/// The flag, named in errors.
const FLAG: &str = "--offload-optimizer cpu";

/// ZeRO 1 with offload: of every tensor's host slice `all` (canonical order), those `rank`
/// owns (`owners`: each tensor's owner; `None`: all), the others empty.
pub fn owned_only<'a>(
    all: Vec<&'a [f32]>,
    owners: Option<&[usize]>,
    rank: usize,
) -> Vec<&'a [f32]> {
    all.into_iter()
        .enumerate()
        .map(
            |(i, t)| match owners.map_or(true, |o| o.get(i) == Some(&rank)) {
                true => t,
                false => &[],
            },
        )
        .collect()
}

/// The optimizer state of one device's parameters on the host, with the staging buffers and
/// the copy stream of the transfers.
pub struct HostOptimizer<T: TrainElement> {
    /// The parameters in the storage type (when it is f32, also their master copy).
    params: Vec<PinnedHostBuffer<T>>,
    /// The step's gradients, copied down.
    grads: Vec<PinnedHostBuffer<T>>,
    /// f32 master weights, when the storage type is not f32.
    master: Option<Vec<PinnedHostBuffer<f32>>>,
    /// AdamW first moments.
    exp_avg: Vec<PinnedHostBuffer<f32>>,
    /// AdamW second moments.
    exp_avg_sq: Vec<PinnedHostBuffer<f32>>,
    /// Weight decay per tensor.
    decays: Vec<bool>,
    /// Whether this rank updates each tensor (ZeRO 1: the tensors it owns; the others' state is
    /// empty here).
    owned: Vec<bool>,
    /// The elements of each device tensor the host state covers (the whole tensor, or with
    /// ZeRO 2 the piece this rank owns).
    ranges: Vec<Range<usize>>,
    /// Whether each owned tensor's gradient has been queued down this step.
    fresh: Vec<bool>,
    /// The device address of each tensor's gradient buffer (ZeRO 0/1, learnt from the first
    /// [`HostOptimizer::update`]): how [`HostOptimizer::copy_ready`] knows the buffers the
    /// backward hands over bucket by bucket.
    by_addr: std::collections::HashMap<u64, usize>,
    /// How many gradients the last [`HostOptimizer::update`] had to copy down itself.
    late: usize,
    /// The stream of the gradient and parameter copies.
    copy: Stream,
    /// Recorded on the compute stream once the gradients are final.
    ready: Event,
    /// Per tensor: recorded on the copy stream after its upload (owned tensors only).
    uploaded: Vec<Event>,
    /// The compute stream has waited for the uploads of the tensors before this index (the
    /// prefix [`HostOptimizer::params_ready`] was asked for); the last
    /// [`HostOptimizer::finish`] queued the uploads of the owned tensors from here on.
    awaited: usize,
}

fn pinned<U: hip_rt::Element>(device: &Device, data: &[U]) -> Result<PinnedHostBuffer<U>> {
    PinnedHostBuffer::from_slice(device, data).map_err(|e| {
        TrainError::Usage(format!(
            "{FLAG}: pinned host memory for {} bytes of optimizer state is not available \
             ({e}); drop {FLAG} or free host memory",
            std::mem::size_of_val(data)
        ))
    })
}

impl<T: TrainElement> HostOptimizer<T> {
    /// The host state of every tensor (`state`: full f32 parameters, first and second moments
    /// in canonical order; `decays`: weight decay per tensor) on `device`. A tensor given empty
    /// (ZeRO 1: one another rank owns) is neither copied nor updated here. Pinned memory that
    /// cannot be had is a usage error naming the flag.
    pub fn new(device: &Device, state: [&[&[f32]]; 3], decays: &[bool]) -> Result<Self> {
        Self::pieces(device, state, decays, &vec![0; state[0].len()])
    }

    /// As [`HostOptimizer::new`], of pieces of the device tensors: tensor `i`'s host state
    /// (possibly empty) covers its elements from `starts[i]` on (ZeRO 2: the piece this rank
    /// owns).
    pub fn pieces(
        device: &Device,
        state: [&[&[f32]]; 3],
        decays: &[bool],
        starts: &[usize],
    ) -> Result<Self> {
        let [params, m, v] = state;
        let n = params.len();
        let same = |k: usize| m.get(k).map(|t| t.len()) == Some(params[k].len());
        let same_v = |k: usize| v.get(k).map(|t| t.len()) == Some(params[k].len());
        if m.len() != n
            || v.len() != n
            || decays.len() != n
            || starts.len() != n
            || !(0..n).all(|k| same(k) && same_v(k))
        {
            return Err(TrainError::Op(format!(
                "{FLAG}: {n} parameter tensors but {} / {} moments (of other lengths?), {} decay \
                 flags and {} offsets",
                m.len(),
                v.len(),
                decays.len(),
                starts.len()
            )));
        }
        let at = |e: hip_rt::Error| dev(format!("{FLAG}: {e}"));
        let stored: Vec<PinnedHostBuffer<T>> = params
            .iter()
            .map(|p| {
                pinned(
                    device,
                    &p.iter().map(|&x| T::from_f32(x)).collect::<Vec<T>>(),
                )
            })
            .collect::<Result<_>>()?;
        let grads = params
            .iter()
            .map(|p| PinnedHostBuffer::<T>::new(device, p.len()).map_err(at))
            .collect::<Result<_>>()?;
        let group = |g: &[&[f32]]| -> Result<Vec<PinnedHostBuffer<f32>>> {
            g.iter().map(|t| pinned(device, t)).collect()
        };
        Ok(Self {
            master: match <T as Element>::DTYPE {
                DType::F32 => None,
                _ => Some(group(params)?),
            },
            params: stored,
            grads,
            exp_avg: group(m)?,
            exp_avg_sq: group(v)?,
            decays: decays.to_vec(),
            owned: params.iter().map(|p| !p.is_empty()).collect(),
            ranges: params
                .iter()
                .zip(starts)
                .map(|(p, &s)| s..s + p.len())
                .collect(),
            fresh: vec![false; n],
            by_addr: std::collections::HashMap::new(),
            late: 0,
            copy: Stream::new(device, StreamOptions::default()).map_err(at)?,
            ready: Event::new(device, EventOptions::NO_TIMING).map_err(at)?,
            uploaded: (0..n)
                .map(|_| Event::new(device, EventOptions::NO_TIMING).map_err(at))
                .collect::<Result<_>>()?,
            awaited: n,
        })
    }

    /// Queue the copies of final gradients down: `grads` (tensor index, the device elements
    /// of its owned piece) are read on the copy stream once the work queued so far on `after`
    /// (the compute stream, or with ZeRO 2 the communication stream that reduced them) is
    /// done. No host wait.
    pub fn copy_down<V: DeviceView<T>>(
        &mut self,
        after: &Stream,
        grads: &[(usize, &V)],
    ) -> Result<()> {
        after.record(&self.ready).map_err(dev)?;
        self.copy.wait(&self.ready).map_err(dev)?;
        for (i, g) in grads {
            let (Some(host), Some(true)) = (self.grads.get_mut(*i), self.owned.get(*i).copied())
            else {
                continue;
            };
            self.copy.copy_dtoh_async(*g, host).map_err(dev)?;
            self.fresh[*i] = true;
        }
        Ok(())
    }

    /// ZeRO 0/1: the final gradient buffers of a bucket (`grads`, summed across ranks on
    /// `after`'s queue, or final on the compute stream of one device) queued down on the copy
    /// stream as soon as `after` is done with them, so that the copies overlap the rest of the
    /// backward. Buffers not known yet (the first step, before [`HostOptimizer::update`] has
    /// seen them in canonical order) are left to that update. No host wait.
    pub fn copy_ready(&mut self, after: &Stream, grads: &[&mut DeviceBuffer<T>]) -> Result<()> {
        let known: Vec<(usize, &DeviceBuffer<T>)> = grads
            .iter()
            .filter_map(|g| {
                let i = *self.by_addr.get(&g.device_ptr().0)?;
                let fits = self.ranges.get(i).map(|r| (r.start, r.len())) == Some((0, g.len()));
                (fits && self.owned[i]).then_some((i, &**g))
            })
            .collect();
        if known.is_empty() {
            return Ok(());
        }
        self.copy_down(after, &known)
    }

    /// One AdamW step: `grads` (final, on `stream`) copied down, the update on the host with
    /// `update`'s divisor unless its non-finite flag is set, `params` rewritten from the host
    /// asynchronously: work queued on `stream` afterwards that reads `params` must first ask for
    /// them ([`HostOptimizer::params_ready`]).
    pub fn update(
        &mut self,
        stream: &Stream,
        hyper: &AdamWStep,
        update: &UpdateScalars<DeviceBuffer<f32>>,
        grads: &[&DeviceBuffer<T>],
        params: &mut [&mut DeviceBuffer<T>],
    ) -> Result<()> {
        let n = self.params.len();
        if grads.len() != n {
            return Err(TrainError::Op(format!(
                "{FLAG}: {n} tensors offloaded, {} gradients given",
                grads.len()
            )));
        }
        // The buffers' addresses, for the next steps' bucket-by-bucket copies; any change (a
        // rebuilt model) and the copies queued by address are redone here.
        let stale = grads
            .iter()
            .enumerate()
            .any(|(i, g)| self.by_addr.get(&g.device_ptr().0) != Some(&i));
        if stale {
            self.by_addr = grads
                .iter()
                .enumerate()
                .map(|(i, g)| (g.device_ptr().0, i))
                .collect();
            self.fresh.iter_mut().for_each(|f| *f = false);
        }
        let left: Vec<(usize, &DeviceBuffer<T>)> = grads
            .iter()
            .copied()
            .enumerate()
            .filter(|&(i, _)| !self.fresh[i])
            .collect();
        self.late = left.iter().filter(|&&(i, _)| self.owned[i]).count();
        self.copy_down(stream, &left)?;
        self.finish(stream, hyper, update, params)
    }

    /// How many owned gradients the last [`HostOptimizer::update`] copied down itself, after
    /// the backward, rather than bucket by bucket during it ([`HostOptimizer::copy_ready`]).
    pub fn late_copies(&self) -> usize {
        self.late
    }

    /// The rest of a step once every owned gradient has been queued down
    /// ([`HostOptimizer::copy_down`]): the copies down and the step's scalars waited for (host
    /// waits the update needs in any case; the backward may then overwrite the gradients),
    /// AdamW on the host unless the step is skipped, each updated piece of `params` queued up
    /// on the copy stream after the work queued so far on `stream` (so after every read of the
    /// old values), with an event after each. Work queued on `stream` afterwards that reads
    /// `params` must first ask for them ([`HostOptimizer::params_ready`]).
    pub fn finish(
        &mut self,
        stream: &Stream,
        hyper: &AdamWStep,
        update: &UpdateScalars<DeviceBuffer<f32>>,
        params: &mut [&mut DeviceBuffer<T>],
    ) -> Result<()> {
        let n = self.params.len();
        if params.len() != n {
            return Err(TrainError::Op(format!(
                "{FLAG}: {n} tensors offloaded, {} parameters given",
                params.len()
            )));
        }
        if let Some(i) = (0..n).find(|&i| self.owned[i] && !self.fresh[i]) {
            return Err(TrainError::Op(format!(
                "{FLAG}: the gradient of tensor {i} was not copied down this step"
            )));
        }
        self.fresh.iter_mut().for_each(|f| *f = false);
        // The previous step's uploads were asked for by this step's forward; the gradients'
        // copies down must be done before the host reads them (and before the next backward
        // writes the device buffers again).
        self.params_ready(stream, n)?;
        self.copy.synchronize().map_err(dev)?;
        // The step's two scalars (a host wait the update needs in any case).
        let mut found_inf = [0f32];
        stream
            .copy_dtoh(&update.found_inf, &mut found_inf)
            .map_err(dev)?;
        let grad_scale = match &update.grad_scale {
            Some(s) => {
                let mut h = [0f32];
                stream.copy_dtoh(s, &mut h).map_err(dev)?;
                Some(h)
            }
            None => None,
        };
        if found_inf[0] == 0.0 {
            self.host_step(hyper, grad_scale)?;
            stream.record(&self.ready).map_err(dev)?;
            self.copy.wait(&self.ready).map_err(dev)?;
            for (i, p) in params.iter_mut().enumerate() {
                if !self.owned[i] {
                    continue;
                }
                let mut dst = p.slice_mut(self.ranges[i].clone()).map_err(dev)?;
                self.copy
                    .copy_htod_async(&self.params[i], &mut dst)
                    .map_err(dev)?;
                self.copy.record(&self.uploaded[i]).map_err(dev)?;
            }
            self.awaited = 0;
        }
        Ok(())
    }

    /// Make `stream` wait for the uploads (queued by the last [`HostOptimizer::finish`]) of
    /// the tensors before index `upto` in canonical order (`usize::MAX`: all of them). The
    /// copy stream runs them in canonical order, so one event, that of the last such tensor
    /// uploaded, covers them; a prefix already waited for costs nothing.
    pub fn params_ready(&mut self, stream: &Stream, upto: usize) -> Result<()> {
        let upto = upto.min(self.owned.len());
        if upto <= self.awaited {
            return Ok(());
        }
        if let Some(last) = (self.awaited..upto).rev().find(|&i| self.owned[i]) {
            stream.wait(&self.uploaded[last]).map_err(dev)?;
        }
        self.awaited = upto;
        Ok(())
    }

    /// AdamW over every tensor on the host, chunks spread over the available cores.
    fn host_step(&mut self, hyper: &AdamWStep, grad_scale: Option<[f32; 1]>) -> Result<()> {
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
        fn slices(g: &mut [PinnedHostBuffer<f32>]) -> Result<Vec<&mut [f32]>> {
            g.iter_mut()
                .map(|b| b.as_mut_slice().map_err(dev))
                .collect()
        }
        let p: Vec<&mut [T]> = self
            .params
            .iter_mut()
            .map(|b| b.as_mut_slice().map_err(dev))
            .collect::<Result<_>>()?;
        let g: Vec<&[T]> = self
            .grads
            .iter()
            .map(|b| b.as_slice().map_err(dev))
            .collect::<Result<_>>()?;
        let m = slices(&mut self.exp_avg)?;
        let v = slices(&mut self.exp_avg_sq)?;
        let mut masters = match self.master.as_mut() {
            Some(ms) => Some(slices(ms)?.into_iter()),
            None => None,
        };
        let mut items: Vec<AdamWTensor<'_, Host, T>> = Vec::new();
        for ((((p, g), m), v), &decay) in p.into_iter().zip(g).zip(m).zip(v).zip(&self.decays) {
            let master = masters.as_mut().and_then(|it| it.next());
            let mut master_chunks = master.map(|ms| ms.chunks_mut(CHUNK));
            for (((p, g), m), v) in p
                .chunks_mut(CHUNK)
                .zip(g.chunks(CHUNK))
                .zip(m.chunks_mut(CHUNK))
                .zip(v.chunks_mut(CHUNK))
            {
                items.push(AdamWTensor {
                    param: p,
                    grad: g,
                    exp_avg: m,
                    exp_avg_sq: v,
                    max_exp_avg_sq: None,
                    master: master_chunks.as_mut().and_then(|it| it.next()),
                    weight_decay: (!decay).then_some(0.0),
                    lr_scale: None,
                });
            }
        }
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(items.len().max(1));
        let per = items.len().div_ceil(threads).max(1);
        let scale = grad_scale.as_ref().map(|s| &s[..]);
        std::thread::scope(|scope| {
            let runs: Vec<_> = items
                .chunks_mut(per)
                .map(|work| {
                    scope.spawn(move || {
                        hip_kernels::cpu::adamw(AdamW::<Host, T> {
                            params,
                            grad_scale: scale,
                            found_inf: None,
                            tensors: work,
                        })
                    })
                })
                .collect();
            runs.into_iter().try_for_each(|r| match r.join() {
                Ok(done) => done.map_err(op),
                Err(_) => Err(TrainError::Op(format!(
                    "{FLAG}: a host AdamW thread panicked"
                ))),
            })
        })
    }

    /// The host state: `(master (None when the storage type is f32: the parameters are their
    /// own master), exp_avg, exp_avg_sq)`, one vector per tensor in canonical order (the owned
    /// piece: empty for a tensor another rank owns).
    pub fn download(&self) -> Result<Zero2Host> {
        let f32s = |g: &[PinnedHostBuffer<f32>]| -> Result<Vec<Vec<f32>>> {
            g.iter()
                .map(|b| b.as_slice().map(<[f32]>::to_vec).map_err(dev))
                .collect()
        };
        let master = match &self.master {
            Some(m) => Some(f32s(m)?),
            None => None,
        };
        Ok((master, f32s(&self.exp_avg)?, f32s(&self.exp_avg_sq)?))
    }
}
