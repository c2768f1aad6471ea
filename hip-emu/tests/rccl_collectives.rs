//! The emulated RCCL's results against the CPU reference: every collective x op x data type,
//! in place and out of place, on 2, 3 and 4 emulated devices; count 0; results larger than a
//! slot (several rounds); group calls from one thread; ranks on threads; send/receive.
//! Everything ran on the CPU emulation.

mod rccl_util;

use std::ffi::c_int;

use hip_emu::rccl::api::*;
use hip_emu::rccl::shm::SLOT;
use rccl_util::*;

const DEVICES: usize = 4;

fn setup() -> std::sync::MutexGuard<'static, ()> {
    rccl_util::setup(DEVICES, 5000)
}

/// Inputs of `n` ranks, `count` elements each (rank-major).
fn inputs(dt: c_int, n: usize, count: usize, salt: usize) -> Vec<Vec<V>> {
    (0..n)
        .map(|r| (0..count).map(|i| input(dt, r, i, salt)).collect())
        .collect()
}

fn check(got: &[u8], want: &[V], dt: c_int, what: &str) {
    let got = decode(dt, got);
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g, w, "{what}: element {i} differs (got {g:?}, want {w:?})");
    }
}

/// AllReduce, Reduce (root n-1), ReduceScatter for every op and type, in and out of place.
fn reductions_on(n: usize) {
    let devices: Vec<i32> = (0..n as i32).collect();
    let (comms, streams) = init_all(&devices);
    let count = 37;
    for (dt, dname, size) in DTYPES {
        for (op, oname) in OPS {
            for in_place in [false, true] {
                let what = format!("n={n} {dname} {oname} in_place={in_place}");
                let xs = inputs(dt, n, count * n, op as usize);
                let want_all: Vec<V> = (0..count * n)
                    .map(|i| reference(dt, op, &xs.iter().map(|r| r[i]).collect::<Vec<_>>()))
                    .collect();
                let send: Vec<Buf> = (0..n)
                    .map(|r| Buf::from_bytes(devices[r], &encode(dt, &xs[r])))
                    .collect();
                let recv: Vec<Buf> = (0..n)
                    .map(|r| Buf::new(devices[r], count * n * size))
                    .collect();
                let rs_recv: Vec<Buf> =
                    (0..n).map(|r| Buf::new(devices[r], count * size)).collect();
                group(|| {
                    for r in 0..n {
                        let (s, d) = if in_place {
                            (send[r].ptr, send[r].ptr)
                        } else {
                            (send[r].ptr, recv[r].ptr)
                        };
                        // SAFETY: buffers of count*n elements on rank r's device.
                        let rc =
                            unsafe { ncclAllReduce(s, d, count * n, dt, op, comms[r], streams[r]) };
                        nccl_ok(rc, &what);
                    }
                });
                for r in 0..n {
                    hip_ok(sync(streams[r]), &what);
                    let out = if in_place { &send[r] } else { &recv[r] };
                    check(
                        &out.read(),
                        &want_all,
                        dt,
                        &format!("AllReduce {what} rank {r}"),
                    );
                }
                // ReduceScatter: rank r gets block r; in place means recvbuff = sendbuff + r*count.
                for (r, b) in send.iter().enumerate() {
                    b.write(&encode(dt, &xs[r]));
                }
                group(|| {
                    for r in 0..n {
                        let d = if in_place {
                            send[r].at(r * count, size)
                        } else {
                            rs_recv[r].ptr
                        };
                        // SAFETY: sendbuff n*count, recvbuff count elements on rank r's device.
                        let rc = unsafe {
                            ncclReduceScatter(send[r].ptr, d, count, dt, op, comms[r], streams[r])
                        };
                        nccl_ok(rc, &what);
                    }
                });
                for r in 0..n {
                    hip_ok(sync(streams[r]), &what);
                    let bytes = if in_place {
                        send[r].read()[r * count * size..(r + 1) * count * size].to_vec()
                    } else {
                        rs_recv[r].read()
                    };
                    check(
                        &bytes,
                        &want_all[r * count..(r + 1) * count],
                        dt,
                        &format!("ReduceScatter {what} rank {r}"),
                    );
                }
                // Reduce to the last rank; the others' recvbuff is untouched.
                let root = n - 1;
                for (r, b) in send.iter().enumerate() {
                    b.write(&encode(dt, &xs[r]));
                    recv[r].write(&vec![0xAB; count * n * size]);
                }
                group(|| {
                    for r in 0..n {
                        let d = if in_place { send[r].ptr } else { recv[r].ptr };
                        // SAFETY: as above.
                        let rc = unsafe {
                            ncclReduce(
                                send[r].ptr,
                                d,
                                count * n,
                                dt,
                                op,
                                root as c_int,
                                comms[r],
                                streams[r],
                            )
                        };
                        nccl_ok(rc, &what);
                    }
                });
                for r in 0..n {
                    hip_ok(sync(streams[r]), &what);
                    if r == root {
                        let out = if in_place { &send[r] } else { &recv[r] };
                        check(&out.read(), &want_all, dt, &format!("Reduce {what}"));
                    } else if !in_place {
                        assert!(
                            recv[r].read().iter().all(|&b| b == 0xAB),
                            "Reduce {what}: non-root {r} written"
                        );
                    }
                }
            }
        }
    }
    destroy(&comms);
}

