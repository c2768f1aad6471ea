//! What a real RCCL leaves as a hang or as corrupted data is an error in the emulated one:
//! ranks that disagree on a collective, a rank that never arrives (after the watchdog time), a
//! buffer smaller than the count, two ranks on one device, a send/receive mismatch, an aborted
//! communicator. Each error is a result code, an asynchronous error of the communicator and a
//! message from ncclGetLastError. Everything ran on the CPU emulation.

mod rccl_util;

use std::ffi::c_int;
use std::time::{Duration, Instant};

use hip_emu::rccl::api::*;
use hip_emu::rccl::NcclResult;
use hip_sys::hipError_t;
use rccl_util::*;

/// Watchdog time for this process: short, so the timeout cases stay fast.
const TIMEOUT_MS: u64 = 400;

fn setup() -> std::sync::MutexGuard<'static, ()> {
    rccl_util::setup(4, TIMEOUT_MS)
}

/// (what differs, rank 1's (count, dtype, op, root), words the message must contain).
type Mismatch = (
    &'static str,
    (usize, c_int, c_int, c_int),
    &'static [&'static str],
);

fn async_error(comm: NcclComm) -> NcclResult {
    let mut e = NcclResult(99);
    // SAFETY: out-parameter of a live comm.
    nccl_ok(
        unsafe { ncclCommGetAsyncError(comm, &mut e) },
        "async error",
    );
    e
}

fn assert_contains(text: &str, needles: &[&str]) {
    for n in needles {
        assert!(text.contains(n), "{n:?} missing from: {text}");
    }
}

/// Two ranks call all-reduce with arguments that differ in one respect; both fail with invalid
/// usage, the message lists every rank's call, and the communicator refuses further work.
#[test]
fn ranks_disagreeing_on_count_type_op_or_root_are_invalid_usage() {
    let _serial = setup();
    // (name, rank 1's (count, dtype, op, root), needles)
    let cases: [Mismatch; 4] = [
        ("count", (4, 7, 0, 0), &["count=8", "count=4"]),
        ("type", (8, 2, 0, 0), &["float32", "int32"]),
        ("op", (8, 7, 2, 0), &["op=sum", "op=max"]),
        ("root", (8, 7, 0, 1), &["root=0", "root=1"]),
    ];
    for (name, (count1, dt1, op1, root1), needles) in cases {
        let (comms, streams) = init_all(&[0, 1]);
        let bufs: Vec<Buf> = (0..2).map(|r| Buf::new(r, 64)).collect();
        let reduce = name == "root";
        group(|| {
            for r in 0..2 {
                let (count, dt, op, root) = if r == 0 {
                    (8, 7, 0, 0)
                } else {
                    (count1, dt1, op1, root1)
                };
                // SAFETY: 64-byte buffers on rank r's device hold 8 elements of any type here.
                let rc = unsafe {
                    if reduce {
                        ncclReduce(
                            bufs[r].ptr,
                            bufs[r].ptr,
                            count,
                            dt,
                            op,
                            root,
                            comms[r],
                            streams[r],
                        )
                    } else {
                        ncclAllReduce(
                            bufs[r].ptr,
                            bufs[r].ptr,
                            count,
                            dt,
                            op,
                            comms[r],
                            streams[r],
                        )
                    }
                };
                nccl_ok(rc, name);
            }
        });
        for r in 0..2 {
            assert_eq!(
                sync(streams[r]),
                hipError_t::hipErrorLaunchFailure,
                "{name}: rank {r}"
            );
            assert_eq!(
                async_error(comms[r]),
                NcclResult::INVALID_USAGE,
                "{name}: rank {r}"
            );
            let msg = last_nccl(comms[r]);
            assert_contains(&msg, &["disagree", "rank 0:", "rank 1:"]);
            assert_contains(&msg, needles);
        }
        // The communicator is unusable: the next call fails at once with the same code.
        // SAFETY: a live comm, a live buffer.
        let rc = unsafe { ncclAllReduce(bufs[0].ptr, bufs[0].ptr, 8, 7, 0, comms[0], streams[0]) };
        assert_eq!(rc, NcclResult::INVALID_USAGE, "{name}");
        assert_contains(
            &last_nccl(std::ptr::null_mut()),
            &["asynchronous error", "abort it"],
        );
        destroy(&comms);
    }
}

