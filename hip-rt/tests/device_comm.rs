//! RCCL collectives through `hip_rt::comm` on several devices: every op × dtype × in/out of
//! place against a CPU computation on 2, 3 and 4 devices, two processes joined through a unique
//! id, the allocator's stream recording, and the failure cases as typed errors.
//! `cargo test -p hip-rt --features device --test device_comm`.
//!
//! On hip-emu (HIPK_HIP_LIBRARY names libhip_emu.so) the test sets `HIPK_EMU_DEVICES=4` and
//! `HIPK_RCCL_LIBRARY` to the same library unless they are set: hip-emu's emulated RCCL then
//! runs the collectives on the CPU. On real devices it uses the installed RCCL and as many
//! devices as are visible (at least 2). Ran on hip-emu only, never on a GPU.
#![cfg(feature = "device")]

use std::sync::Once;
use std::time::Duration;

use half::{bf16, f16};
use hip_rt::comm::{group, CommElement, CommError, ReduceOp, UniqueId};
use hip_rt::{Comm, Device, DeviceBuffer, Error, Stream, StreamOptions};

fn setup() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let hip = std::env::var("HIPK_HIP_LIBRARY").unwrap_or_default();
        if hip.ends_with("libhip_emu.so") {
            if std::env::var_os("HIPK_EMU_DEVICES").is_none() {
                std::env::set_var("HIPK_EMU_DEVICES", "4");
            }
            if std::env::var_os("HIPK_RCCL_LIBRARY").is_none() {
                std::env::set_var("HIPK_RCCL_LIBRARY", &hip);
            }
        }
    });
}

/// The tests run one at a time: hip-emu runs each device's queued work in order, so a
/// collective left waiting for a rank (the failure tests) would stall another test's work on the
/// same device until its watchdog fires.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The first `n` devices, or a panic saying what the test needs.
fn devices(n: usize) -> Vec<Device> {
    setup();
    let count = Device::count().unwrap_or_else(|e| panic!("device_comm needs HIP devices: {e}"));
    assert!(
        count as usize >= n,
        "device_comm needs {n} devices and {count} are visible (on hip-emu: HIPK_EMU_DEVICES=4)"
    );
    (0..n as i32)
        .map(|i| Device::get(i).expect("device"))
        .collect()
}

/// The device counts tested: 2, 3, 4 (fewer when fewer real devices exist).
fn world_sizes() -> Vec<usize> {
    setup();
    let count = Device::count().expect("devices") as usize;
    assert!(
        count >= 2,
        "device_comm needs at least 2 devices, {count} visible"
    );
    (2..=count.min(4)).collect()
}

fn stream(d: &Device) -> Stream {
    Stream::new(d, StreamOptions::default()).expect("stream")
}

/// Element types under test, converted through f64 (every value used is a small integer, exact
/// in every type).
trait Elem: CommElement + PartialEq + std::fmt::Debug {
    fn of(v: f64) -> Self;
    fn f(self) -> f64;
    /// Relative tolerance of an average (two units in the last place; zero for integers, whose
    /// average of these inputs is exact).
    const AVG_TOL: f64;
}
macro_rules! elem {
    ($t:ty, $of:expr, $f:expr, $tol:expr) => {
        impl Elem for $t {
            fn of(v: f64) -> Self {
                $of(v)
            }
            fn f(self) -> f64 {
                $f(self)
            }
            const AVG_TOL: f64 = $tol;
        }
    };
}
elem!(f32, |v| v as f32, f64::from, 2.0 * f32::EPSILON as f64);
elem!(f16, f16::from_f64, f16::to_f64, 2.0 * 0.000_976_562_5);
elem!(bf16, bf16::from_f64, bf16::to_f64, 2.0 * 0.007_812_5);
elem!(i32, |v| v as i32, f64::from, 0.0);
elem!(u8, |v| v as u8, f64::from, 0.0);

/// Rank `r`'s input at `i`: 1..=3 (products over 4 ranks stay <= 81, exact in u8 and bf16).
/// For averages, 2..=4 shifted by a per-rank offset summing to zero, so the mean is exact.
fn input(r: usize, i: usize, world: usize, op: ReduceOp) -> f64 {
    if op == ReduceOp::Avg {
        let shift = if world % 2 == 1 && r == world - 1 {
            0.0
        } else if r % 2 == 0 {
            1.0
        } else {
            -1.0
        };
        return ((i % 3) + 2) as f64 + shift;
    }
    ((r + i) % 3 + 1) as f64
}

