//! ZeRO stage 2 on the device backend (`--zero 2`, docs/MEMORY.md): each rank keeps an
//! element-granular share of the gradients, f32 master weights and AdamW moments.
//!
//! Layout: every trained tensor, in canonical order, concatenated into one flat buffer of `P`
//! elements, padded to `W × ⌈P / W⌉` ([`ShardPlan`]); rank `r` owns elements
//! `r·⌈P/W⌉ .. (r+1)·⌈P/W⌉`. A rank holds its gradient shard (storage type), and its master
//! (when the storage type is not f32) and moment shards (f32), all laid out like the flat
//! buffer's share. The layout depends on neither the backward order nor the buckets, so the
//! checkpoints (full tensors, gathered) are independent of W and of the stage.
//!
//! A step: the model allocates each layer's gradients only when the backward reaches it and
//! hands them over as soon as they are final ([`Zero2::ready`]); once the handed tensors fill a
//! bucket (`--bucket-mb`), the communication stream reduces every element of the bucket to its
//! owner's shard (one `ncclReduce` per (tensor, owner) piece, grouped: a reduce-scatter at
//! element granularity) and the tensors are freed (the allocator waits for that stream before
//! reusing them). With gradient accumulation every micro-batch does so: its finished buckets go
//! to their owners, the first micro-batch's sums are written into the shard and each later
//! one's added to it (in the storage type, on the communication stream), so a rank never holds
//! more than its shard and the buckets in flight ([`Zero2::end_micro_batch`]). The norm is taken over the shards; AdamW updates the owned pieces; the
//! updated pieces are broadcast from their owners (an all-gather at element granularity).
//!
//! With `--offload-optimizer cpu` ([`crate::offload`]) the device keeps only the gradient shard:
//! the owned pieces' master weights and moments live in pinned host memory, each bucket's owned
//! pieces are copied down on the copy stream as soon as the communication stream has reduced
//! them, AdamW runs on the host, and the updated pieces go back up before the broadcast.

use crate::backend::{AdamWStep, TrainElement, UpdateScalars, Zero2Host};
use crate::error::{dev, op, Result, TrainError};
use crate::offload::HostOptimizer;
use hip_kernels::ops::{self, AdamW, AdamWParams, AdamWTensor, OptimizerTables, Run};
use hip_kernels::params::OnDevice;
use hip_rt::ddp::ShardPlan;
use hip_rt::{Comm, DeviceBuffer, DeviceView, DeviceViewMut, Event, ReduceOp, Stream};
use std::ops::Range;

/// One piece of a tensor: the part rank `owner` owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    /// The owning rank.
    pub owner: usize,
    /// Elements of the tensor.
    pub range: Range<usize>,
    /// Where they start in the owner's shard.
    pub at: usize,
}

/// The element-granular split of tensors of lengths `lens` (canonical order) over `world`
/// ranks: per tensor, its non-empty pieces in rank order.
pub fn pieces(lens: &[usize], plan: &ShardPlan) -> Vec<Vec<Piece>> {
    let mut start = 0usize;
    lens.iter()
        .map(|&n| {
            let t = start..start + n;
            start += n;
            (0..plan.world())
                .filter_map(|r| {
                    let s = plan.shard_range(r);
                    let (a, b) = (t.start.max(s.start), t.end.min(s.end));
                    (a < b).then(|| Piece {
                        owner: r,
                        range: a - t.start..b - t.start,
                        at: a - s.start,
                    })
                })
                .collect()
        })
        .collect()
}

/// One rank's ZeRO stage 2 state (shards of storage type `T` gradients and f32 optimizer
/// state) and the bucket of handed-over gradients not yet reduced.
pub struct Zero2<T: TrainElement> {
    plan: ShardPlan,
    rank: usize,
    lens: Vec<usize>,
    pieces: Vec<Vec<Piece>>,
    decays: Vec<bool>,
    /// This rank's summed gradients (`shard_len`; padding stays 0).
    grads: DeviceBuffer<T>,
    /// The optimizer state's shards on the device (empty with offload).
    master: Option<DeviceBuffer<f32>>,
    exp_avg: DeviceBuffer<f32>,
    exp_avg_sq: DeviceBuffer<f32>,
    /// `--offload-optimizer cpu`: the owned pieces' optimizer state on the host.
    host: Option<Box<HostOptimizer<T>>>,
    bucket_elems: usize,
    pending: Vec<(usize, DeviceBuffer<T>)>,
    pending_elems: usize,
    /// Per tensor: whether this step's shard already holds a sum of its owned piece (a later
    /// micro-batch's sum is added to it rather than written over it).
    written: Vec<bool>,
    /// Whether the gradients handed over are of the step's last micro-batch (offload copies
    /// the owned pieces down only then).
    last: bool,
}

