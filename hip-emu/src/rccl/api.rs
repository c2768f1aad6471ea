//! The exported `nccl*` C functions, argument checks, and group calls.
//!
//! Group semantics: between `ncclGroupStart` and the matching `ncclGroupEnd`, calls are checked
//! and recorded, not queued; `ncclGroupEnd` queues, per communicator, one command holding that
//! communicator's calls (its sends and receives progress together), and finishes deferred
//! `ncclCommInitRank`s by waiting for every rank to join. So one thread may drive every rank.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use hip_sys::hipStream_t;

use super::comm::{self, Comm, UniqueId};
use super::reduce::{DataType, RedOp};
use super::shm::{self, Region};
use super::transfer::{self, CollOp, Kind, Op, P2pOp};
use super::{NcclResult, RcclFail, VERSION};
use crate::runtime::memory::{self, Owner};
use crate::runtime::{device, runtime};

/// `ncclComm_t`: an opaque handle (a number looked up in a table, never dereferenced).
pub type NcclComm = *mut c_void;

type Res<T = ()> = Result<T, RcclFail>;

#[derive(Default)]
struct Group {
    depth: u32,
    /// Recorded calls: (communicator handle, communicator, stream, op).
    ops: Vec<(usize, Arc<Comm>, hipStream_t, Op)>,
    /// Communicators whose init waits for the group's end.
    inits: Vec<Arc<Comm>>,
}

thread_local! {
    static GROUP: RefCell<Group> = RefCell::new(Group::default());
    static LAST: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Run an export's body: a panic becomes ncclInternalError; a failure's message is kept as
/// this thread's last error.
fn guard(name: &str, body: impl FnOnce() -> Res) -> NcclResult {
    let status = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(s) => s,
        Err(p) => Err(RcclFail::new(
            NcclResult::INTERNAL_ERROR,
            format!(
                "{name} panicked inside the emulated RCCL: {}",
                crate::runtime::error::panic_text(&*p)
            ),
        )),
    };
    match status {
        Ok(()) => NcclResult::SUCCESS,
        Err(f) => {
            LAST.with(|l| *l.borrow_mut() = format!("{name}: {}", f.message));
            f.code
        }
    }
}

/// # Safety
/// `ptr` is null or valid for a write of `T`.
unsafe fn out<T>(ptr: *mut T, value: T, what: &str) -> Res {
    if ptr.is_null() {
        return Err(RcclFail::invalid(format!("{what} is a null pointer")));
    }
    // SAFETY: non-null, valid per the caller's contract.
    unsafe { ptr.write(value) };
    Ok(())
}

fn hip_fail(f: crate::runtime::error::Fail) -> RcclFail {
    RcclFail::new(NcclResult::UNHANDLED_CUDA_ERROR, f.message)
}

/// Check that `[ptr, ptr + bytes)` is device memory of `device` in one live allocation.
fn check_buffer(what: &str, ptr: *const c_void, bytes: usize, comm: &Comm) -> Res {
    if bytes == 0 {
        return Ok(());
    }
    let alloc =
        memory::check_range(ptr as usize, bytes, what).map_err(|f| RcclFail::invalid(f.message))?;
    match alloc.owner {
        Owner::Device(d) if d == comm.device => Ok(()),
        _ => Err(RcclFail::invalid(format!(
            "{what}: {ptr:p} is in {}, but this communicator's rank uses device {}",
            alloc.describe(),
            comm.device
        ))),
    }
}

fn elems(count: usize, times: usize, dtype: DataType, what: &str) -> Res<usize> {
    count
        .checked_mul(times)
        .and_then(|n| n.checked_mul(dtype.size()))
        .ok_or_else(|| RcclFail::invalid(format!("{what}: count {count} overflows")))
}