fn reduce_cpu(values: impl Iterator<Item = f64>, op: ReduceOp, world: usize) -> f64 {
    let v: Vec<f64> = values.collect();
    match op {
        ReduceOp::Sum => v.iter().sum(),
        ReduceOp::Prod => v.iter().product(),
        ReduceOp::Max => v.iter().cloned().fold(f64::MIN, f64::max),
        ReduceOp::Min => v.iter().cloned().fold(f64::MAX, f64::min),
        ReduceOp::Avg => v.iter().sum::<f64>() / world as f64,
    }
}

fn check<T: Elem>(what: &str, got: &[T], want: &[f64], op: ReduceOp) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = if op == ReduceOp::Avg {
            (g.f() - w).abs() <= w.abs() * T::AVG_TOL
        } else {
            g.f() == *w
        };
        assert!(ok, "{what}: element {i} is {g:?}, want {w}");
    }
}

/// Which collective a round runs.
#[derive(Debug, Clone, Copy)]
enum Coll {
    AllReduce(ReduceOp),
    ReduceScatter(ReduceOp),
    AllGather,
    Broadcast,
    Reduce(ReduceOp),
}

const COUNT: usize = 37; // per-rank count: odd, not a multiple of any vector width

fn round<T: Elem>(comms: &[Comm], streams: &[Stream], coll: Coll, in_place: bool) {
    let world = comms.len();
    let op = match coll {
        Coll::AllReduce(op) | Coll::ReduceScatter(op) | Coll::Reduce(op) => op,
        Coll::AllGather | Coll::Broadcast => ReduceOp::Sum,
    };
    let root = world - 1;
    // Per-rank input lengths and host inputs.
    let send_len = match coll {
        Coll::ReduceScatter(_) => COUNT * world,
        _ => COUNT,
    };
    let recv_len = match coll {
        Coll::AllGather => COUNT * world,
        _ => COUNT,
    };
    let host: Vec<Vec<f64>> = (0..world)
        .map(|r| (0..send_len).map(|i| input(r, i, world, op)).collect())
        .collect();
    // In place, each rank's buffer holds its input where RCCL reads it.
    let bufs: Vec<(DeviceBuffer<T>, DeviceBuffer<T>)> = (0..world)
        .map(|r| {
            let s = &streams[r];
            let send: Vec<T> = host[r].iter().map(|&v| T::of(v)).collect();
            let main_len = if in_place {
                send_len.max(recv_len)
            } else {
                recv_len
            };
            let mut main: Vec<T> = vec![T::of(0.0); main_len];
            if in_place {
                match coll {
                    Coll::AllGather => main[r * COUNT..(r + 1) * COUNT].copy_from_slice(&send),
                    _ => main[..send_len].copy_from_slice(&send),
                }
            }
            (
                DeviceBuffer::from_slice(s, &send).unwrap(),
                DeviceBuffer::from_slice(s, &main).unwrap(),
            )
        })
        .collect();
    let mut bufs = bufs;
    group(|| {
        for (r, (c, (send, main))) in comms.iter().zip(bufs.iter_mut()).enumerate() {
            let s = &streams[r];
            match (coll, in_place) {
                (Coll::AllReduce(op), false) => c.all_reduce(send, main, op, s)?,
                (Coll::AllReduce(op), true) => c.all_reduce_in_place(main, op, s)?,
                (Coll::ReduceScatter(op), false) => c.reduce_scatter(send, main, op, s)?,
                (Coll::ReduceScatter(op), true) => c.reduce_scatter_in_place(main, op, s)?,
                (Coll::AllGather, false) => c.all_gather(send, main, s)?,
                (Coll::AllGather, true) => c.all_gather_in_place(main, s)?,
                (Coll::Broadcast, false) => c.broadcast(send, main, root, s)?,
                (Coll::Broadcast, true) => c.broadcast_in_place(main, root, s)?,
                (Coll::Reduce(op), false) => c.reduce(send, main, op, root, s)?,
                (Coll::Reduce(op), true) => c.reduce_in_place(main, op, root, s)?,
            }
        }
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{coll:?} in_place={in_place} world={world}: {e}"));
    for c in comms {
        c.wait()
            .unwrap_or_else(|e| panic!("{coll:?} world={world}: {e}"));
    }
    let reduced: Vec<f64> = (0..send_len)
        .map(|i| reduce_cpu(host.iter().map(|h| h[i]), op, world))
        .collect();
    for (r, (_, main)) in bufs.iter().enumerate() {
        let got = main.to_vec(&streams[r]).unwrap();
        let what = format!(
            "{coll:?} {} in_place={in_place} world={world} rank {r}",
            std::any::type_name::<T>()
        );
        match coll {
            Coll::AllReduce(op) => check(&what, &got[..COUNT], &reduced, op),
            Coll::ReduceScatter(op) => {
                let at = if in_place { r * COUNT } else { 0 };
                let want = &reduced[r * COUNT..(r + 1) * COUNT];
                check(&what, &got[at..at + COUNT], want, op)
            }
            Coll::AllGather => {
                let want: Vec<f64> = host.iter().flatten().copied().collect();
                check(&what, &got, &want, ReduceOp::Sum)
            }
            Coll::Broadcast => check(&what, &got, &host[root], ReduceOp::Sum),
            Coll::Reduce(op) if r == root => check(&what, &got, &reduced, op),
            Coll::Reduce(_) => {}
        }
    }
}

fn every_collective<T: Elem>(comms: &[Comm], streams: &[Stream]) {
    let mut colls = vec![Coll::AllGather, Coll::Broadcast];
    for op in ReduceOp::ALL {
        colls.extend([
            Coll::AllReduce(op),
            Coll::ReduceScatter(op),
            Coll::Reduce(op),
        ]);
    }
    for coll in colls {
        for in_place in [false, true] {
            round::<T>(comms, streams, coll, in_place);
        }
    }
}

#[test]
fn every_op_dtype_and_placement_matches_the_cpu_on_2_3_4_devices() {
    let _serial = serial();
    for world in world_sizes() {
        let devs = devices(world);
        let comms = Comm::init_all(&devs).expect("init_all");
        for (r, c) in comms.iter().enumerate() {
            assert_eq!((c.rank(), c.world()), (r, world));
            assert_eq!(c.user_rank().unwrap(), r);
            assert_eq!(c.count().unwrap(), world);
            assert_eq!(c.rccl_device().unwrap(), devs[r].ordinal());
        }
        let streams: Vec<Stream> = devs.iter().map(stream).collect();
        every_collective::<f32>(&comms, &streams);
        every_collective::<f16>(&comms, &streams);
        every_collective::<bf16>(&comms, &streams);
        every_collective::<i32>(&comms, &streams);
        every_collective::<u8>(&comms, &streams);
        drop(comms);
        for d in &devs {
            d.check_err().expect("no error dropping the communicators");
        }
    }
}

#[test]
fn send_and_recv_swap_buffers_between_two_ranks() {
    let _serial = serial();
    let devs = devices(2);
    let comms = Comm::init_all(&devs).unwrap();
    let streams: Vec<Stream> = devs.iter().map(stream).collect();
    let data: Vec<Vec<i32>> = vec![(0..100).collect(), (1000..1100).collect()];
    let send: Vec<DeviceBuffer<i32>> = (0..2)
        .map(|r| DeviceBuffer::from_slice(&streams[r], &data[r]).unwrap())
        .collect();
    let mut recv: Vec<DeviceBuffer<i32>> = (0..2)
        .map(|r| DeviceBuffer::zeroed(&streams[r], 100).unwrap())
        .collect();
    group(|| {
        for r in 0..2 {
            comms[r].send(&send[r], 1 - r, &streams[r])?;
            comms[r].recv(&mut recv[r], 1 - r, &streams[r])?;
        }
        Ok(())
    })
    .unwrap();
    for c in &comms {
        c.wait().unwrap();
    }
    for r in 0..2 {
        assert_eq!(recv[r].to_vec(&streams[r]).unwrap(), data[1 - r]);
    }
}

const CHILD_VAR: &str = "HIPK_COMM_TEST_CHILD";

/// One rank of the two-process test: all-reduce (sum) of rank-dependent data on device `rank`.
fn two_process_rank(rank: usize, id: &UniqueId) {
    let devs = devices(2);
    let comm = Comm::init_rank(&devs[rank], 2, rank, id).expect("init_rank");
    comm.set_timeout(Duration::from_secs(60));
    assert_eq!(
        (comm.user_rank().unwrap(), comm.count().unwrap()),
        (rank, 2)
    );
    let s = stream(&devs[rank]);
    let host: Vec<f32> = (0..1000).map(|i| (i % 7 + rank * 10) as f32).collect();
    let mut buf = DeviceBuffer::from_slice(&s, &host).unwrap();
    comm.all_reduce_in_place(&mut buf, ReduceOp::Sum, &s)
        .unwrap();
    comm.wait().unwrap();
    let want: Vec<f32> = (0..1000).map(|i| (2 * (i % 7) + 10) as f32).collect();
    assert_eq!(buf.to_vec(&s).unwrap(), want, "rank {rank}");
}

#[test]
fn two_processes_join_through_a_unique_id() {
    let _serial = serial();
    if let Ok(hex) = std::env::var(CHILD_VAR) {
        two_process_rank(1, &hex.parse().expect("the parent's id"));
        return;
    }
    setup();
    let id = UniqueId::new().expect("ncclGetUniqueId");
    assert_eq!(UniqueId::from_hex(&id.to_hex()).unwrap(), id);
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "two_processes_join_through_a_unique_id",
            "--exact",
            "--test-threads=1",
            "--nocapture",
        ])
        .env(CHILD_VAR, id.to_hex())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn rank 1");
    two_process_rank(0, &id);
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "rank 1 failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_buffer_freed_during_a_collective_is_not_reused_before_it_ends() {
    let _serial = serial();
    let devs = devices(2);
    let comms = Comm::init_all(&devs).unwrap();
    let alloc_stream = stream(&devs[0]);
    let coll_stream = stream(&devs[0]);
    let s1 = stream(&devs[1]);
    let x = DeviceBuffer::<f32>::from_slice(&alloc_stream, &[1.0; 4096]).unwrap();
    let x_ptr = x.device_ptr();
    let mut out0 = DeviceBuffer::<f32>::zeroed(&coll_stream, 4096).unwrap();
    // Rank 0 queues its part; the collective cannot end before rank 1 joins.
    comms[0]
        .all_reduce(&x, &mut out0, ReduceOp::Sum, &coll_stream)
        .unwrap();
    drop(x);
    let y = DeviceBuffer::<f32>::alloc(&alloc_stream, 4096).unwrap();
    assert_ne!(
        y.device_ptr(),
        x_ptr,
        "the allocator handed out a block a queued collective still reads"
    );
    let inp1 = DeviceBuffer::<f32>::from_slice(&s1, &[2.0; 4096]).unwrap();
    let mut out1 = DeviceBuffer::<f32>::zeroed(&s1, 4096).unwrap();
    comms[1]
        .all_reduce(&inp1, &mut out1, ReduceOp::Sum, &s1)
        .unwrap();
    for c in &comms {
        c.wait().unwrap();
    }
    assert_eq!(out0.to_vec(&coll_stream).unwrap(), vec![3.0; 4096]);
    assert_eq!(out1.to_vec(&s1).unwrap(), vec![3.0; 4096]);
}