impl<T: TrainElement> Zero2<T> {
    /// This rank's shares of `state` (`[params, exp_avg, exp_avg_sq]`, full f32 tensors in
    /// canonical order), uploaded on `stream` (with `offload`, kept in pinned host memory
    /// instead); buckets of `bucket_elems` elements.
    pub fn new(
        comm: &Comm,
        stream: &Stream,
        state: [&[&[f32]]; 3],
        decays: &[bool],
        (bucket_elems, offload): (usize, bool),
    ) -> Result<Self> {
        let lens: Vec<usize> = state[0].iter().map(|t| t.len()).collect();
        for (what, group) in [("exp_avg", state[1]), ("exp_avg_sq", state[2])] {
            let ok =
                group.len() == lens.len() && group.iter().zip(&lens).all(|(t, &n)| t.len() == n);
            if !ok {
                return Err(TrainError::Op(format!(
                    "ZeRO 2: the {what} tensors do not match the parameters' shapes"
                )));
            }
        }
        if decays.len() != lens.len() {
            return Err(TrainError::Op(format!(
                "ZeRO 2: {} weight-decay flags for {} tensors",
                decays.len(),
                lens.len()
            )));
        }
        let total: usize = lens.iter().sum();
        let plan = ShardPlan::new(total, comm.world()).map_err(dev)?;
        let rank = comm.rank();
        let pieces = pieces(&lens, &plan);
        // This rank's share of a full state group, padded with zeros.
        let share = |group: &[&[f32]]| -> Vec<f32> {
            let mut out = vec![0.0f32; plan.shard_len()];
            for (t, ps) in group.iter().zip(&pieces) {
                for p in ps.iter().filter(|p| p.owner == rank) {
                    out[p.at..p.at + p.range.len()].copy_from_slice(&t[p.range.clone()]);
                }
            }
            out
        };
        let up = |h: &[f32]| DeviceBuffer::from_slice(stream, h).map_err(dev);
        let on_host = |group: &[&[f32]]| -> Vec<Vec<f32>> {
            group
                .iter()
                .zip(&pieces)
                .map(|(t, ps)| match ps.iter().find(|p| p.owner == rank) {
                    Some(p) => t[p.range.clone()].to_vec(),
                    None => Vec::new(),
                })
                .collect()
        };
        let (master, exp_avg, exp_avg_sq, host) = match offload {
            true => {
                let groups = [on_host(state[0]), on_host(state[1]), on_host(state[2])];
                let refs: Vec<Vec<&[f32]>> = groups
                    .iter()
                    .map(|g| g.iter().map(Vec::as_slice).collect())
                    .collect();
                let starts: Vec<usize> = pieces
                    .iter()
                    .map(|ps| {
                        ps.iter()
                            .find(|p| p.owner == rank)
                            .map_or(0, |p| p.range.start)
                    })
                    .collect();
                let h = HostOptimizer::pieces(
                    comm.device(),
                    [&refs[0], &refs[1], &refs[2]],
                    decays,
                    &starts,
                )?;
                let none = || DeviceBuffer::<f32>::zeroed(stream, 0).map_err(dev);
                (None, none()?, none()?, Some(Box::new(h)))
            }
            false => {
                let master = match <T as hip_kernels::params::Element>::DTYPE {
                    hip_kernels::params::DType::F32 => None,
                    _ => Some(up(&share(state[0]))?),
                };
                (master, up(&share(state[1]))?, up(&share(state[2]))?, None)
            }
        };
        Ok(Zero2 {
            grads: DeviceBuffer::zeroed(stream, plan.shard_len()).map_err(dev)?,
            master,
            exp_avg,
            exp_avg_sq,
            host,
            plan,
            rank,
            pieces,
            decays: decays.to_vec(),
            bucket_elems: bucket_elems.max(1),
            pending: Vec::new(),
            pending_elems: 0,
            written: vec![false; lens.len()],
            last: true,
            lens,
        })
    }

    /// Elements in this rank's shard (padding included).
    pub fn shard_len(&self) -> usize {
        self.plan.shard_len()
    }

