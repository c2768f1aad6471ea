//! The collectives' and point-to-point transfers through the shared-memory slots, run on a
//! device's executor thread (hip-emu's one "executor" is the kernel executor, `crate::exec`).
//!
//! **Collectives** move in steps. In step `s` each rank waits until every rank has finished
//! reading step `s-1` (its slot is free), writes a descriptor (call number, kind, type, op, root,
//! count, round) and its share of the data into its collective slot, publishes `posted = s`
//! (Release), waits until every rank posted `s`, compares the descriptors (any difference is an
//! invalid-usage error on every rank), computes its own output from all slots in rank order, and
//! publishes `consumed = s`. A collective larger than a slot takes several rounds.
//!
//! **Send/receive** use per-pair mailboxes: rank `a`'s p2p slot holds one sub-slot per peer.
//! The sender writes a chunk (header: type, count, offset, length) when the receiver has
//! acknowledged the previous one (`sent[a][b] == acked[b][a]`); the receiver checks the header
//! against its receive (type and count must match), copies, and acknowledges. All sends and
//! receives of one group progress together, so pairs that send to each other do not deadlock; a
//! send completes when its last chunk is acknowledged.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::comm::Comm;
use super::reduce::{self, DataType, RedOp};
use super::shm::{self, SLOT};
use super::{NcclResult, RcclFail};

/// The kind of a collective (stored in descriptors).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    AllReduce = 1,
    Reduce = 2,
    Broadcast = 3,
    AllGather = 4,
    ReduceScatter = 5,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::AllReduce => "ncclAllReduce",
            Kind::Reduce => "ncclReduce",
            Kind::Broadcast => "ncclBroadcast",
            Kind::AllGather => "ncclAllGather",
            Kind::ReduceScatter => "ncclReduceScatter",
        }
    }

    fn from_raw(raw: u32) -> Option<Kind> {
        [
            Kind::AllReduce,
            Kind::Reduce,
            Kind::Broadcast,
            Kind::AllGather,
            Kind::ReduceScatter,
        ]
        .into_iter()
        .find(|k| *k as u32 == raw)
    }

    /// Whether the op and root matter (they are compared only then).
    fn uses_op(self) -> bool {
        matches!(self, Kind::AllReduce | Kind::Reduce | Kind::ReduceScatter)
    }

    fn uses_root(self) -> bool {
        matches!(self, Kind::Reduce | Kind::Broadcast)
    }
}

/// One collective, as queued.
#[derive(Debug, Clone, Copy)]
pub struct CollOp {
    pub kind: Kind,
    pub dtype: DataType,
    pub op: RedOp,
    /// AllReduce/Reduce/Broadcast: elements; AllGather: send count; ReduceScatter: receive count.
    pub count: usize,
    pub root: usize,
    pub send: usize,
    pub recv: usize,
    /// 1-based number of this collective on its communicator.
    pub call: u64,
}

/// One send or receive, as queued.
#[derive(Debug, Clone, Copy)]
pub struct P2pOp {
    pub send: bool,
    pub peer: usize,
    pub dtype: DataType,
    pub count: usize,
    pub buf: usize,
}

/// A queued operation.
#[derive(Debug, Clone, Copy)]
pub enum Op {
    Coll(CollOp),
    P2p(P2pOp),
}

impl Op {
    pub fn label(&self) -> String {
        match self {
            Op::Coll(c) => format!("{} #{}", c.kind.name(), c.call),
            Op::P2p(p) if p.send => format!("ncclSend to rank {}", p.peer),
            Op::P2p(p) => format!("ncclRecv from rank {}", p.peer),
        }
    }
}