/// Check a call and queue it (or record it inside a group).
fn submit(handle: NcclComm, stream: hipStream_t, build: impl FnOnce(&Comm) -> Res<Op>) -> Res {
    let comm = comm::lookup(handle as usize)?;
    if let Some(err) = comm.async_error() {
        return Err(RcclFail::new(
            err.code,
            format!(
                "the communicator ({}) has an asynchronous error: {}; abort it",
                comm.describe(),
                err.message
            ),
        ));
    }
    let (dev, _) = runtime()
        .map_err(hip_fail)?
        .stream(stream)
        .map_err(hip_fail)?;
    if dev.ordinal != comm.device {
        return Err(RcclFail::invalid(format!(
            "the stream belongs to device {}, but this communicator's rank ({}) uses device {}",
            dev.ordinal,
            comm.describe(),
            comm.device
        )));
    }
    let mut op = build(&comm)?;
    if let Op::Coll(c) = &mut op {
        let mut h = comm.host();
        h.calls += 1;
        c.call = h.calls;
    }
    let grouped = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth > 0 {
            g.ops.push((handle as usize, comm.clone(), stream, op));
            true
        } else {
            false
        }
    });
    if grouped {
        return Ok(());
    }
    enqueue(&comm, &[(stream, op)])
}

/// Queue `ops` of one communicator as one command on the first op's stream; the other streams
/// named wait for it, and it waits for their earlier work and the communicator's previous op.
fn enqueue(comm: &Arc<Comm>, ops: &[(hipStream_t, Op)]) -> Res {
    let rt = runtime().map_err(hip_fail)?;
    let ids: Vec<u64> = ops
        .iter()
        .map(|(s, _)| rt.stream(*s).map(|(_, i)| i.id).map_err(hip_fail))
        .collect::<Res<_>>()?;
    let main = ids[0];
    let dev = rt.device(comm.device).map_err(hip_fail)?;
    let ex = &dev.executor;
    let mut others: Vec<u64> = ids[1..].iter().copied().filter(|&s| s != main).collect();
    others.sort_unstable();
    others.dedup();
    let mut h = comm.host();
    let mut deps: Vec<(u64, u64)> = h.last_op.into_iter().collect();
    deps.extend(
        others
            .iter()
            .filter_map(|&s| ex.pending_tail(s).map(|seq| (s, seq))),
    );
    let list: Vec<Op> = ops.iter().map(|(_, o)| *o).collect();
    let label = match list.as_slice() {
        [one] => one.label(),
        many => format!("nccl group of {} calls", many.len()),
    };
    let colls = list.iter().filter(|o| matches!(o, Op::Coll(_))).count() as u64;
    let c = comm.clone();
    let work: crate::runtime::queue::Work = Box::new(move || {
        // It cannot finish before the other ranks' parts run: under HIPK_EMU_LAZY it is demand
        // on this process's other devices meanwhile (else each operation waits their grace).
        let _peers: Vec<_> = runtime()
            .map(|rt| {
                rt.devices
                    .iter()
                    .filter(|d| d.ordinal != c.device)
                    .map(|d| d.executor.demand())
                    .collect()
            })
            .unwrap_or_default();
        transfer::run(&c, &list).map_err(|f| {
            crate::runtime::error::Fail::new(
                hip_sys::hipError_t::hipErrorLaunchFailure,
                format!("{} failed: {}", label_of(&c), f.message),
            )
        })
    });
    let seq = ex
        .enqueue_after(main, label.clone(), work, deps)
        .map_err(hip_fail)?;
    for s in others {
        ex.enqueue_marker(s, label.clone(), vec![(main, seq)])
            .map_err(hip_fail)?;
    }
    h.last_op = Some((main, seq));
    comm.region
        .ctrl_u64(comm.rank, shm::C_HOST_CALLS)
        .fetch_add(colls, Ordering::AcqRel);
    comm.region.ring();
    Ok(())
}

fn label_of(c: &Comm) -> String {
    format!("emulated RCCL operation of {}", c.describe())
}

fn dtype(raw: c_int) -> Res<DataType> {
    DataType::from_raw(raw as u32)
}

fn redop(raw: c_int) -> Res<RedOp> {
    RedOp::from_raw(raw as u32)
}

fn rank_arg(value: c_int, comm: &Comm, what: &str) -> Res<usize> {
    usize::try_from(value)
        .ok()
        .filter(|r| *r < comm.nranks)
        .ok_or_else(|| {
            RcclFail::invalid(format!(
                "{what} {value} is not a rank of this communicator (0..{})",
                comm.nranks
            ))
        })
}

/// Wait for a communicator to finish its queued work (destroy).
fn drain(comm: &Comm) {
    let last = comm.host().last_op;
    if let (Some((stream, seq)), Ok(rt)) = (last, runtime()) {
        if let Ok(dev) = rt.device(comm.device) {
            dev.executor.wait_done(stream, seq);
        }
    }
}