    /// Take the final gradients `grads` of a micro-batch (`last`: the step's last); reduce the
    /// bucket once it is full.
    pub fn ready(
        &mut self,
        grads: Vec<(usize, DeviceBuffer<T>)>,
        last: bool,
        comm: &Comm,
        sync: [&Stream; 2],
        ready: &Event,
    ) -> Result<()> {
        for (i, g) in grads {
            let want = self.lens.get(i).copied();
            if want != Some(g.len()) {
                return Err(TrainError::Op(format!(
                    "ZeRO 2: gradient {i} of {} elements handed over, expected {want:?}",
                    g.len()
                )));
            }
            self.pending_elems += g.len();
            self.pending.push((i, g));
        }
        self.last = last;
        if self.pending_elems >= self.bucket_elems {
            self.flush(comm, sync, ready)?;
        }
        Ok(())
    }

    /// Reduce every pending gradient to its owners on the communication stream `sync[1]`
    /// (after the work queued so far on the compute stream `sync[0]`, through `ready`), then
    /// free them once that stream is done with them. The first sum of a step's owned piece is
    /// written into the shard; a later micro-batch's is added to it.
    pub fn flush(
        &mut self,
        comm: &Comm,
        [compute, stream]: [&Stream; 2],
        ready: &Event,
    ) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        ready.record(compute).map_err(dev)?;
        stream.wait(ready).map_err(dev)?;
        let (rank, pieces, shard) = (self.rank, &self.pieces, &mut self.grads);
        let (pending, written) = (&mut self.pending, &mut self.written);
        // (pending entry, piece) of the owned sums to add to the shard after the group.
        let mut adds: Vec<(usize, Piece)> = Vec::new();
        hip_rt::comm::group(|| {
            for (k, (i, g)) in pending.iter_mut().enumerate() {
                for p in &pieces[*i] {
                    let len = p.range.len();
                    if p.owner == rank && !written[*i] {
                        let send = g.slice(p.range.clone())?;
                        let mut recv = shard.slice_mut(p.at..p.at + len)?;
                        comm.reduce(&send, &mut recv, ReduceOp::Sum, p.owner, stream)?;
                        written[*i] = true;
                    } else {
                        // Another rank's piece, or one this step's shard already holds a sum
                        // of: this micro-batch's sum lands in `g` (on its owner).
                        let mut buf = g.slice_mut(p.range.clone())?;
                        comm.reduce_in_place(&mut buf, ReduceOp::Sum, p.owner, stream)?;
                        if p.owner == rank {
                            adds.push((k, p.clone()));
                        }
                    }
                }
            }
            Ok(())
        })
        .map_err(dev)?;
        for (k, p) in adds {
            // shard += this micro-batch's sum, in the storage type, after the reduce (same
            // stream); the old shard values go through a scratch copy (the add writes apart
            // from its inputs).
            let len = p.range.len();
            let mut old = DeviceBuffer::<T>::alloc(stream, len).map_err(dev)?;
            let mut piece = self.grads.slice_mut(p.at..p.at + len).map_err(dev)?;
            stream.copy_dtod(&piece, &mut old).map_err(dev)?;
            let sum = self.pending[k].1.slice(p.range.clone()).map_err(dev)?;
            ops::ResidualAdd::<OnDevice, T> {
                params: ops::ElementwiseParams { len },
                a: &old,
                b: &sum,
                out: &mut piece,
            }
            .run(stream)
            .map_err(op)?;
        }
        if let (Some(h), true) = (self.host.as_mut(), self.last) {
            // Offload: this rank's reduced pieces of the bucket go down as soon as the
            // communication stream is done with them.
            let mine = self
                .pending
                .iter()
                .flat_map(|(i, _)| {
                    self.pieces[*i]
                        .iter()
                        .filter(|p| p.owner == rank)
                        .map(move |p| (*i, p.at..p.at + p.range.len()))
                })
                .map(|(i, r)| Ok((i, self.grads.slice(r).map_err(dev)?)))
                .collect::<Result<Vec<_>>>()?;
            let refs: Vec<_> = mine.iter().map(|(i, g)| (*i, g)).collect();
            h.copy_down(stream, &refs)?;
        }
        for (_, g) in self.pending.drain(..) {
            // Freed now; its memory is reused only after the reduces queued above have run.
            g.record_stream(stream).map_err(dev)?;
        }
        self.pending_elems = 0;
        Ok(())
    }

    /// After a micro-batch's backward: reduce the partly filled bucket; returns whether that
    /// micro-batch was the step's last (then the next gradients handed over start a new step's
    /// sums).
    pub fn end_micro_batch(
        &mut self,
        comm: &Comm,
        sync: [&Stream; 2],
        ready: &Event,
    ) -> Result<bool> {
        self.flush(comm, sync, ready)?;
        if self.last {
            self.written.iter_mut().for_each(|w| *w = false);
        }
        Ok(self.last)
    }

    /// The gradient shard (for the norm).
    pub fn grads(&self) -> &DeviceBuffer<T> {
        &self.grads
    }

    /// AdamW over the owned pieces (`update`: the step's grad scale and skip flag), then every
    /// piece of `params` broadcast from its owner, on `stream`.
    #[allow(clippy::too_many_arguments)]
    pub fn update(
        &mut self,
        comm: &Comm,
        stream: &Stream,
        tables: &mut OptimizerTables,
        hyper: &AdamWStep,
        update: &UpdateScalars<DeviceBuffer<f32>>,
        params: &mut [&mut DeviceBuffer<T>],
    ) -> Result<()> {
        if params.len() != self.lens.len() {
            return Err(TrainError::Op(format!(
                "ZeRO 2: {} parameter tensors for {} planned",
                params.len(),
                self.lens.len()
            )));
        }
        match self.host.as_mut() {
            Some(h) => {
                h.finish(stream, hyper, update, params)?;
                // The broadcasts below read the owners' uploaded pieces.
                h.params_ready(stream, usize::MAX)?;
            }
            None => self.device_step(stream, tables, hyper, update, params)?,
        }
        // Every owner's updated piece to every rank.
        let pieces = &self.pieces;
        hip_rt::comm::group(|| {
            for (t, ps) in params.iter_mut().zip(pieces) {
                for p in ps {
                    let mut v = t.slice_mut(p.range.clone())?;
                    comm.broadcast_in_place(&mut v, p.owner, stream)?;
                }
            }
            Ok(())
        })
        .map_err(dev)
    }

    /// AdamW over the owned pieces on the device.
    fn device_step(
        &mut self,
        stream: &Stream,
        tables: &mut OptimizerTables,
        hyper: &AdamWStep,
        update: &UpdateScalars<DeviceBuffer<f32>>,
        params: &mut [&mut DeviceBuffer<T>],
    ) -> Result<()> {
        let rank = self.rank;
        // The owned pieces lie in canonical order in the shard: carve each state buffer into
        // consecutive disjoint views, one per piece.
        let owned: Vec<(usize, Piece)> = self
            .pieces
            .iter()
            .enumerate()
            .flat_map(|(i, ps)| {
                ps.iter()
                    .filter(|p| p.owner == rank)
                    .map(move |p| (i, p.clone()))
            })
            .collect();
        let mut ms = carve(&mut self.exp_avg, &owned)?;
        let mut vs = carve(&mut self.exp_avg_sq, &owned)?;
        let mut masters = match self.master.as_mut() {
            Some(m) => Some(carve(m, &owned)?),
            None => None,
        };
        let grads: Vec<_> = owned
            .iter()
            .map(|(_, p)| self.grads.slice(p.at..p.at + p.range.len()).map_err(dev))
            .collect::<Result<_>>()?;
        // Each tensor has at most one owned piece (a shard is one contiguous range).
        let mut views: Vec<Option<hip_rt::DeviceSliceMut<'_, T>>> = Vec::new();
        {
            let mut it = owned.iter().peekable();
            for (i, t) in params.iter_mut().enumerate() {
                match it.peek() {
                    Some((j, p)) if *j == i => {
                        views.push(Some(t.slice_mut(p.range.clone()).map_err(dev)?));
                        it.next();
                    }
                    _ => views.push(None),
                }
            }
        }
        let mut param_views: Vec<hip_rt::DeviceSliceMut<'_, T>> =
            views.into_iter().flatten().collect();
        let mut masters_it = masters.as_mut().map(|m| m.iter_mut());
        let mut slots: Vec<AdamWTensor<'_, OnDevice, T>> = param_views
            .iter_mut()
            .zip(&grads)
            .zip(ms.iter_mut().zip(vs.iter_mut()))
            .zip(&owned)
            .map(|(((param, grad), (m, v)), (i, _))| AdamWTensor {
                param: param as &mut dyn DeviceViewMut<T>,
                grad: grad as &dyn DeviceView<T>,
                exp_avg: m as &mut dyn DeviceViewMut<f32>,
                exp_avg_sq: v as &mut dyn DeviceViewMut<f32>,
                max_exp_avg_sq: None,
                master: masters_it
                    .as_mut()
                    .and_then(|it| it.next())
                    .map(|m| m as &mut dyn DeviceViewMut<f32>),
                weight_decay: (!self.decays[*i]).then_some(0.0),
                lr_scale: None,
            })
            .collect();
        if !slots.is_empty() {
            let a = AdamW::<OnDevice, T> {
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
                grad_scale: update
                    .grad_scale
                    .as_ref()
                    .map(|b| b as &dyn DeviceView<f32>),
                found_inf: Some(&update.found_inf as &dyn DeviceView<f32>),
                tensors: &mut slots,
            };
            ops::adamw_tabled(stream, a, tables).map_err(op)?;
        }
        Ok(())
    }

    /// Every tensor's full master weights (when kept), moments, gathered from every rank's
    /// shard through a padded f32 buffer on `stream` (a host wait).
    pub fn download(&self, comm: &Comm, stream: &Stream) -> Result<Zero2Host> {
        let gather = |shard: &DeviceBuffer<f32>| -> Result<Vec<Vec<f32>>> {
            let mut full =
                DeviceBuffer::<f32>::alloc(stream, self.plan.padded_len()).map_err(dev)?;
            self.plan
                .all_gather(comm, shard, &mut full, stream)
                .map_err(dev)?;
            comm.wait().map_err(dev)?;
            let host = full.to_vec(stream).map_err(dev)?;
            let mut at = 0usize;
            Ok(self
                .lens
                .iter()
                .map(|&n| {
                    let t = host[at..at + n].to_vec();
                    at += n;
                    t
                })
                .collect())
        };
        if let Some(h) = &self.host {
            // Offload: each owned piece's host state laid out as the shard, then gathered.
            let (master, m, v) = h.download()?;
            let shard = |group: Vec<Vec<f32>>| -> Result<Vec<Vec<f32>>> {
                let mut out = vec![0.0f32; self.plan.shard_len()];
                for (t, ps) in group.iter().zip(&self.pieces) {
                    for p in ps.iter().filter(|p| p.owner == self.rank) {
                        out[p.at..p.at + t.len()].copy_from_slice(t);
                    }
                }
                gather(&DeviceBuffer::from_slice(stream, &out).map_err(dev)?)
            };
            return Ok((master.map(shard).transpose()?, shard(m)?, shard(v)?));
        }
        let master = match &self.master {
            Some(m) => Some(gather(m)?),
            None => None,
        };
        Ok((master, gather(&self.exp_avg)?, gather(&self.exp_avg_sq)?))
    }
}