/// Run one queued group of `ops` of `comm` (a single call is a group of one): the sends and
/// receives together first, then the collectives in call order. A failure becomes the
/// communicator's asynchronous error and aborts it.
pub fn run(comm: &Arc<Comm>, ops: &[Op]) -> Result<(), RcclFail> {
    let result = (|| {
        if let Some(err) = comm.async_error() {
            return Err(RcclFail::new(
                err.code,
                format!(
                    "not run: the communicator already failed ({}); abort it and create another",
                    err.message
                ),
            ));
        }
        let p2p: Vec<P2pOp> = ops
            .iter()
            .filter_map(|o| match o {
                Op::P2p(p) => Some(*p),
                Op::Coll(_) => None,
            })
            .collect();
        if !p2p.is_empty() {
            run_p2p(comm, &p2p)?;
        }
        for op in ops {
            if let Op::Coll(c) = op {
                run_coll(comm, c)?;
            }
        }
        Ok(())
    })();
    if let Err(fail) = &result {
        comm.fail(fail);
    }
    result
}

// Descriptor fields, after shm::C_DESC.
const D_CALL: usize = 0;
const D_KIND: usize = 8;
const D_DTYPE: usize = 12;
const D_OP: usize = 16;
const D_ROOT: usize = 20;
const D_COUNT: usize = 24;
const D_ROUND: usize = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Desc {
    call: u64,
    kind: u32,
    dtype: u32,
    op: u32,
    root: u32,
    count: u64,
    round: u64,
}

impl Desc {
    fn of(c: &CollOp, round: u64) -> Desc {
        Desc {
            call: c.call,
            kind: c.kind as u32,
            dtype: c.dtype as u32,
            op: if c.kind.uses_op() { c.op as u32 } else { 0 },
            root: if c.kind.uses_root() { c.root as u32 } else { 0 },
            count: c.count as u64,
            round,
        }
    }

    fn write(&self, comm: &Comm) {
        let (reg, me) = (&comm.region, comm.rank);
        let at = |f| shm::C_DESC + f;
        reg.ctrl_u64(me, at(D_CALL))
            .store(self.call, Ordering::Relaxed);
        reg.ctrl_u32(me, at(D_KIND))
            .store(self.kind, Ordering::Relaxed);
        reg.ctrl_u32(me, at(D_DTYPE))
            .store(self.dtype, Ordering::Relaxed);
        reg.ctrl_u32(me, at(D_OP)).store(self.op, Ordering::Relaxed);
        reg.ctrl_u32(me, at(D_ROOT))
            .store(self.root, Ordering::Relaxed);
        reg.ctrl_u64(me, at(D_COUNT))
            .store(self.count, Ordering::Relaxed);
        reg.ctrl_u64(me, at(D_ROUND))
            .store(self.round, Ordering::Relaxed);
    }

    fn read(comm: &Comm, r: usize) -> Desc {
        let reg = &comm.region;
        let at = |f| shm::C_DESC + f;
        Desc {
            call: reg.ctrl_u64(r, at(D_CALL)).load(Ordering::Relaxed),
            kind: reg.ctrl_u32(r, at(D_KIND)).load(Ordering::Relaxed),
            dtype: reg.ctrl_u32(r, at(D_DTYPE)).load(Ordering::Relaxed),
            op: reg.ctrl_u32(r, at(D_OP)).load(Ordering::Relaxed),
            root: reg.ctrl_u32(r, at(D_ROOT)).load(Ordering::Relaxed),
            count: reg.ctrl_u64(r, at(D_COUNT)).load(Ordering::Relaxed),
            round: reg.ctrl_u64(r, at(D_ROUND)).load(Ordering::Relaxed),
        }
    }

    fn describe(&self) -> String {
        let kind = Kind::from_raw(self.kind).map_or("?", Kind::name);
        let dtype = DataType::from_raw(self.dtype).map_or("?", DataType::name);
        let mut s = format!("{kind} #{} count={} {dtype}", self.call, self.count);
        if Kind::from_raw(self.kind).is_some_and(Kind::uses_op) {
            s += &format!(" op={}", RedOp::from_raw(self.op).map_or("?", RedOp::name));
        }
        if Kind::from_raw(self.kind).is_some_and(Kind::uses_root) {
            s += &format!(" root={}", self.root);
        }
        s
    }
}