#[test]
fn reductions_on_2_devices() {
    let _serial = setup();
    reductions_on(2);
}

#[test]
fn reductions_on_3_devices() {
    let _serial = setup();
    reductions_on(3);
}

#[test]
fn reductions_on_4_devices() {
    let _serial = setup();
    reductions_on(4);
}

/// AllGather and Broadcast (every root) for every type, in and out of place, 2..4 devices.
#[test]
fn gathers_and_broadcasts() {
    let _serial = setup();
    for n in 2..=DEVICES {
        let devices: Vec<i32> = (0..n as i32).rev().collect(); // rank r on device n-1-r
        let (comms, streams) = init_all(&devices);
        let count = 29;
        for (dt, dname, size) in DTYPES {
            for in_place in [false, true] {
                let what = format!("n={n} {dname} in_place={in_place}");
                let xs = inputs(dt, n, count, 3);
                let want: Vec<V> = xs.iter().flatten().copied().collect();
                let recv: Vec<Buf> = (0..n)
                    .map(|r| Buf::new(devices[r], n * count * size))
                    .collect();
                let send: Vec<Buf> = (0..n)
                    .map(|r| Buf::from_bytes(devices[r], &encode(dt, &xs[r])))
                    .collect();
                for (r, b) in recv.iter().enumerate() {
                    if in_place {
                        let mut bytes = vec![0u8; n * count * size];
                        bytes[r * count * size..(r + 1) * count * size]
                            .copy_from_slice(&encode(dt, &xs[r]));
                        b.write(&bytes);
                    }
                }
                group(|| {
                    for r in 0..n {
                        let s = if in_place {
                            recv[r].at(r * count, size)
                        } else {
                            send[r].ptr
                        };
                        // SAFETY: sendbuff count, recvbuff n*count elements on rank r's device.
                        let rc = unsafe {
                            ncclAllGather(s, recv[r].ptr, count, dt, comms[r], streams[r])
                        };
                        nccl_ok(rc, &what);
                    }
                });
                for r in 0..n {
                    hip_ok(sync(streams[r]), &what);
                    check(
                        &recv[r].read(),
                        &want,
                        dt,
                        &format!("AllGather {what} rank {r}"),
                    );
                }
                for root in 0..n {
                    let bufs: Vec<Buf> = (0..n)
                        .map(|r| Buf::from_bytes(devices[r], &encode(dt, &xs[r])))
                        .collect();
                    let outs: Vec<Buf> =
                        (0..n).map(|r| Buf::new(devices[r], count * size)).collect();
                    group(|| {
                        for r in 0..n {
                            let d = if in_place { bufs[r].ptr } else { outs[r].ptr };
                            // SAFETY: count elements on rank r's device.
                            let rc = unsafe {
                                ncclBroadcast(
                                    bufs[r].ptr,
                                    d,
                                    count,
                                    dt,
                                    root as c_int,
                                    comms[r],
                                    streams[r],
                                )
                            };
                            nccl_ok(rc, &what);
                        }
                    });
                    for r in 0..n {
                        hip_ok(sync(streams[r]), &what);
                        let out = if in_place { &bufs[r] } else { &outs[r] };
                        check(
                            &out.read(),
                            &xs[root],
                            dt,
                            &format!("Broadcast root {root} {what} rank {r}"),
                        );
                    }
                }
            }
        }
        destroy(&comms);
    }
}