/// `buf` carved into consecutive disjoint views, one per owned piece (which lie in canonical
/// order in the shard).
fn carve<'a>(
    buf: &'a mut DeviceBuffer<f32>,
    owned: &[(usize, Piece)],
) -> Result<Vec<hip_rt::DeviceSliceMut<'a, f32>>> {
    let mut out = Vec::with_capacity(owned.len());
    let first = owned.first().map_or(0, |(_, p)| p.at);
    let (_, mut rest) = buf.split_at_mut(first).map_err(dev)?;
    for (_, p) in owned {
        let (head, tail) = rest.into_split_at(p.range.len()).map_err(dev)?;
        out.push(head);
        rest = tail;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_split_tensors_at_element_granularity() {
        // 3 + 4 + 3 = 10 elements over 4 ranks: shards of 3, padded to 12.
        let plan = ShardPlan::new(10, 4).unwrap();
        let p = pieces(&[3, 4, 3], &plan);
        let flat = |v: &[Piece]| {
            v.iter()
                .map(|p| (p.owner, p.range.clone(), p.at))
                .collect::<Vec<_>>()
        };
        assert_eq!(flat(&p[0]), vec![(0, 0..3, 0)]);
        assert_eq!(flat(&p[1]), vec![(1, 0..3, 0), (2, 3..4, 0)]);
        assert_eq!(flat(&p[2]), vec![(2, 0..2, 1), (3, 2..3, 0)]);
        // Every element owned exactly once; shares differ by at most the padding.
        let per_rank: Vec<usize> = (0..4)
            .map(|r| {
                p.iter()
                    .flatten()
                    .filter(|x| x.owner == r)
                    .map(|x| x.range.len())
                    .sum()
            })
            .collect();
        assert_eq!(per_rank, vec![3, 3, 3, 1]);
    }
}
