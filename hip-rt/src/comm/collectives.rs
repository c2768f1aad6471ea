//! The collectives, as methods of [`Comm`]: lengths checked, buffers recorded with their
//! allocator on the stream, the RCCL call, and the completion tracked for [`Comm::wait`].
//!
//! Counts follow RCCL: all-reduce, broadcast and reduce move `count` elements per rank;
//! reduce-scatter takes the count each rank *receives* (the send buffer holds `count × world`),
//! all-gather the count each rank *sends* (the receive buffer holds `count × world`).

use std::ffi::{c_int, c_void};

use hip_sys::hipStream_t;
use hip_sys::rccl::{ncclComm_t, ncclResult_t};

use super::communicator::Comm;
use super::error::CommError;
use super::{call, CommElement, ReduceOp};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::memory::buffer::{DeviceView, DeviceViewMut};
use crate::stream::Stream;

/// `found == expected`, else [`CommError::Count`] with `rule`.
pub(crate) fn expect_len(
    op: &'static str,
    what: &'static str,
    found: usize,
    expected: usize,
    rule: impl FnOnce() -> String,
) -> Result<(), CommError> {
    if found == expected {
        Ok(())
    } else {
        Err(CommError::Count {
            op,
            what,
            found,
            expected,
            rule: rule(),
        })
    }
}

/// The per-rank count of an in-place reduce-scatter or all-gather over a `len`-element buffer
/// that holds one block per rank.
pub(crate) fn block_count(op: &'static str, len: usize, world: usize) -> Result<usize, CommError> {
    let count = len / world.max(1);
    expect_len(op, "the buffer", len, count * world, || {
        format!("one equal block per rank: a multiple of world ({world})")
    })?;
    Ok(count)
}

/// `value < world`, else [`CommError::Rank`].
pub(crate) fn check_rank(
    op: &'static str,
    what: &'static str,
    value: usize,
    world: usize,
) -> Result<c_int, CommError> {
    match c_int::try_from(value) {
        Ok(v) if value < world => Ok(v),
        _ => Err(CommError::Rank {
            op,
            what,
            value,
            world,
        }),
    }
}

/// `ptr` advanced by `elems` elements of `T`.
fn offset<T>(ptr: *mut c_void, elems: usize) -> *mut c_void {
    ptr.cast::<u8>()
        .wrapping_add(elems * std::mem::size_of::<T>())
        .cast()
}

fn ptr_of<T: CommElement>(view: &impl DeviceView<T>) -> *mut c_void {
    view.device_ptr().0 as *mut c_void
}