/// Elements each rank moves per round.
fn per_round(c: &CollOp, nranks: usize) -> usize {
    let e = c.dtype.size();
    match c.kind {
        Kind::ReduceScatter => SLOT / (e * nranks),
        _ => SLOT / e,
    }
}

/// # Safety
/// `src` valid for reads and `dst` for writes of `bytes` (may overlap).
unsafe fn copy(dst: *mut u8, src: *const u8, bytes: usize) {
    if bytes > 0 {
        // SAFETY: per the contract; `copy` allows overlap.
        unsafe { std::ptr::copy(src, dst, bytes) };
    }
}

fn run_coll(comm: &Comm, c: &CollOp) -> Result<(), RcclFail> {
    let (n, me, reg) = (comm.nranks, comm.rank, &comm.region);
    let e = c.dtype.size();
    let chunk = per_round(c, n);
    let rounds = c.count.div_ceil(chunk).max(1);
    let what = || format!("{} #{} ({})", c.kind.name(), c.call, comm.describe());
    let mut step = comm.step.lock().unwrap_or_else(|p| p.into_inner());
    for round in 0..rounds {
        let off = round * chunk;
        let len = chunk.min(c.count - off.min(c.count));
        let s = *step + 1;
        let consumed = |r: usize| reg.ctrl_u64(r, shm::C_CONSUMED).load(Ordering::Acquire);
        let posted = |r: usize| reg.ctrl_u64(r, shm::C_POSTED).load(Ordering::Acquire);
        comm.wait(
            Some(c.call),
            &what,
            &|| (0..n).all(|r| consumed(r) + 1 >= s),
            &|| (0..n).filter(|&r| consumed(r) + 1 < s).collect(),
        )?;
        Desc::of(c, round as u64).write(comm);
        let mine = reg.coll_slot(me);
        // SAFETY: (all copies below) device ranges were checked against live allocations of
        // this process when the call was queued (count * size bytes; hipFree waits for queued
        // work before unmapping); slots are SLOT bytes and `len` elements (times nranks for
        // ReduceScatter) fit one by construction of `per_round`; nobody reads our slot before
        // we publish `posted = s`, and the others' slots are not rewritten before we publish
        // `consumed = s`.
        unsafe {
            match c.kind {
                Kind::AllReduce | Kind::Reduce | Kind::AllGather => {
                    copy(mine, (c.send + off * e) as *const u8, len * e)
                }
                Kind::Broadcast if me == c.root => {
                    copy(mine, (c.send + off * e) as *const u8, len * e)
                }
                Kind::Broadcast => {}
                Kind::ReduceScatter => {
                    for j in 0..n {
                        let src = c.send + (j * c.count + off) * e;
                        copy(mine.add(j * len * e), src as *const u8, len * e);
                    }
                }
            }
        }
        reg.ctrl_u64(me, shm::C_POSTED).store(s, Ordering::Release);
        reg.ring();
        comm.wait(
            Some(c.call),
            &what,
            &|| (0..n).all(|r| posted(r) >= s),
            &|| (0..n).filter(|&r| posted(r) < s).collect(),
        )?;
        let want = Desc::of(c, round as u64);
        let descs: Vec<Desc> = (0..n).map(|r| Desc::read(comm, r)).collect();
        if descs.iter().any(|d| *d != want) {
            let table: Vec<String> = descs
                .iter()
                .enumerate()
                .map(|(r, d)| format!("rank {r}: {}", d.describe()))
                .collect();
            return Err(RcclFail::usage(format!(
                "{}: the ranks disagree on the collective ({}); every rank must make the same \
                 collective calls in the same order with the same count, type, op and root",
                what(),
                table.join("; ")
            )));
        }
        let slots: Vec<*const u8> = (0..n).map(|r| reg.coll_slot(r) as *const u8).collect();
        // SAFETY: as above.
        unsafe {
            match c.kind {
                Kind::AllReduce => {
                    reduce::reduce(c.dtype, c.op, &slots, (c.recv + off * e) as *mut u8, len)
                }
                Kind::Reduce if me == c.root => {
                    reduce::reduce(c.dtype, c.op, &slots, (c.recv + off * e) as *mut u8, len)
                }
                Kind::Reduce => {}
                Kind::Broadcast => copy((c.recv + off * e) as *mut u8, slots[c.root], len * e),
                Kind::AllGather => {
                    for (j, slot) in slots.iter().enumerate() {
                        let dst = c.recv + (j * c.count + off) * e;
                        copy(dst as *mut u8, *slot, len * e);
                    }
                }
                Kind::ReduceScatter => {
                    let parts: Vec<*const u8> = slots.iter().map(|s| s.add(me * len * e)).collect();
                    reduce::reduce(c.dtype, c.op, &parts, (c.recv + off * e) as *mut u8, len)
                }
            }
        }
        reg.ctrl_u64(me, shm::C_CONSUMED)
            .store(s, Ordering::Release);
        reg.ring();
        *step = s;
    }
    Ok(())
}