macro_rules! nccl_exports {
    ($(
        $(#[doc = $doc:literal])*
        fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block
    )*) => {$(
        $(#[doc = $doc])*
        ///
        /// # Safety
        /// RCCL's C API contract for this function: pointer arguments are null or valid for
        /// the reads and writes `nccl.h` documents, device buffers for the whole operation.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> NcclResult {
            guard(stringify!($name), || $body)
        }
    )*};
}

nccl_exports! {
    /// Reports [`VERSION`] (2.18.4).
    fn ncclGetVersion(version: *mut c_int) {
        // SAFETY: out-parameter per the C API contract.
        unsafe { out(version, VERSION, "version") }
    }

    /// A fresh id naming a shared-memory region; also removes region files of dead runs.
    fn ncclGetUniqueId(id: *mut UniqueId) {
        Region::remove_stale_files();
        // SAFETY: out-parameter per the C API contract.
        unsafe { out(id, UniqueId::generate(), "uniqueId") }
    }

    /// Joins as `rank` on this thread's current device. Outside a group it waits (at most the
    /// watchdog time) for every rank; inside one, `ncclGroupEnd` waits.
    fn ncclCommInitRank(comm: *mut NcclComm, nranks: c_int, id: UniqueId, rank: c_int) {
        if comm.is_null() {
            return Err(RcclFail::invalid("comm is a null pointer"));
        }
        runtime().map_err(hip_fail)?;
        let device = device::current_ordinal();
        let c = comm::join(&id, nranks, rank, device)?;
        let in_group = GROUP.with(|g| g.borrow().depth > 0);
        if in_group {
            GROUP.with(|g| g.borrow_mut().inits.push(c.clone()));
        } else if let Err(e) = c.wait_joined() {
            c.region.abort(e.code, &format!("rank {} failed to initialise: {}", c.rank, e.message));
            return Err(e);
        }
        let handle = comm::register(c);
        // SAFETY: out-parameter per the C API contract (checked non-null).
        unsafe { out(comm, handle as NcclComm, "comm") }
    }

    /// One process, `ndev` ranks on `devlist` (or devices 0..ndev); rank i uses `devlist[i]`.
    fn ncclCommInitAll(comms: *mut NcclComm, ndev: c_int, devlist: *const c_int) {
        let rt = runtime().map_err(hip_fail)?;
        let n = usize::try_from(ndev).ok().filter(|n| *n >= 1).ok_or_else(|| {
            RcclFail::invalid(format!("ndev {ndev} must be at least 1"))
        })?;
        if comms.is_null() {
            return Err(RcclFail::invalid("comms is a null pointer"));
        }
        let devices: Vec<i32> = if devlist.is_null() {
            (0..ndev).collect()
        } else {
            // SAFETY: the caller provides `ndev` ints at `devlist`.
            unsafe { std::slice::from_raw_parts(devlist, n) }.to_vec()
        };
        for (i, d) in devices.iter().enumerate() {
            rt.device(*d).map_err(|f| RcclFail::invalid(f.message))?;
            if let Some(j) = devices[..i].iter().position(|x| x == d) {
                return Err(RcclFail::usage(format!(
                    "devlist names device {d} twice (ranks {j} and {i}): like NCCL, the \
                     emulated RCCL needs one device per rank (duplicate GPU)"
                )));
            }
        }
        let id = UniqueId::generate();
        let joined: Vec<Arc<Comm>> = devices
            .iter()
            .enumerate()
            .map(|(r, d)| comm::join(&id, ndev, r as c_int, *d))
            .collect::<Res<_>>()?;
        for c in &joined {
            c.wait_joined()?;
        }
        for (i, c) in joined.into_iter().enumerate() {
            let handle = comm::register(c);
            // SAFETY: the caller provides `ndev` writable handles at `comms`.
            unsafe { comms.add(i).write(handle as NcclComm) };
        }
        Ok(())
    }

    /// Waits for the communicator's queued work, then releases it.
    fn ncclCommDestroy(comm: NcclComm) {
        let c = comm::unregister(comm as usize)?;
        drain(&c);
        Ok(())
    }

    /// Aborts the communicator for every rank (their pending collectives fail at once) and
    /// releases it without waiting.
    fn ncclCommAbort(comm: NcclComm) {
        let c = comm::unregister(comm as usize)?;
        c.region.abort(
            NcclResult::REMOTE_ERROR,
            &format!("rank {} called ncclCommAbort", c.rank),
        );
        Ok(())
    }

    fn ncclCommGetAsyncError(comm: NcclComm, error: *mut NcclResult) {
        let c = comm::lookup(comm as usize)?;
        let code = c.async_error().map_or(NcclResult::SUCCESS, |e| e.code);
        // SAFETY: out-parameter per the C API contract.
        unsafe { out(error, code, "asyncError") }
    }

    fn ncclCommCount(comm: NcclComm, count: *mut c_int) {
        let c = comm::lookup(comm as usize)?;
        // SAFETY: out-parameter per the C API contract.
        unsafe { out(count, c.nranks as c_int, "count") }
    }

    fn ncclCommCuDevice(comm: NcclComm, device: *mut c_int) {
        let c = comm::lookup(comm as usize)?;
        // SAFETY: out-parameter per the C API contract.
        unsafe { out(device, c.device, "device") }
    }

    fn ncclCommUserRank(comm: NcclComm, rank: *mut c_int) {
        let c = comm::lookup(comm as usize)?;
        // SAFETY: out-parameter per the C API contract.
        unsafe { out(rank, c.rank as c_int, "rank") }
    }

    fn ncclAllReduce(send: *const c_void, recv: *mut c_void, count: usize, datatype: c_int, op: c_int, comm: NcclComm, stream: hipStream_t) {
        submit(comm, stream, |c| {
            let (dt, op) = (dtype(datatype)?, redop(op)?);
            let bytes = elems(count, 1, dt, "ncclAllReduce")?;
            check_buffer("ncclAllReduce sendbuff", send, bytes, c)?;
            check_buffer("ncclAllReduce recvbuff", recv, bytes, c)?;
            Ok(Op::Coll(CollOp { kind: Kind::AllReduce, dtype: dt, op, count, root: 0, send: send as usize, recv: recv as usize, call: 0 }))
        })
    }

    /// `recvbuff` is used (and checked) on the root only.
    fn ncclReduce(send: *const c_void, recv: *mut c_void, count: usize, datatype: c_int, op: c_int, root: c_int, comm: NcclComm, stream: hipStream_t) {
        submit(comm, stream, |c| {
            let (dt, op) = (dtype(datatype)?, redop(op)?);
            let root = rank_arg(root, c, "root")?;
            let bytes = elems(count, 1, dt, "ncclReduce")?;
            check_buffer("ncclReduce sendbuff", send, bytes, c)?;
            if c.rank == root {
                check_buffer("ncclReduce recvbuff", recv, bytes, c)?;
            }
            Ok(Op::Coll(CollOp { kind: Kind::Reduce, dtype: dt, op, count, root, send: send as usize, recv: recv as usize, call: 0 }))
        })
    }

    /// `sendbuff` is used (and checked) on the root only.
    fn ncclBroadcast(send: *const c_void, recv: *mut c_void, count: usize, datatype: c_int, root: c_int, comm: NcclComm, stream: hipStream_t) {
        submit(comm, stream, |c| {
            let dt = dtype(datatype)?;
            let root = rank_arg(root, c, "root")?;
            let bytes = elems(count, 1, dt, "ncclBroadcast")?;
            if c.rank == root {
                check_buffer("ncclBroadcast sendbuff", send, bytes, c)?;
            }
            check_buffer("ncclBroadcast recvbuff", recv, bytes, c)?;
            Ok(Op::Coll(CollOp { kind: Kind::Broadcast, dtype: dt, op: RedOp::Sum, count, root, send: send as usize, recv: recv as usize, call: 0 }))
        })
    }

    /// `recvcount` elements per rank; `sendbuff` holds nranks * recvcount.
    fn ncclReduceScatter(send: *const c_void, recv: *mut c_void, recvcount: usize, datatype: c_int, op: c_int, comm: NcclComm, stream: hipStream_t) {
        submit(comm, stream, |c| {
            let (dt, op) = (dtype(datatype)?, redop(op)?);
            check_buffer("ncclReduceScatter sendbuff", send, elems(recvcount, c.nranks, dt, "ncclReduceScatter")?, c)?;
            check_buffer("ncclReduceScatter recvbuff", recv, elems(recvcount, 1, dt, "ncclReduceScatter")?, c)?;
            Ok(Op::Coll(CollOp { kind: Kind::ReduceScatter, dtype: dt, op, count: recvcount, root: 0, send: send as usize, recv: recv as usize, call: 0 }))
        })
    }

    /// `sendcount` elements per rank; `recvbuff` holds nranks * sendcount.
    fn ncclAllGather(send: *const c_void, recv: *mut c_void, sendcount: usize, datatype: c_int, comm: NcclComm, stream: hipStream_t) {
        submit(comm, stream, |c| {
            let dt = dtype(datatype)?;
            check_buffer("ncclAllGather sendbuff", send, elems(sendcount, 1, dt, "ncclAllGather")?, c)?;
            check_buffer("ncclAllGather recvbuff", recv, elems(sendcount, c.nranks, dt, "ncclAllGather")?, c)?;
            Ok(Op::Coll(CollOp { kind: Kind::AllGather, dtype: dt, op: RedOp::Sum, count: sendcount, root: 0, send: send as usize, recv: recv as usize, call: 0 }))
        })
    }

    fn ncclSend(send: *const c_void, count: usize, datatype: c_int, peer: c_int, comm: NcclComm, stream: hipStream_t) {
        submit(comm, stream, |c| {
            let dt = dtype(datatype)?;
            let peer = rank_arg(peer, c, "peer")?;
            check_buffer("ncclSend sendbuff", send, elems(count, 1, dt, "ncclSend")?, c)?;
            Ok(Op::P2p(P2pOp { send: true, peer, dtype: dt, count, buf: send as usize }))
        })
    }

    fn ncclRecv(recv: *mut c_void, count: usize, datatype: c_int, peer: c_int, comm: NcclComm, stream: hipStream_t) {
        submit(comm, stream, |c| {
            let dt = dtype(datatype)?;
            let peer = rank_arg(peer, c, "peer")?;
            check_buffer("ncclRecv recvbuff", recv, elems(count, 1, dt, "ncclRecv")?, c)?;
            Ok(Op::P2p(P2pOp { send: false, peer, dtype: dt, count, buf: recv as usize }))
        })
    }

    fn ncclGroupStart() {
        GROUP.with(|g| g.borrow_mut().depth += 1);
        Ok(())
    }

    /// At the outermost end: queue each communicator's recorded calls as one command, then wait
    /// for the deferred inits.
    fn ncclGroupEnd() {
        let (ops, inits) = GROUP.with(|g| {
            let mut g = g.borrow_mut();
            match g.depth {
                0 => Err(RcclFail::usage("ncclGroupEnd without a matching ncclGroupStart")),
                1 => {
                    g.depth = 0;
                    Ok((std::mem::take(&mut g.ops), std::mem::take(&mut g.inits)))
                }
                _ => {
                    g.depth -= 1;
                    Ok((Vec::new(), Vec::new()))
                }
            }
        })?;
        let mut first_err: Option<RcclFail> = None;
        for c in &inits {
            if let Err(e) = c.wait_joined() {
                c.region.abort(e.code, &format!("rank {} failed to initialise: {}", c.rank, e.message));
                first_err.get_or_insert(e);
            }
        }
        // Per communicator, in order of first appearance.
        let mut order: Vec<usize> = Vec::new();
        for (h, ..) in &ops {
            if !order.contains(h) {
                order.push(*h);
            }
        }
        for h in order {
            let mine: Vec<(hipStream_t, Op)> = ops.iter().filter(|o| o.0 == h).map(|o| (o.2, o.3)).collect();
            let comm = ops.iter().find(|o| o.0 == h).map(|o| o.1.clone());
            if let Some(comm) = comm {
                if let Err(e) = enqueue(&comm, &mine) {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

/// `ncclGetErrorString`.
#[no_mangle]
pub extern "C" fn ncclGetErrorString(result: NcclResult) -> *const c_char {
    crate::runtime::error::intern(result.describe())
}

/// `ncclGetLastError`: the communicator's asynchronous error if it has one, else the message
/// of this thread's last failed call (empty if none). The text lives for the process.
#[no_mangle]
pub extern "C" fn ncclGetLastError(comm: NcclComm) -> *const c_char {
    let from_comm = (!comm.is_null())
        .then(|| comm::lookup(comm as usize).ok())
        .flatten()
        .and_then(|c| c.async_error())
        .map(|e| e.message);
    let text = from_comm.unwrap_or_else(|| LAST.with(|l| l.borrow().clone()));
    crate::runtime::error::intern(&text)
}