/// Count 0 completes (null buffers allowed); a collective larger than a slot runs in rounds.
#[test]
fn count_zero_and_several_rounds() {
    let _serial = setup();
    let (comms, streams) = init_all(&[0, 1, 2]);
    group(|| {
        for r in 0..3 {
            // SAFETY: count 0: no buffer is touched.
            let rc = unsafe {
                ncclAllReduce(
                    std::ptr::null(),
                    std::ptr::null_mut(),
                    0,
                    7,
                    0,
                    comms[r],
                    streams[r],
                )
            };
            nccl_ok(rc, "count 0");
        }
    });
    // f32 sum of 2.5 slots per rank: three rounds.
    let count = SLOT / 4 * 5 / 2 + 3;
    let bufs: Vec<Buf> = (0..3usize)
        .map(|r| {
            let v: Vec<f32> = (0..count).map(|i| (i % 1000) as f32 + r as f32).collect();
            Buf::from_bytes(
                r as i32,
                &v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<_>>(),
            )
        })
        .collect();
    group(|| {
        for r in 0..3 {
            // SAFETY: count f32 on rank r's device, in place.
            let rc = unsafe {
                ncclAllReduce(bufs[r].ptr, bufs[r].ptr, count, 7, 0, comms[r], streams[r])
            };
            nccl_ok(rc, "large");
        }
    });
    for r in 0..3 {
        hip_ok(sync(streams[r]), "large");
        let got = bufs[r].read();
        for (i, b) in got.chunks_exact(4).enumerate() {
            let want = 3.0 * (i % 1000) as f32 + 3.0;
            assert_eq!(
                f32::from_le_bytes(b.try_into().unwrap()),
                want,
                "element {i}"
            );
        }
    }
    destroy(&comms);
}