/// Bytes of a chunk header in a p2p sub-slot.
const P2P_HEADER: usize = 64;

/// Sub-slot size per peer.
fn sub_slot(nranks: usize) -> usize {
    (SLOT / nranks) & !63
}

struct Progress {
    op: P2pOp,
    /// Bytes written (send) or received (recv).
    done: usize,
    /// Chunks written by this send (complete when all acknowledged).
    last_chunk: u64,
    finished: bool,
    started: bool,
}

fn run_p2p(comm: &Comm, ops: &[P2pOp]) -> Result<(), RcclFail> {
    let (n, me, reg) = (comm.nranks, comm.rank, &comm.region);
    let sub = sub_slot(n);
    let payload = sub - P2P_HEADER;
    let mut prog: Vec<Progress> = ops
        .iter()
        .map(|op| Progress {
            op: *op,
            done: 0,
            last_chunk: 0,
            finished: false,
            started: false,
        })
        .collect();
    let sent = |from: usize, to: usize| {
        reg.ctrl_u64(from, shm::C_SENT + 8 * to)
            .load(Ordering::Acquire)
    };
    let acked = |by: usize, from: usize| {
        reg.ctrl_u64(by, shm::C_ACKED + 8 * from)
            .load(Ordering::Acquire)
    };
    // The counters that let this rank move: peers' `sent` to us and `acked` from us.
    let snapshot = |peers: &[usize]| -> Vec<u64> {
        peers
            .iter()
            .flat_map(|&q| [sent(q, me), acked(q, me)])
            .collect()
    };
    loop {
        // Taken before looking, so a change made while we look is not missed by the wait.
        let peers: Vec<usize> = prog
            .iter()
            .filter(|p| !p.finished)
            .map(|p| p.op.peer)
            .collect();
        let before = snapshot(&peers);
        let mut progressed = false;
        for i in 0..prog.len() {
            if prog[i].finished {
                continue;
            }
            // Per peer and direction, only the earliest unfinished op moves (FIFO).
            let p = prog[i].op;
            let ahead = prog[..i]
                .iter()
                .any(|q| !q.finished && q.op.send == p.send && q.op.peer == p.peer);
            if ahead {
                continue;
            }
            let e = p.dtype.size();
            let total = p.count * e;
            if p.send {
                let mine = sent(me, p.peer);
                let free = mine == acked(p.peer, me);
                if prog[i].started && prog[i].done >= total {
                    if free && mine >= prog[i].last_chunk {
                        prog[i].finished = true;
                        progressed = true;
                    }
                    continue;
                }
                if !free {
                    continue;
                }
                let len = payload.min(total - prog[i].done);
                // SAFETY: the sub-slot for `peer` in our p2p slot is `sub` bytes; the receiver
                // reads it only after our Release store of `sent` below and has acknowledged
                // the previous chunk (`free`); the source range was checked when queued.
                unsafe {
                    let slot = reg.p2p_slot(me).add(p.peer * sub);
                    let header = slot.cast::<u64>();
                    header.write_unaligned(p.dtype as u64);
                    header.add(1).write_unaligned(p.count as u64);
                    header.add(2).write_unaligned(prog[i].done as u64);
                    header.add(3).write_unaligned(len as u64);
                    copy(
                        slot.add(P2P_HEADER),
                        (p.buf + prog[i].done) as *const u8,
                        len,
                    );
                }
                prog[i].done += len;
                prog[i].started = true;
                prog[i].last_chunk = mine + 1;
                reg.ctrl_u64(me, shm::C_SENT + 8 * p.peer)
                    .store(mine + 1, Ordering::Release);
                reg.ring();
                progressed = true;
            } else {
                let got = acked(me, p.peer);
                if sent(p.peer, me) <= got {
                    continue;
                }
                // SAFETY: the peer published this chunk with a Release store of `sent`, which
                // we loaded with Acquire; it does not rewrite the sub-slot before our
                // acknowledgement; the destination range was checked when queued.
                let (dtype, count, offset, len) = unsafe {
                    let slot = reg.p2p_slot(p.peer).add(me * sub);
                    let header = slot.cast::<u64>();
                    (
                        header.read_unaligned(),
                        header.add(1).read_unaligned(),
                        header.add(2).read_unaligned() as usize,
                        header.add(3).read_unaligned() as usize,
                    )
                };
                if dtype != p.dtype as u64 || count != p.count as u64 {
                    let theirs = u32::try_from(dtype)
                        .ok()
                        .and_then(|d| DataType::from_raw(d).ok())
                        .map_or("?", DataType::name);
                    return Err(RcclFail::usage(format!(
                        "ncclRecv ({}): rank {} sends {count} {theirs} but this rank receives \
                         {} {} from it; a send and its receive must have the same count and type",
                        comm.describe(),
                        p.peer,
                        p.count,
                        p.dtype.name()
                    )));
                }
                if offset != prog[i].done || offset + len > total {
                    return Err(RcclFail::new(
                        NcclResult::INTERNAL_ERROR,
                        format!(
                            "ncclRecv ({}): chunk at {offset}+{len} out of sequence (expected \
                             {} of {total})",
                            comm.describe(),
                            prog[i].done
                        ),
                    ));
                }
                // SAFETY: as above.
                unsafe {
                    let slot = reg.p2p_slot(p.peer).add(me * sub);
                    copy((p.buf + offset) as *mut u8, slot.add(P2P_HEADER), len);
                }
                prog[i].done += len;
                reg.ctrl_u64(me, shm::C_ACKED + 8 * p.peer)
                    .store(got + 1, Ordering::Release);
                reg.ring();
                progressed = true;
                if prog[i].done >= total {
                    prog[i].finished = true;
                }
            }
        }
        if prog.iter().all(|p| p.finished) {
            return Ok(());
        }
        if progressed {
            continue;
        }
        // Nothing could move: wait until a peer's counters change (or the watchdog fires).
        let pending: Vec<String> = prog
            .iter()
            .filter(|p| !p.finished)
            .map(|p| {
                let dir = if p.op.send { "send to" } else { "receive from" };
                format!(
                    "{dir} rank {} ({} of {} bytes)",
                    p.op.peer,
                    p.done,
                    p.op.count * p.op.dtype.size()
                )
            })
            .collect();
        comm.wait(
            None,
            &|| {
                format!(
                    "ncclSend/ncclRecv ({}) waiting to {}",
                    comm.describe(),
                    pending.join(", ")
                )
            },
            &|| snapshot(&peers) != before,
            &|| peers.clone(),
        )?;
    }
}
