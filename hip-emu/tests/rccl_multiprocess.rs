//! Ranks in separate processes, joined through a unique id passed in hex (as a launcher would):
//! this test binary runs itself as the child ranks (`HIPK_EMU_RCCL_CHILD=<rank>:<nranks>:<id>`
//! selects the child role of `child_rank`). Each process has one emulated device; the ranks
//! meet in shared memory. A child that exits without joining a collective is reported as a
//! remote error within a fraction of the watchdog time. Everything ran on the CPU emulation.

mod rccl_util;

use std::ffi::c_int;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use hip_emu::rccl::api::*;
use hip_emu::rccl::NcclResult;
use hip_sys::hipError_t;
use rccl_util::*;

const CHILD_VAR: &str = "HIPK_EMU_RCCL_CHILD";

fn setup() -> std::sync::MutexGuard<'static, ()> {
    rccl_util::setup(1, 20_000)
}

fn spawn_child(test: &str, rank: usize, nranks: usize, id_hex: &str) -> Child {
    Command::new(std::env::current_exe().expect("own path"))
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_VAR, format!("{rank}:{nranks}:{id_hex}"))
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("spawn a child rank")
}

/// The child role, or None when this process is the parent.
fn child_role() -> Option<(usize, usize, String)> {
    let v = std::env::var(CHILD_VAR).ok()?;
    let mut parts = v.splitn(3, ':');
    let rank = parts.next()?.parse().ok()?;
    let nranks = parts.next()?.parse().ok()?;
    Some((rank, nranks, parts.next()?.to_owned()))
}

fn init(nranks: usize, id_hex: &str, rank: usize) -> NcclComm {
    set_device(0);
    let mut comm = std::ptr::null_mut();
    // SAFETY: out-parameter; id by value.
    let rc = unsafe {
        ncclCommInitRank(
            &mut comm,
            nranks as c_int,
            id_from_hex(id_hex),
            rank as c_int,
        )
    };
    nccl_ok(rc, &format!("init rank {rank}"));
    comm
}

/// Every rank's work: all-reduce (sum of f32 and max of i64), all-gather, broadcast from the
/// last rank, and a ring of send/receive; each checked against the values every rank can
/// compute.
fn rank_body(rank: usize, nranks: usize, id_hex: &str) {
    let comm = init(nranks, id_hex, rank);
    let st = stream(0);
    let count = 1000;
    let mine = |r: usize| -> Vec<f32> { (0..count).map(|i| (r * 100 + i % 97) as f32).collect() };
    let to_bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let f32s = |b: &[u8]| -> Vec<f32> {
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    let send = Buf::from_bytes(0, &to_bytes(&mine(rank)));
    let sum = Buf::new(0, count * 4);
    let gathered = Buf::new(0, nranks * count * 4);
    let big = Buf::from_bytes(0, &((rank as i64 - 1) * 1_000_000_007).to_le_bytes());
    let ring_in = Buf::new(0, count * 4);
    let bcast = Buf::from_bytes(0, &to_bytes(&mine(rank)));
    let (next, prev) = ((rank + 1) % nranks, (rank + nranks - 1) % nranks);
    // SAFETY: buffers on device 0 of this process, sized for their counts.
    unsafe {
        nccl_ok(
            ncclAllReduce(send.ptr, sum.ptr, count, 7, 0, comm, st),
            "allreduce",
        );
        nccl_ok(
            ncclAllReduce(big.ptr, big.ptr, 1, 4, 2, comm, st),
            "allreduce max",
        );
        nccl_ok(
            ncclAllGather(send.ptr, gathered.ptr, count, 7, comm, st),
            "allgather",
        );
        nccl_ok(
            ncclBroadcast(
                bcast.ptr,
                bcast.ptr,
                count,
                7,
                (nranks - 1) as c_int,
                comm,
                st,
            ),
            "broadcast",
        );
        nccl_ok(ncclGroupStart(), "group");
        nccl_ok(
            ncclSend(send.ptr, count, 7, next as c_int, comm, st),
            "send",
        );
        nccl_ok(
            ncclRecv(ring_in.ptr, count, 7, prev as c_int, comm, st),
            "recv",
        );
        nccl_ok(ncclGroupEnd(), "group end");
    }
    hip_ok(sync(st), &format!("rank {rank} sync"));
    let want_sum: Vec<f32> = (0..count)
        .map(|i| (0..nranks).map(|r| mine(r)[i]).sum())
        .collect();
    assert_eq!(f32s(&sum.read()), want_sum, "rank {rank}: all-reduce");
    let max = i64::from_le_bytes(big.read().try_into().unwrap());
    assert_eq!(max, (nranks as i64 - 2) * 1_000_000_007, "rank {rank}: max");
    let want_gather: Vec<f32> = (0..nranks).flat_map(mine).collect();
    assert_eq!(
        f32s(&gathered.read()),
        want_gather,
        "rank {rank}: all-gather"
    );
    assert_eq!(
        f32s(&bcast.read()),
        mine(nranks - 1),
        "rank {rank}: broadcast"
    );
    assert_eq!(f32s(&ring_in.read()), mine(prev), "rank {rank}: ring");
    // SAFETY: a live comm.
    nccl_ok(unsafe { ncclCommDestroy(comm) }, "destroy");
}

/// Child entry point: does nothing unless started by a parent below.
#[test]
fn child_rank() {
    let Some((rank, nranks, id_hex)) = child_role() else {
        return;
    };
    let _serial = setup();
    if let Some(id_hex) = id_hex.strip_prefix("exit-early:") {
        // Join, then exit without taking part in the collective.
        let _comm = init(nranks, id_hex, rank);
        std::process::exit(0);
    }
    rank_body(rank, nranks, &id_hex);
}

#[test]
fn three_processes_through_a_unique_id() {
    if child_role().is_some() {
        return;
    }
    let _serial = setup();
    let id = id_to_hex(&unique_id());
    let n = 3;
    let children: Vec<Child> = (1..n)
        .map(|r| spawn_child("child_rank", r, n, &id))
        .collect();
    rank_body(0, n, &id);
    for (i, mut c) in children.into_iter().enumerate() {
        let status = c.wait().expect("child ran");
        assert!(status.success(), "child rank {} failed: {status}", i + 1);
    }
}

#[test]
fn a_process_that_exits_is_a_remote_error() {
    if child_role().is_some() {
        return;
    }
    let _serial = setup();
    let id = id_to_hex(&unique_id());
    let mut child = spawn_child("child_rank", 1, 2, &format!("exit-early:{id}"));
    let comm = init(2, &id, 0);
    let st = stream(0);
    let buf = Buf::new(0, 64);
    let start = Instant::now();
    // SAFETY: 16 f32 on device 0, a live comm.
    nccl_ok(
        unsafe { ncclAllReduce(buf.ptr, buf.ptr, 16, 7, 0, comm, st) },
        "queue",
    );
    assert_eq!(sync(st), hipError_t::hipErrorLaunchFailure);
    assert!(child.wait().expect("child ran").success());
    // Found by the liveness check, long before the 20 s watchdog.
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    let mut e = NcclResult(99);
    // SAFETY: out-parameter of a live comm.
    nccl_ok(unsafe { ncclCommGetAsyncError(comm, &mut e) }, "async");
    assert_eq!(e, NcclResult::REMOTE_ERROR);
    let msg = last_nccl(comm);
    assert!(
        msg.contains("ncclAllReduce #1") && msg.contains("rank 1") && msg.contains("exited"),
        "{msg}"
    );
    // SAFETY: a live comm.
    nccl_ok(unsafe { ncclCommDestroy(comm) }, "destroy");
}