/// Ranks on their own threads joined through ncclGetUniqueId + ncclCommInitRank, no group;
/// collectives ordered with other stream work (a memset queued before, a copy after).
#[test]
fn ranks_on_threads_with_init_rank() {
    let _serial = setup();
    let id = unique_id();
    let n: usize = 3;
    let results: Vec<Vec<u8>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|r| {
                s.spawn(move || {
                    let dev = r as i32 + 1;
                    set_device(dev);
                    let mut comm = std::ptr::null_mut();
                    // SAFETY: out-parameter; id by value.
                    nccl_ok(
                        unsafe { ncclCommInitRank(&mut comm, n as c_int, id, r as c_int) },
                        "init",
                    );
                    let (mut count, mut rank, mut device) = (0, 0, 0);
                    // SAFETY: out-parameters of a live comm.
                    unsafe {
                        nccl_ok(ncclCommCount(comm, &mut count), "count");
                        nccl_ok(ncclCommUserRank(comm, &mut rank), "rank");
                        nccl_ok(ncclCommCuDevice(comm, &mut device), "device");
                    }
                    assert_eq!((count, rank, device), (n as c_int, r as c_int, dev));
                    let st = stream(dev);
                    let buf = Buf::from_bytes(dev, &[(r as u8 + 1) * 10; 16]);
                    let out = Buf::new(dev, 16);
                    // SAFETY: 16 u8 on this rank's device, all queued on one stream.
                    unsafe {
                        hip_ok(
                            hip_emu::runtime::api_memory::hipMemsetAsync(
                                buf.ptr,
                                r as i32 + 1,
                                8,
                                st,
                            ),
                            "memset",
                        );
                        nccl_ok(
                            ncclAllReduce(buf.ptr, out.ptr, 16, 1, 0, comm, st),
                            "allreduce",
                        );
                        hip_ok(
                            hip_emu::runtime::api_memory::hipMemsetAsync(out.ptr, 0, 4, st),
                            "memset after",
                        );
                    }
                    hip_ok(sync(st), "sync");
                    // SAFETY: a live comm.
                    nccl_ok(unsafe { ncclCommDestroy(comm) }, "destroy");
                    out.read()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // First 8 bytes: memset values 1+2+3; next 8: 10+20+30; the first 4 zeroed afterwards.
    let want: Vec<u8> = [0u8; 4].into_iter().chain([6; 4]).chain([60; 8]).collect();
    for r in results {
        assert_eq!(r, want);
    }
}

/// ncclCommInitRank for every rank from one thread inside a group, then a collective per rank
/// from the same thread without a group (queuing never blocks the host).
#[test]
fn init_rank_in_a_group_from_one_thread() {
    let _serial = setup();
    let id = unique_id();
    let n = 4;
    let mut comms = vec![std::ptr::null_mut(); n];
    group(|| {
        for (r, c) in comms.iter_mut().enumerate() {
            set_device(r as i32);
            // SAFETY: out-parameter; id by value.
            nccl_ok(
                unsafe { ncclCommInitRank(c, n as c_int, id, r as c_int) },
                "init in group",
            );
        }
    });
    let streams: Vec<_> = (0..n as i32).map(stream).collect();
    let bufs: Vec<Buf> = (0..n)
        .map(|r| Buf::from_bytes(r as i32, &(r as i64 * 1000 - 7).to_le_bytes()))
        .collect();
    for r in 0..n {
        // SAFETY: one i64 on rank r's device.
        nccl_ok(
            unsafe { ncclAllReduce(bufs[r].ptr, bufs[r].ptr, 1, 4, 3, comms[r], streams[r]) },
            "min",
        );
    }
    for r in 0..n {
        hip_ok(sync(streams[r]), "sync");
        assert_eq!(i64::from_le_bytes(bufs[r].read().try_into().unwrap()), -7);
    }
    destroy(&comms);
}

/// Send/receive: a ring shift and pairwise swaps (each rank sends to and receives from the same
/// peer in one group), with a transfer larger than a mailbox (several chunks) and count 0.
#[test]
fn send_recv_ring_and_swaps() {
    let _serial = setup();
    let n = 4;
    let (comms, streams) = init_all(&[0, 1, 2, 3]);
    let count = SLOT / 4 / 4 * 3 + 5; // > one sub-slot of f32 with 4 ranks
    let data = |r: usize| -> Vec<u8> {
        (0..count)
            .flat_map(|i| ((r * 1_000_000 + i) as f32).to_le_bytes())
            .collect()
    };
    let send: Vec<Buf> = (0..n)
        .map(|r| Buf::from_bytes(r as i32, &data(r)))
        .collect();
    let recv: Vec<Buf> = (0..n).map(|r| Buf::new(r as i32, count * 4)).collect();
    group(|| {
        for r in 0..n {
            let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
            // SAFETY: count f32 on rank r's device.
            unsafe {
                nccl_ok(
                    ncclSend(send[r].ptr, count, 7, next as c_int, comms[r], streams[r]),
                    "send",
                );
                nccl_ok(
                    ncclRecv(recv[r].ptr, count, 7, prev as c_int, comms[r], streams[r]),
                    "recv",
                );
                nccl_ok(
                    ncclSend(std::ptr::null(), 0, 7, next as c_int, comms[r], streams[r]),
                    "send 0",
                );
                nccl_ok(
                    ncclRecv(
                        std::ptr::null_mut(),
                        0,
                        7,
                        prev as c_int,
                        comms[r],
                        streams[r],
                    ),
                    "recv 0",
                );
            }
        }
    });
    for r in 0..n {
        hip_ok(sync(streams[r]), "ring");
        assert_eq!(recv[r].read(), data((r + n - 1) % n), "ring: rank {r}");
    }
    // Swaps 0<->1 and 2<->3, receive posted before send on odd ranks.
    group(|| {
        for r in 0..n {
            let peer = r ^ 1;
            // SAFETY: as above.
            unsafe {
                if r % 2 == 1 {
                    nccl_ok(
                        ncclRecv(recv[r].ptr, count, 7, peer as c_int, comms[r], streams[r]),
                        "recv",
                    );
                }
                nccl_ok(
                    ncclSend(send[r].ptr, count, 7, peer as c_int, comms[r], streams[r]),
                    "send",
                );
                if r % 2 == 0 {
                    nccl_ok(
                        ncclRecv(recv[r].ptr, count, 7, peer as c_int, comms[r], streams[r]),
                        "recv",
                    );
                }
            }
        }
    });
    for r in 0..n {
        hip_ok(sync(streams[r]), "swap");
        assert_eq!(recv[r].read(), data(r ^ 1), "swap: rank {r}");
    }
    // Many small exchanges queued back to back: any lost wake-up would surface as a watchdog
    // error (5 s) instead of a pass.
    let start = std::time::Instant::now();
    for _ in 0..100 {
        group(|| {
            for r in 0..n {
                let peer = (r ^ 2) as c_int;
                // SAFETY: 3 f32 on rank r's device.
                unsafe {
                    nccl_ok(
                        ncclSend(send[r].ptr, 3, 7, peer, comms[r], streams[r]),
                        "send",
                    );
                    nccl_ok(
                        ncclRecv(recv[r].ptr, 3, 7, peer, comms[r], streams[r]),
                        "recv",
                    );
                }
            }
        });
    }
    for r in 0..n {
        hip_ok(sync(streams[r]), "many swaps");
        assert_eq!(
            recv[r].read()[..12],
            data(r ^ 2)[..12],
            "many swaps: rank {r}"
        );
    }
    assert!(start.elapsed() < std::time::Duration::from_secs(5));
    destroy(&comms);
}

#[test]
fn version_and_error_strings() {
    let _serial = setup();
    let mut v = 0;
    // SAFETY: out-parameter.
    nccl_ok(unsafe { ncclGetVersion(&mut v) }, "version");
    assert_eq!(v, 21804);
    assert!(v >= 21000, "a version with ncclAvg");
    // SAFETY: returns a static string.
    let s = unsafe { std::ffi::CStr::from_ptr(ncclGetErrorString(hip_emu::rccl::NcclResult(5))) };
    assert_eq!(
        s.to_str().unwrap(),
        "invalid usage (run with NCCL_DEBUG=WARN for details)"
    );
}

/// One group holding calls of one communicator on two streams: they run as one command on the
/// first call's stream, after earlier work of both streams, and later work of the second stream
/// waits for it.
#[test]
fn a_group_spanning_two_streams_of_a_rank_orders_both() {
    let _serial = setup();
    let (comms, streams) = init_all(&[0, 1]);
    let second: Vec<_> = (0..2).map(stream).collect();
    let a: Vec<Buf> = (0..2).map(|r| Buf::from_bytes(r, &[1u8; 16])).collect();
    let b: Vec<Buf> = (0..2).map(|r| Buf::from_bytes(r, &[0u8; 16])).collect();
    let gathered: Vec<Buf> = (0..2).map(|r| Buf::new(r, 32)).collect();
    // SAFETY: 16-byte buffers (32 for the gather) on each rank's device.
    unsafe {
        for r in 0..2 {
            // Earlier work on the second stream: the grouped command must wait for it.
            hip_ok(
                hip_emu::runtime::api_memory::hipMemsetAsync(b[r].ptr, 5 + r as i32, 16, second[r]),
                "memset",
            );
        }
        group(|| {
            for r in 0..2 {
                nccl_ok(
                    ncclAllReduce(a[r].ptr, a[r].ptr, 16, 1, 0, comms[r], streams[r]),
                    "ar",
                );
                nccl_ok(
                    ncclAllGather(b[r].ptr, gathered[r].ptr, 16, 1, comms[r], second[r]),
                    "ag",
                );
            }
        });
        for r in 0..2 {
            // Later work on the second stream runs after the grouped command.
            hip_ok(
                hip_emu::runtime::api_memory::hipMemsetAsync(b[r].ptr, 0, 16, second[r]),
                "memset after",
            );
        }
    }
    for r in 0..2 {
        hip_ok(sync(second[r]), "second stream");
        assert_eq!(
            a[r].read(),
            vec![2u8; 16],
            "all-reduce on the first stream, rank {r}"
        );
        let want: Vec<u8> = [5u8; 16].into_iter().chain([6u8; 16]).collect();
        assert_eq!(
            gathered[r].read(),
            want,
            "all-gather on the second stream, rank {r}"
        );
    }
    destroy(&comms);
}