fn comm_err(e: Error) -> CommError {
    match e {
        Error::Comm(c) => c,
        other => panic!("not a communicator error: {other}"),
    }
}

#[test]
fn bad_lengths_roots_devices_and_sets_are_typed_errors() {
    let _serial = serial();
    let devs = devices(2);
    let comms = Comm::init_all(&devs).unwrap();
    let s0 = stream(&devs[0]);
    let s1 = stream(&devs[1]);
    let a = DeviceBuffer::<f32>::zeroed(&s0, 8).unwrap();
    let mut b = DeviceBuffer::<f32>::zeroed(&s0, 9).unwrap();
    let e = comm_err(
        comms[0]
            .all_reduce(&a, &mut b, ReduceOp::Sum, &s0)
            .unwrap_err(),
    );
    assert!(
        matches!(
            e,
            CommError::Count {
                found: 9,
                expected: 8,
                ..
            }
        ),
        "{e}"
    );
    let e = comm_err(
        comms[0]
            .reduce_scatter(&a, &mut b, ReduceOp::Sum, &s0)
            .unwrap_err(),
    );
    assert!(
        matches!(
            e,
            CommError::Count {
                found: 8,
                expected: 18,
                ..
            }
        ),
        "{e}"
    );
    let mut odd = DeviceBuffer::<f32>::zeroed(&s0, 7).unwrap();
    let e = comm_err(comms[0].all_gather_in_place(&mut odd, &s0).unwrap_err());
    assert!(e.to_string().contains("multiple of world (2)"), "{e}");
    let e = comm_err(comms[0].broadcast_in_place(&mut b, 2, &s0).unwrap_err());
    assert!(
        matches!(
            e,
            CommError::Rank {
                value: 2,
                world: 2,
                ..
            }
        ),
        "{e}"
    );
    let e = comms[0]
        .all_reduce_in_place(&mut b, ReduceOp::Sum, &s1)
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::WrongDevice {
                expected: 0,
                found: 1,
                ..
            }
        ),
        "{e}"
    );
    let e = comm_err(Comm::init_all(&[devs[0].clone(), devs[0].clone()]).unwrap_err());
    assert!(matches!(e, CommError::Devices(_)), "{e}");
    let e = comm_err(Comm::init_all(&[]).unwrap_err());
    assert!(matches!(e, CommError::Devices(_)), "{e}");
    // None of these reached RCCL: the communicators still work.
    let mut c = DeviceBuffer::<f32>::from_slice(&s1, &[1.0; 8]).unwrap();
    let mut b8 = DeviceBuffer::<f32>::from_slice(&s0, &[1.0; 8]).unwrap();
    group(|| {
        comms[0].all_reduce_in_place(&mut b8, ReduceOp::Sum, &s0)?;
        comms[1].all_reduce_in_place(&mut c, ReduceOp::Sum, &s1)
    })
    .unwrap();
    comms[0].wait().unwrap();
    comms[1].wait().unwrap();
    assert_eq!(b8.to_vec(&s0).unwrap(), vec![2.0; 8]);
}