/// One rank calls a collective the other never calls: after the watchdog time it fails,
/// naming the collective and the missing rank; nothing hangs.
#[test]
fn a_rank_that_never_arrives_times_out_naming_it() {
    let _serial = setup();
    let (comms, streams) = init_all(&[2, 3]);
    let buf = Buf::new(2, 64);
    let start = Instant::now();
    // SAFETY: 16 f32 on rank 0's device (device 2).
    nccl_ok(
        unsafe { ncclAllReduce(buf.ptr, buf.ptr, 16, 7, 0, comms[0], streams[0]) },
        "queue",
    );
    assert_eq!(sync(streams[0]), hipError_t::hipErrorLaunchFailure);
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(TIMEOUT_MS) && took < Duration::from_secs(10),
        "{took:?}"
    );
    assert_eq!(async_error(comms[0]), NcclResult::REMOTE_ERROR);
    let msg = last_nccl(comms[0]);
    assert_contains(
        &msg,
        &[
            "ncclAllReduce #1",
            "rank(s) [1]",
            "did not arrive within 400 ms",
            "has queued 0 collective(s)",
            "HIPK_EMU_RCCL_TIMEOUT_MS",
        ],
    );
    // The HIP error carries the same detail.
    assert_contains(&last_hip(), &["ncclAllReduce #1", "did not arrive"]);
    // The other rank sees the abort.
    assert_eq!(
        async_error(comms[1]),
        NcclResult::SUCCESS,
        "rank 1 ran nothing yet"
    );
    let other = Buf::new(3, 64);
    nccl_ok(
        // SAFETY: a live comm, a live buffer on rank 1's device.
        unsafe { ncclAllReduce(other.ptr, other.ptr, 16, 7, 0, comms[1], streams[1]) },
        "late rank queues",
    );
    assert_eq!(sync(streams[1]), hipError_t::hipErrorLaunchFailure);
    assert_contains(&last_nccl(comms[1]), &["aborted", "rank 0 failed"]);
    destroy(&comms);
}

/// ncclCommInitRank for rank 0 of 2 with no rank 1: an error after the watchdog time, not a
/// hang.
#[test]
fn init_without_the_other_ranks_times_out() {
    let _serial = setup();
    let id = unique_id();
    set_device(0);
    let mut comm = std::ptr::null_mut();
    let start = Instant::now();
    // SAFETY: out-parameter; id by value.
    let rc = unsafe { ncclCommInitRank(&mut comm, 3, id, 0) };
    assert_eq!(rc, NcclResult::REMOTE_ERROR);
    assert!(start.elapsed() < Duration::from_secs(10));
    assert_contains(
        &last_nccl(std::ptr::null_mut()),
        &["ncclCommInitRank", "rank(s) [1, 2]", "never joined"],
    );
}

/// Buffers are checked against hip-emu's allocations when the call is made.
#[test]
fn buffers_too_small_or_not_on_the_device_are_invalid_arguments() {
    let _serial = setup();
    let (comms, streams) = init_all(&[0, 1]);
    let small = Buf::new(0, 100);
    let other_device = Buf::new(1, 4096);
    let host = vec![0f32; 64];
    // SAFETY: each call is refused before any memory is touched.
    unsafe {
        let rc = ncclAllReduce(small.ptr, small.ptr, 26, 7, 0, comms[0], streams[0]);
        assert_eq!(rc, NcclResult::INVALID_ARGUMENT);
        assert_contains(
            &last_nccl(std::ptr::null_mut()),
            &["ncclAllReduce sendbuff", "4 bytes past the end"],
        );
        // AllGather's recvbuff needs nranks * sendcount elements.
        let rc = ncclAllGather(small.ptr, small.ptr, 20, 7, comms[0], streams[0]);
        assert_eq!(rc, NcclResult::INVALID_ARGUMENT);
        assert_contains(
            &last_nccl(std::ptr::null_mut()),
            &["ncclAllGather recvbuff", "past the end"],
        );
        let rc = ncclReduceScatter(small.ptr, small.ptr, 20, 7, 0, comms[0], streams[0]);
        assert_eq!(rc, NcclResult::INVALID_ARGUMENT);
        assert_contains(
            &last_nccl(std::ptr::null_mut()),
            &["ncclReduceScatter sendbuff"],
        );
        let rc = ncclAllReduce(
            other_device.ptr,
            other_device.ptr,
            4,
            7,
            0,
            comms[0],
            streams[0],
        );
        assert_eq!(rc, NcclResult::INVALID_ARGUMENT);
        assert_contains(
            &last_nccl(std::ptr::null_mut()),
            &["device 1", "uses device 0"],
        );
        let rc = ncclSend(host.as_ptr().cast(), 64, 7, 1, comms[0], streams[0]);
        assert_eq!(rc, NcclResult::INVALID_ARGUMENT);
        assert_contains(
            &last_nccl(std::ptr::null_mut()),
            &["not in a live allocation"],
        );
        // Unknown enum values, ranks and streams.
        assert_eq!(
            ncclAllReduce(small.ptr, small.ptr, 1, 10, 0, comms[0], streams[0]),
            NcclResult::INVALID_ARGUMENT
        );
        assert_eq!(
            ncclAllReduce(small.ptr, small.ptr, 1, 7, 5, comms[0], streams[0]),
            NcclResult::INVALID_ARGUMENT
        );
        assert_eq!(
            ncclBroadcast(small.ptr, small.ptr, 1, 7, 2, comms[0], streams[0]),
            NcclResult::INVALID_ARGUMENT
        );
        assert_eq!(
            ncclAllReduce(small.ptr, small.ptr, 1, 7, 0, comms[0], streams[1]),
            NcclResult::INVALID_ARGUMENT
        );
        assert_contains(
            &last_nccl(std::ptr::null_mut()),
            &["stream belongs to device 1"],
        );
        assert_eq!(
            ncclAllReduce(
                small.ptr,
                small.ptr,
                1,
                7,
                0,
                std::ptr::null_mut(),
                streams[0]
            ),
            NcclResult::INVALID_ARGUMENT
        );
    }
    // Nothing was queued: the communicator still works.
    for &c in &comms {
        assert_eq!(async_error(c), NcclResult::SUCCESS);
    }
    destroy(&comms);
}