impl Comm {
    /// Checks shared by every collective, the call itself, and the tracking. `buffers` are the
    /// views' devices (checked against this rank's) and `record` records them on `stream`.
    fn launch(
        &self,
        op: &'static str,
        stream: &Stream,
        devices: &[&Device],
        record: impl FnOnce() -> Result<()>,
        run: impl FnOnce(ncclComm_t, hipStream_t) -> ncclResult_t,
    ) -> Result<()> {
        let own = self.inner.device.ordinal();
        let wrong = |what: &'static str, found: i32| Error::WrongDevice {
            what,
            expected: own,
            found,
        };
        if stream.device().ordinal() != own {
            return Err(wrong("the stream", stream.device().ordinal()));
        }
        if let Some(d) = devices.iter().find(|d| d.ordinal() != own) {
            return Err(wrong("a buffer", d.ordinal()));
        }
        record()?;
        {
            let raw = self.inner.enter(op)?;
            self.inner.device.bind_to_thread()?;
            let status = run(raw.0, stream.raw());
            call(op, self.rank(), status.result())?;
        }
        self.inner.track(op, stream)
    }

    fn check_op(&self, op: &'static str, reduce: ReduceOp) -> Result<()> {
        call(op, self.rank(), self.inner.rccl.check_op(reduce.raw()))
    }

    /// [`Comm::launch`] for an out-of-place collective: both views' devices checked, both
    /// recorded on `stream`, `run` given their device pointers (send, recv).
    fn launch_two<T: CommElement>(
        &self,
        op: &'static str,
        stream: &Stream,
        send: &impl DeviceView<T>,
        recv: &impl DeviceView<T>,
        run: impl FnOnce(*mut c_void, *mut c_void, ncclComm_t, hipStream_t) -> ncclResult_t,
    ) -> Result<()> {
        let (s, r) = (ptr_of(send), ptr_of(recv));
        let devices = [send.buffer().device(), recv.buffer().device()];
        let record = || {
            send.buffer().record_stream(stream)?;
            recv.buffer().record_stream(stream)
        };
        self.launch(op, stream, &devices, record, |comm, st| run(s, r, comm, st))
    }

    /// [`Comm::launch`] for a collective over one view (in place, send or receive): its device
    /// checked, recorded on `stream`, `run` given its device pointer.
    fn launch_one<T: CommElement>(
        &self,
        op: &'static str,
        stream: &Stream,
        buf: &impl DeviceView<T>,
        run: impl FnOnce(*mut c_void, ncclComm_t, hipStream_t) -> ncclResult_t,
    ) -> Result<()> {
        let p = ptr_of(buf);
        let record = || buf.buffer().record_stream(stream);
        self.launch(op, stream, &[buf.buffer().device()], record, |comm, st| {
            run(p, comm, st)
        })
    }

    /// `ncclAllReduce`: every rank's `recv` becomes the reduction of every rank's `send` (equal
    /// lengths).
    pub fn all_reduce<T: CommElement>(
        &self,
        send: &impl DeviceView<T>,
        recv: &mut impl DeviceViewMut<T>,
        reduce: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        const OP: &str = "ncclAllReduce";
        expect_len(OP, "recv", recv.len(), send.len(), || "recv = send".into())?;
        self.check_op(OP, reduce)?;
        let f = call(OP, self.rank(), self.inner.rccl.api().ncclAllReduce())?;
        let count = send.len();
        self.launch_two(OP, stream, send, &*recv, |s, r, comm, st| {
            // SAFETY: `send` and `recv` are live device views of `count` elements of T on this
            // rank's device (checked), kept from reuse until the work ends (record_stream).
            unsafe { f(s, r, count, T::DTYPE, reduce.raw(), comm, st) }
        })
    }

    /// `ncclAllReduce` in place.
    pub fn all_reduce_in_place<T: CommElement>(
        &self,
        buf: &mut impl DeviceViewMut<T>,
        reduce: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        const OP: &str = "ncclAllReduce";
        self.check_op(OP, reduce)?;
        let f = call(OP, self.rank(), self.inner.rccl.api().ncclAllReduce())?;
        let count = buf.len();
        self.launch_one(OP, stream, &*buf, |p, comm, st| {
            // SAFETY: `buf` is a live device view of `count` elements of T on this device.
            unsafe { f(p, p, count, T::DTYPE, reduce.raw(), comm, st) }
        })
    }

    /// `ncclReduceScatter`: `send` holds `recv.len() × world` elements; rank i's `recv` gets
    /// block i of the reduction.
    pub fn reduce_scatter<T: CommElement>(
        &self,
        send: &impl DeviceView<T>,
        recv: &mut impl DeviceViewMut<T>,
        reduce: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        const OP: &str = "ncclReduceScatter";
        let world = self.world();
        let count = recv.len();
        let want = count.saturating_mul(world);
        expect_len(OP, "send", send.len(), want, || {
            format!("send = recv ({count}) × world ({world})")
        })?;
        self.check_op(OP, reduce)?;
        let f = call(OP, self.rank(), self.inner.rccl.api().ncclReduceScatter())?;
        self.launch_two(OP, stream, send, &*recv, |s, r, comm, st| {
            // SAFETY: `send` holds count × world elements and `recv` count (checked), both live
            // views on this device, kept from reuse until the work ends.
            unsafe { f(s, r, count, T::DTYPE, reduce.raw(), comm, st) }
        })
    }

    /// `ncclReduceScatter` in place: `buf` holds one block per rank; rank i's block i becomes
    /// block i of the reduction (the other blocks are left undefined, as in RCCL).
    pub fn reduce_scatter_in_place<T: CommElement>(
        &self,
        buf: &mut impl DeviceViewMut<T>,
        reduce: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        const OP: &str = "ncclReduceScatter";
        let count = block_count(OP, buf.len(), self.world())?;
        self.check_op(OP, reduce)?;
        let f = call(OP, self.rank(), self.inner.rccl.api().ncclReduceScatter())?;
        self.launch_one(OP, stream, &*buf, |p, comm, st| {
            let r = offset::<T>(p, self.rank() * count);
            // SAFETY: `buf` holds count × world elements; the receive block is its rank-th
            // block (RCCL's in-place rule), inside it.
            unsafe { f(p, r, count, T::DTYPE, reduce.raw(), comm, st) }
        })
    }

    /// `ncclAllGather`: `recv` holds `send.len() × world` elements; block i comes from rank i.
    pub fn all_gather<T: CommElement>(
        &self,
        send: &impl DeviceView<T>,
        recv: &mut impl DeviceViewMut<T>,
        stream: &Stream,
    ) -> Result<()> {
        const OP: &str = "ncclAllGather";
        let world = self.world();
        let count = send.len();
        let want = count.saturating_mul(world);
        expect_len(OP, "recv", recv.len(), want, || {
            format!("recv = send ({count}) × world ({world})")
        })?;
        let f = call(OP, self.rank(), self.inner.rccl.api().ncclAllGather())?;
        self.launch_two(OP, stream, send, &*recv, |s, r, comm, st| {
            // SAFETY: `send` holds count elements and `recv` count × world (checked), both live
            // views on this device, kept from reuse until the work ends.
            unsafe { f(s, r, count, T::DTYPE, comm, st) }
        })
    }

    /// `ncclAllGather` in place: `buf` holds one block per rank, rank i contributing its block i.
    pub fn all_gather_in_place<T: CommElement>(
        &self,
        buf: &mut impl DeviceViewMut<T>,
        stream: &Stream,
    ) -> Result<()> {
        const OP: &str = "ncclAllGather";
        let count = block_count(OP, buf.len(), self.world())?;
        let f = call(OP, self.rank(), self.inner.rccl.api().ncclAllGather())?;
        self.launch_one(OP, stream, &*buf, |r, comm, st| {
            let s = offset::<T>(r, self.rank() * count);
            // SAFETY: `buf` holds count × world elements; the send block is its rank-th block
            // (RCCL's in-place rule), inside it.
            unsafe { f(s, r, count, T::DTYPE, comm, st) }
        })
    }

    /// `ncclBroadcast`: every rank's `recv` gets root's `send` (read on the root only; equal
    /// lengths on every rank).
    pub fn broadcast<T: CommElement>(
        &self,
        send: &impl DeviceView<T>,
        recv: &mut impl DeviceViewMut<T>,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        const OP: &str = "ncclBroadcast";
        expect_len(OP, "recv", recv.len(), send.len(), || "recv = send".into())?;
        let root = check_rank(OP, "root", root, self.world())?;
        let f = call(OP, self.rank(), self.inner.rccl.api().ncclBroadcast())?;
        let count = send.len();
        self.launch_two(OP, stream, send, &*recv, |s, r, comm, st| {
            // SAFETY: both live views of `count` elements on this device (checked).
            unsafe { f(s, r, count, T::DTYPE, root, comm, st) }
        })
    }

    /// `ncclBroadcast` in place: root's `buf` is copied into every other rank's.
    pub fn broadcast_in_place<T: CommElement>(
        &self,
        buf: &mut impl DeviceViewMut<T>,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        const OP: &str = "ncclBroadcast";
        let root = check_rank(OP, "root", root, self.world())?;
        let f = call(OP, self.rank(), self.inner.rccl.api().ncclBroadcast())?;
        let count = buf.len();
        self.launch_one(OP, stream, &*buf, |p, comm, st| {
            // SAFETY: a live view of `count` elements on this device.
            unsafe { f(p, p, count, T::DTYPE, root, comm, st) }
        })
    }

    /// `ncclReduce`: root's `recv` becomes the reduction of every rank's `send` (`recv` is
    /// written on the root only; equal lengths on every rank).
    pub fn reduce<T: CommElement>(
        &self,
        send: &impl DeviceView<T>,
        recv: &mut impl DeviceViewMut<T>,
        reduce: ReduceOp,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        const OP: &str = "ncclReduce";
        expect_len(OP, "recv", recv.len(), send.len(), || "recv = send".into())?;
        let root = check_rank(OP, "root", root, self.world())?;
        self.check_op(OP, reduce)?;
        let f = call(OP, self.rank(), self.inner.rccl.api().ncclReduce())?;
        let count = send.len();
        self.launch_two(OP, stream, send, &*recv, |s, r, comm, st| {
            // SAFETY: both live views of `count` elements on this device (checked).
            unsafe { f(s, r, count, T::DTYPE, reduce.raw(), root, comm, st) }
        })
    }

    /// `ncclReduce` in place: root's `buf` becomes the reduction of every rank's.
    pub fn reduce_in_place<T: CommElement>(
        &self,
        buf: &mut impl DeviceViewMut<T>,
        reduce: ReduceOp,
        root: usize,
        stream: &Stream,
    ) -> Result<()> {
        const OP: &str = "ncclReduce";
        let root = check_rank(OP, "root", root, self.world())?;
        self.check_op(OP, reduce)?;
        let f = call(OP, self.rank(), self.inner.rccl.api().ncclReduce())?;
        let count = buf.len();
        self.launch_one(OP, stream, &*buf, |p, comm, st| {
            // SAFETY: a live view of `count` elements on this device.
            unsafe { f(p, p, count, T::DTYPE, reduce.raw(), root, comm, st) }
        })
    }

    /// `ncclSend` of `buf` to rank `peer` (which must call [`Comm::recv`] with the same count
    /// and type). Pair sends and receives that must progress together in a [`group`](super::group).
    pub fn send<T: CommElement>(
        &self,
        buf: &impl DeviceView<T>,
        peer: usize,
        stream: &Stream,
    ) -> Result<()> {
        const OP: &str = "ncclSend";
        let peer = check_rank(OP, "peer", peer, self.world())?;
        let f = call(OP, self.rank(), self.inner.rccl.api().ncclSend())?;
        let count = buf.len();
        self.launch_one(OP, stream, buf, |p, comm, st| {
            // SAFETY: a live view of `count` elements on this device.
            unsafe { f(p, count, T::DTYPE, peer, comm, st) }
        })
    }

    /// `ncclRecv` into `buf` from rank `peer`.
    pub fn recv<T: CommElement>(
        &self,
        buf: &mut impl DeviceViewMut<T>,
        peer: usize,
        stream: &Stream,
    ) -> Result<()> {
        const OP: &str = "ncclRecv";
        let peer = check_rank(OP, "peer", peer, self.world())?;
        let f = call(OP, self.rank(), self.inner.rccl.api().ncclRecv())?;
        let count = buf.len();
        self.launch_one(OP, stream, &*buf, |p, comm, st| {
            // SAFETY: a live, exclusively borrowed view of `count` elements on this device.
            unsafe { f(p, count, T::DTYPE, peer, comm, st) }
        })
    }
}