#[test]
fn a_rank_that_never_joins_times_out_naming_the_collective_and_aborts() {
    let _serial = serial();
    let devs = devices(2);
    let comms = Comm::init_all(&devs).unwrap();
    let s0 = stream(&devs[0]);
    comms[0].set_timeout(Duration::from_millis(300));
    let mut buf = DeviceBuffer::<f32>::zeroed(&s0, 64).unwrap();
    comms[0]
        .all_reduce_in_place(&mut buf, ReduceOp::Sum, &s0)
        .unwrap();
    let start = std::time::Instant::now();
    let e = comm_err(comms[0].wait().unwrap_err());
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "{:?}",
        start.elapsed()
    );
    match &e {
        CommError::Timeout {
            op,
            rank: 0,
            world: 2,
            ..
        }
        | CommError::Async {
            op,
            rank: 0,
            world: 2,
            ..
        } => {
            assert_eq!(*op, "ncclAllReduce", "{e}")
        }
        other => panic!("not a timeout: {other}"),
    }
    // The communicator is aborted: later calls say so instead of hanging.
    let e = comm_err(
        comms[0]
            .all_reduce_in_place(&mut buf, ReduceOp::Sum, &s0)
            .unwrap_err(),
    );
    assert!(matches!(e, CommError::Aborted { rank: 0, .. }), "{e}");
    comms[1].set_timeout(Duration::from_millis(300));
    drop(comms); // never panics
}