/// Like NCCL, two ranks of one communicator on one device are refused.
#[test]
fn two_ranks_on_one_device_are_invalid_usage() {
    let _serial = setup();
    let mut comms = [std::ptr::null_mut(); 2];
    // SAFETY: room for 2 handles; devlist of 2.
    let rc = unsafe { ncclCommInitAll(comms.as_mut_ptr(), 2, [1, 1].as_ptr()) };
    assert_eq!(rc, NcclResult::INVALID_USAGE);
    assert_contains(
        &last_nccl(std::ptr::null_mut()),
        &["device 1 twice", "duplicate GPU"],
    );
    // The same through ncclCommInitRank from two threads.
    let id = unique_id();
    let codes: Vec<(NcclResult, String)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|r| {
                s.spawn(move || {
                    set_device(2);
                    let mut c = std::ptr::null_mut();
                    // SAFETY: out-parameter; id by value.
                    let rc = unsafe { ncclCommInitRank(&mut c, 2, id, r) };
                    (rc, last_nccl(std::ptr::null_mut()))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rc, msg) in codes {
        assert_eq!(rc, NcclResult::INVALID_USAGE, "{msg}");
        assert_contains(&msg, &["ranks 0 and 1", "device 2"]);
    }
}

/// A receive whose count differs from the matching send fails on the receiver (and aborts the
/// sender); a group driving both ranks still returns.
#[test]
fn send_recv_count_mismatch_is_invalid_usage() {
    let _serial = setup();
    let (comms, streams) = init_all(&[0, 1]);
    let a = Buf::new(0, 400);
    let b = Buf::new(1, 400);
    group(|| {
        // SAFETY: 100 f32 / 50 f32 on the ranks' devices.
        unsafe {
            nccl_ok(ncclSend(a.ptr, 100, 7, 1, comms[0], streams[0]), "send");
            nccl_ok(ncclRecv(b.ptr, 50, 7, 0, comms[1], streams[1]), "recv");
        }
    });
    assert_eq!(sync(streams[1]), hipError_t::hipErrorLaunchFailure);
    assert_eq!(async_error(comms[1]), NcclResult::INVALID_USAGE);
    assert_contains(
        &last_nccl(comms[1]),
        &["rank 0 sends 100 float32", "receives 50 float32"],
    );
    assert_eq!(sync(streams[0]), hipError_t::hipErrorLaunchFailure);
    destroy(&comms);
}

/// ncclCommAbort on one rank makes the other's pending collective fail at once (well before
/// the watchdog), and destroy after an error returns.
#[test]
fn abort_releases_waiting_ranks() {
    let _serial = setup();
    let (comms, streams) = init_all(&[0, 1]);
    let buf = Buf::new(1, 64);
    // SAFETY: 16 f32 on rank 1's device.
    nccl_ok(
        unsafe { ncclAllReduce(buf.ptr, buf.ptr, 16, 7, 0, comms[1], streams[1]) },
        "queue",
    );
    let start = Instant::now();
    // SAFETY: a live comm.
    nccl_ok(unsafe { ncclCommAbort(comms[0]) }, "abort");
    assert_eq!(sync(streams[1]), hipError_t::hipErrorLaunchFailure);
    assert!(
        start.elapsed() < Duration::from_millis(TIMEOUT_MS),
        "{:?}",
        start.elapsed()
    );
    assert_contains(
        &last_nccl(comms[1]),
        &["aborted", "rank 0 called ncclCommAbort"],
    );
    // The aborted handle is gone.
    let mut n = 0;
    assert_eq!(
        // SAFETY: out-parameter; a stale handle is refused, not dereferenced.
        unsafe { ncclCommCount(comms[0], &mut n) },
        NcclResult::INVALID_ARGUMENT
    );
    destroy(&comms[1..]);
}

/// A made-up unique id and a bad watchdog value are refused with the fix named.
#[test]
fn foreign_unique_ids_are_refused() {
    let _serial = setup();
    let mut id = unique_id();
    id.internal[0] = b'Z' as std::ffi::c_char;
    set_device(0);
    let mut c = std::ptr::null_mut();
    assert_eq!(
        // SAFETY: out-parameter; id by value.
        unsafe { ncclCommInitRank(&mut c, 2, id, 0) },
        NcclResult::INVALID_ARGUMENT
    );
    assert_contains(&last_nccl(std::ptr::null_mut()), &["ncclGetUniqueId"]);
    assert_eq!(
        // SAFETY: as above.
        unsafe { ncclCommInitRank(&mut c, 2, unique_id(), 2) },
        NcclResult::INVALID_ARGUMENT
    );
    // SAFETY: group calls take no arguments.
    assert_eq!(unsafe { ncclGroupEnd() }, NcclResult::INVALID_USAGE);
}

/// A rank that has queued the collective but whose stream is still busy with earlier work
/// (here another communicator's collective, waiting for a late third rank) is waited for
/// beyond the watchdog time: it is slow, not missing.
#[test]
fn a_rank_that_queued_the_collective_is_waited_for_beyond_the_watchdog() {
    let _serial = setup();
    // Y has a long watchdog (read when a communicator is created), X the short one.
    std::env::set_var("HIPK_EMU_RCCL_TIMEOUT_MS", "10000");
    let (y, ys) = init_all(&[1, 2]);
    std::env::set_var("HIPK_EMU_RCCL_TIMEOUT_MS", TIMEOUT_MS.to_string());
    let (x, xs) = init_all(&[0, 1]);
    let bx: Vec<Buf> = (0..2)
        .map(|r| Buf::from_bytes(r, &[1u8 + r as u8; 8]))
        .collect();
    let by: Vec<Buf> = (1..3)
        .map(|d| Buf::from_bytes(d, &[10u8 * d as u8; 8]))
        .collect();
    let start = Instant::now();
    // SAFETY: 8 u8 on each rank's device.
    unsafe {
        // Device 1's stream: first Y's collective (waits for device 2), then X's.
        nccl_ok(
            ncclAllReduce(by[0].ptr, by[0].ptr, 8, 1, 0, y[0], xs[1]),
            "y rank 0",
        );
        nccl_ok(
            ncclAllReduce(bx[1].ptr, bx[1].ptr, 8, 1, 0, x[1], xs[1]),
            "x rank 1",
        );
        nccl_ok(
            ncclAllReduce(bx[0].ptr, bx[0].ptr, 8, 1, 0, x[0], xs[0]),
            "x rank 0",
        );
    }
    // X's rank 0 now waits for rank 1, which queued but cannot run before Y completes.
    std::thread::sleep(Duration::from_millis(TIMEOUT_MS * 3 / 2));
    // SAFETY: as above.
    nccl_ok(
        unsafe { ncclAllReduce(by[1].ptr, by[1].ptr, 8, 1, 0, y[1], ys[1]) },
        "y rank 1",
    );
    for s in [xs[0], xs[1], ys[1]] {
        assert_eq!(
            sync(s),
            hipError_t::hipSuccess,
            "{}",
            last_nccl(std::ptr::null_mut())
        );
    }
    assert!(start.elapsed() > Duration::from_millis(TIMEOUT_MS));
    assert_eq!(bx[0].read(), vec![3u8; 8]);
    assert_eq!(by[1].read(), vec![30u8; 8]);
    destroy(&x);
    destroy(&y);
}