#[test]
fn ranks_that_disagree_on_the_count_get_a_typed_error() {
    let _serial = serial();
    let devs = devices(2);
    let comms = Comm::init_all(&devs).unwrap();
    let streams: Vec<Stream> = devs.iter().map(stream).collect();
    for c in &comms {
        c.set_timeout(Duration::from_secs(20));
    }
    let mut bufs = [
        DeviceBuffer::<f32>::zeroed(&streams[0], 8).unwrap(),
        DeviceBuffer::<f32>::zeroed(&streams[1], 9).unwrap(),
    ];
    let queued = group(|| {
        for (r, b) in bufs.iter_mut().enumerate() {
            comms[r].all_reduce_in_place(b, ReduceOp::Sum, &streams[r])?;
        }
        Ok(())
    });
    let errors: Vec<CommError> = match queued {
        Err(e) => vec![comm_err(e)],
        Ok(()) => comms
            .iter()
            .filter_map(|c| c.wait().err())
            .map(comm_err)
            .collect(),
    };
    assert!(!errors.is_empty(), "mismatched counts were accepted");
    for e in &errors {
        assert!(
            matches!(
                e,
                CommError::Rccl {
                    op: "ncclAllReduce" | "ncclGroupEnd",
                    ..
                } | CommError::Async { .. }
                    | CommError::Timeout { .. }
            ),
            "{e}"
        );
    }
}
