//! `hip_rt::ddp` on several devices: the gradient reducer on 2 and 4 devices (one thread per
//! device, and one thread driving all of them in groups) against a host-computed mean, with
//! several buckets and a different readiness order on every rank; its misuse errors; the ZeRO-1
//! reduce-scatter / all-gather round trip; the flag and mean helpers; and two real processes
//! joined through torchrun's variables (plus a missing rank and a mismatched world size).
//! `cargo test -p hip-rt --features device --test device_ddp`.
//!
//! On hip-emu (HIPK_HIP_LIBRARY names libhip_emu.so) the test sets `HIPK_EMU_DEVICES=4`,
//! `HIPK_RCCL_LIBRARY` and `HIPK_EMU_SEED` unless they are set: with a seed hip-emu picks among
//! ready streams at random, so a collective not ordered after the copy that wrote its gradients
//! (or a read not ordered after the collective) shows up as wrong values. Ran on hip-emu only.
#![cfg(feature = "device")]

use std::ops::Range;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use half::{bf16, f16};
use hip_rt::comm::{CommElement, GroupGuard};
use hip_rt::ddp::{self, Averaging, DdpError, GradReducer, ReducerOptions, ShardPlan};
use hip_rt::{Comm, Device, DeviceBuffer, DeviceView, PinnedHostBuffer, Stream, StreamOptions};

fn setup() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let hip = std::env::var("HIPK_HIP_LIBRARY").unwrap_or_default();
        if hip.ends_with("libhip_emu.so") {
            for (k, v) in [
                ("HIPK_EMU_DEVICES", "4"),
                ("HIPK_RCCL_LIBRARY", hip.as_str()),
                ("HIPK_EMU_SEED", "23"),
            ] {
                if std::env::var_os(k).is_none() {
                    std::env::set_var(k, v);
                }
            }
        }
    });
}

/// One test at a time (hip-emu runs each device's work in order; see device_comm.rs).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn devices(n: usize) -> Vec<Device> {
    setup();
    let count = Device::count().unwrap_or_else(|e| panic!("device_ddp needs HIP devices: {e}"));
    assert!(
        count as usize >= n,
        "device_ddp needs {n} devices and {count} are visible (on hip-emu: HIPK_EMU_DEVICES=4)"
    );
    (0..n as i32).map(|i| Device::get(i).unwrap()).collect()
}

fn stream(d: &Device) -> Stream {
    Stream::new(d, StreamOptions::default()).unwrap()
}

/// Element types, through f64 (every value used is exact in each).
trait Elem: CommElement + PartialEq + std::fmt::Debug + Send {
    fn of(v: f64) -> Self;
}
impl Elem for f32 {
    fn of(v: f64) -> Self {
        v as f32
    }
}
impl Elem for f16 {
    fn of(v: f64) -> Self {
        f16::from_f64(v)
    }
}
impl Elem for bf16 {
    fn of(v: f64) -> Self {
        bf16::from_f64(v)
    }
}

/// Rank `r`'s gradient at element `j` in step `s`: a small integer, so sums and quarters of
/// sums over 2 or 4 ranks are exact in f32, f16 and bf16.
fn grad(r: usize, s: usize, j: usize) -> f64 {
    ((j * 7 + r * 3 + s * 5) % 11) as f64 - 5.0
}

/// 9 tensors of a 1000-element buffer, in "backward" order (the buffer's end first), with
/// sizes from 1 to 300, so that a 640-byte cap makes buckets of one and of several tensors.
fn tensors() -> Vec<Range<usize>> {
    let bounds = [0, 1, 40, 140, 141, 400, 700, 760, 999, 1000];
    (0..9).rev().map(|i| bounds[i]..bounds[i + 1]).collect()
}
const LEN: usize = 1000;

/// Rank `r`'s readiness order: a different permutation on every rank.
fn order(r: usize, n: usize) -> Vec<usize> {
    let mut o: Vec<usize> = (0..n).collect();
    match r % 4 {
        0 => {}
        1 => o.reverse(),
        2 => o.sort_by_key(|i| (i % 2, *i)),
        _ => o.sort_by_key(|i| (i * 5) % n),
    }
    o
}

fn options(averaging: Averaging) -> ReducerOptions {
    ReducerOptions {
        bucket_bytes: 160 * 4, // 160 f32 elements: several buckets
        averaging,
    }
}

/// Two steps of one rank: each tensor's gradient is copied in on the compute stream
/// (asynchronously) and marked ready in this rank's order. Returns each step's result.
fn rank_steps<T: Elem>(comm: Arc<Comm>, averaging: Averaging, readiness: &[usize]) -> Vec<Vec<T>> {
    let r = comm.rank();
    let device = comm.device().clone();
    let compute = stream(&device);
    let mut reducer =
        GradReducer::<T>::new(comm, stream(&device), &tensors(), LEN, options(averaging)).unwrap();
    assert!(reducer.plan().buckets().len() >= 4, "{:?}", reducer.plan());
    let mut grads = DeviceBuffer::<T>::zeroed(&compute, LEN).unwrap();
    // Every step's staged gradients, pinned up front: freeing pinned memory (hipHostFree) waits
    // for every device of the process, which would stall this rank while another waits for it.
    let staged: Vec<Vec<PinnedHostBuffer<T>>> = (0..2)
        .map(|s| {
            tensors()
                .into_iter()
                .map(|range| {
                    let host: Vec<T> = range.map(|j| T::of(grad(r, s, j))).collect();
                    PinnedHostBuffer::from_slice(&device, &host).unwrap()
                })
                .collect()
        })
        .collect();
    let mut results = Vec::new();
    for staged in &staged {
        for &i in readiness {
            let range = tensors()[i].clone();
            compute
                .copy_htod_async(&staged[i], &mut grads.slice_mut(range).unwrap())
                .unwrap();
            let before = reducer.launched();
            reducer.mark_ready(i, &mut grads, &compute).unwrap();
            // Launches only ever advance in plan order, never past an incomplete bucket.
            let launched = reducer.launched();
            assert!(launched >= before);
            for b in &reducer.plan().buckets()[..launched] {
                for t in &b.tensors {
                    assert!(readiness_before(readiness, i).contains(t) || *t == i);
                }
            }
        }
        assert_eq!(reducer.launched(), reducer.plan().buckets().len());
        reducer.finish(&compute).unwrap();
        results.push(grads.to_vec(&compute).unwrap());
    }
    reducer.comm().wait().unwrap();
    results
}

fn readiness_before(order: &[usize], upto: usize) -> Vec<usize> {
    order.iter().take_while(|&&t| t != upto).copied().collect()
}

fn expected<T: Elem>(world: usize, s: usize, averaging: Averaging) -> Vec<T> {
    (0..LEN)
        .map(|j| {
            let sum: f64 = (0..world).map(|r| grad(r, s, j)).sum();
            T::of(match averaging {
                Averaging::Avg => sum / world as f64,
                _ => sum,
            })
        })
        .collect()
}

fn reducer_on_threads<T: Elem>(world: usize, averaging: Averaging) {
    let devs = devices(world);
    let comms: Vec<Arc<Comm>> = Comm::init_all(&devs)
        .unwrap()
        .into_iter()
        .map(Arc::new)
        .collect();
    let results: Vec<Vec<Vec<T>>> = std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .iter()
            .map(|c| {
                let c = c.clone();
                scope.spawn(move || {
                    let readiness = order(c.rank(), tensors().len());
                    rank_steps::<T>(c, averaging, &readiness)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (r, steps) in results.iter().enumerate() {
        for (s, got) in steps.iter().enumerate() {
            let want = expected::<T>(world, s, averaging);
            if let Some(j) = (0..LEN).find(|&j| got[j] != want[j]) {
                panic!(
                    "{} world {world} {averaging:?} rank {r} step {s}: element {j} is {:?}, want {:?}",
                    std::any::type_name::<T>(),
                    got[j],
                    want[j]
                );
            }
        }
    }
    drop(comms);
    for d in &devs {
        d.check_err().unwrap();
    }
}

#[test]
fn the_reducer_averages_in_buckets_on_1_2_and_4_devices_whatever_the_readiness_order() {
    let _serial = serial();
    for world in [1, 2, 4] {
        reducer_on_threads::<f32>(world, Averaging::Avg);
    }
    reducer_on_threads::<f32>(2, Averaging::Sum);
    reducer_on_threads::<f16>(2, Averaging::Avg);
    reducer_on_threads::<bf16>(4, Averaging::Avg);
}

#[test]
fn one_thread_drives_every_device_through_groups() {
    let _serial = serial();
    let world = 4;
    let devs = devices(world);
    let comms: Vec<Arc<Comm>> = Comm::init_all(&devs)
        .unwrap()
        .into_iter()
        .map(Arc::new)
        .collect();
    let compute: Vec<Stream> = devs.iter().map(stream).collect();
    let mut reducers: Vec<GradReducer<f32>> = comms
        .iter()
        .zip(&devs)
        .map(|(c, d)| {
            GradReducer::new(
                c.clone(),
                stream(d),
                &tensors(),
                LEN,
                options(Averaging::Avg),
            )
            .unwrap()
        })
        .collect();
    let mut grads: Vec<DeviceBuffer<f32>> = compute
        .iter()
        .map(|s| DeviceBuffer::zeroed(s, LEN).unwrap())
        .collect();
    let mut staged = Vec::new();
    // The same order on every device: tensor i on all devices, then tensor i+1.
    for i in order(3, tensors().len()) {
        let group = GroupGuard::start().unwrap();
        for r in 0..world {
            let range = tensors()[i].clone();
            let host: Vec<f32> = range.clone().map(|j| grad(r, 0, j) as f32).collect();
            let pinned = PinnedHostBuffer::from_slice(&devs[r], &host).unwrap();
            compute[r]
                .copy_htod_async(&pinned, &mut grads[r].slice_mut(range).unwrap())
                .unwrap();
            staged.push(pinned);
            reducers[r]
                .mark_ready(i, &mut grads[r], &compute[r])
                .unwrap();
        }
        group.end().unwrap();
    }
    for r in 0..world {
        reducers[r].finish(&compute[r]).unwrap();
    }
    let want = expected::<f32>(world, 0, Averaging::Avg);
    for r in 0..world {
        assert_eq!(grads[r].to_vec(&compute[r]).unwrap(), want, "rank {r}");
    }
    for c in &comms {
        c.wait().unwrap();
    }
}

#[test]
fn reducer_misuse_is_a_typed_error() {
    let _serial = serial();
    let devs = devices(2);
    let comms = Comm::init_all(&devs).unwrap();
    let comm = Arc::new(comms.into_iter().next().unwrap());
    let compute = stream(&devs[0]);
    // hip-emu's emulated RCCL reports 2.18, which has ncclAvg.
    assert_eq!(Averaging::best_for(&comm), Averaging::Avg);
    // A stream of another device.
    let e = GradReducer::<f32>::new(
        comm.clone(),
        stream(&devs[1]),
        &tensors(),
        LEN,
        ReducerOptions::default(),
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            DdpError::Hip(hip_rt::Error::WrongDevice {
                expected: 0,
                found: 1,
                ..
            })
        ),
        "{e}"
    );
    // Bad ranges.
    let e = GradReducer::<f32>::new(
        comm.clone(),
        stream(&devs[0]),
        &[0..10, 5..20],
        LEN,
        ReducerOptions::default(),
    )
    .unwrap_err();
    assert!(
        matches!(e, DdpError::Ranges(_)) && e.to_string().contains("overlap"),
        "{e}"
    );
    // One bucket of two tensors (the default cap): marking one launches nothing, so this rank
    // alone can exercise the errors without a partner.
    let mut reducer = GradReducer::<f32>::new(
        comm.clone(),
        stream(&devs[0]),
        &[500..1000, 0..500],
        LEN,
        ReducerOptions::default(),
    )
    .unwrap();
    let mut grads = DeviceBuffer::<f32>::zeroed(&compute, LEN).unwrap();
    reducer.mark_ready(1, &mut grads, &compute).unwrap();
    assert_eq!(reducer.launched(), 0);
    let e = reducer.mark_ready(1, &mut grads, &compute).unwrap_err();
    assert!(
        matches!(
            e,
            DdpError::MarkedTwice {
                index: 1,
                start: 0,
                end: 500
            }
        ),
        "{e}"
    );
    let e = reducer.mark_ready(2, &mut grads, &compute).unwrap_err();
    assert!(
        matches!(e, DdpError::NoSuchTensor { index: 2, count: 2 }),
        "{e}"
    );
    let mut short = DeviceBuffer::<f32>::zeroed(&compute, LEN - 1).unwrap();
    let e = reducer.mark_ready(0, &mut short, &compute).unwrap_err();
    assert!(
        matches!(
            e,
            DdpError::Length {
                found: 999,
                expected: 1000,
                ..
            }
        ),
        "{e}"
    );
    let e = reducer
        .mark_ready(0, &mut grads, &stream(&devs[1]))
        .unwrap_err();
    assert!(
        matches!(e, DdpError::Hip(hip_rt::Error::WrongDevice { .. })),
        "{e}"
    );
    let e = reducer.finish(&compute).unwrap_err();
    match &e {
        DdpError::Unmarked { count: 1, first } => assert_eq!(first, &vec![0]),
        other => panic!("not Unmarked: {other}"),
    }
    assert!(e.to_string().contains("not marked ready"), "{e}");
    // The step stays open after the error; reset() forgets it.
    reducer.reset();
    reducer.mark_ready(1, &mut grads, &compute).unwrap();
    assert_eq!(reducer.launched(), 0);
    compute.synchronize().unwrap();
}

#[test]
fn zero_1_reduce_scatter_and_all_gather_round_trip_with_padding() {
    let _serial = serial();
    for world in [2, 4] {
        let devs = devices(world);
        let comms = Comm::init_all(&devs).unwrap();
        let streams: Vec<Stream> = devs.iter().map(stream).collect();
        let n = 1001; // not a multiple of 2 or 4
        let plan = ShardPlan::new(n, world).unwrap();
        assert!(plan.padded_len() > n);
        let host: Vec<Vec<f32>> = (0..world)
            .map(|r| {
                let mut g: Vec<f32> = (0..n).map(|j| grad(r, 1, j) as f32).collect();
                g.resize(plan.padded_len(), 0.0); // zero padding
                g
            })
            .collect();
        let mean: Vec<f32> = (0..plan.padded_len())
            .map(|j| host.iter().map(|g| g[j]).sum::<f32>() / world as f32)
            .collect();
        let grads: Vec<DeviceBuffer<f32>> = (0..world)
            .map(|r| DeviceBuffer::from_slice(&streams[r], &host[r]).unwrap())
            .collect();
        let mut in_place: Vec<DeviceBuffer<f32>> = (0..world)
            .map(|r| DeviceBuffer::from_slice(&streams[r], &host[r]).unwrap())
            .collect();
        let mut shards: Vec<DeviceBuffer<f32>> = (0..world)
            .map(|r| DeviceBuffer::zeroed(&streams[r], plan.shard_len()).unwrap())
            .collect();
        let g = GroupGuard::start().unwrap();
        for r in 0..world {
            plan.reduce_scatter(
                &comms[r],
                &grads[r],
                &mut shards[r],
                Averaging::Avg,
                &streams[r],
            )
            .unwrap();
        }
        g.end().unwrap();
        let g = GroupGuard::start().unwrap();
        for r in 0..world {
            plan.reduce_scatter_in_place(&comms[r], &mut in_place[r], Averaging::Avg, &streams[r])
                .unwrap();
        }
        g.end().unwrap();
        for c in &comms {
            c.wait().unwrap();
        }
        for r in 0..world {
            let want = &mean[plan.shard_range(r)];
            assert_eq!(
                shards[r].to_vec(&streams[r]).unwrap(),
                want,
                "world {world} rank {r}"
            );
            let got = in_place[r].to_vec(&streams[r]).unwrap();
            assert_eq!(
                &got[plan.shard_range(r)],
                want,
                "in place, world {world} rank {r}"
            );
        }
        // "Update" each shard (x -> 2x + rank-independent offset), then gather both ways.
        let updated: Vec<f32> = mean
            .iter()
            .enumerate()
            .map(|(j, v)| 2.0 * v + (j % 3) as f32)
            .collect();
        let mut params: Vec<DeviceBuffer<f32>> = (0..world)
            .map(|r| {
                let mut p = vec![-99.0f32; plan.padded_len()];
                p[plan.shard_range(r)].copy_from_slice(&updated[plan.shard_range(r)]);
                DeviceBuffer::from_slice(&streams[r], &p).unwrap()
            })
            .collect();
        let new_shards: Vec<DeviceBuffer<f32>> = (0..world)
            .map(|r| DeviceBuffer::from_slice(&streams[r], &updated[plan.shard_range(r)]).unwrap())
            .collect();
        let mut gathered: Vec<DeviceBuffer<f32>> = (0..world)
            .map(|r| DeviceBuffer::zeroed(&streams[r], plan.padded_len()).unwrap())
            .collect();
        let g = GroupGuard::start().unwrap();
        for r in 0..world {
            plan.all_gather_in_place(&comms[r], &mut params[r], &streams[r])
                .unwrap();
            plan.all_gather(&comms[r], &new_shards[r], &mut gathered[r], &streams[r])
                .unwrap();
        }
        g.end().unwrap();
        for c in &comms {
            c.wait().unwrap();
        }
        for r in 0..world {
            let p = params[r].to_vec(&streams[r]).unwrap();
            assert_eq!(&p[..n], &updated[..n], "params, world {world} rank {r}");
            let q = gathered[r].to_vec(&streams[r]).unwrap();
            assert_eq!(&q[..n], &updated[..n], "gathered, world {world} rank {r}");
        }
        // Plans made for another world, and buffers of the wrong length, are refused.
        let other = ShardPlan::new(n, world + 1).unwrap();
        let e = other
            .all_gather_in_place(&comms[0], &mut params[0], &streams[0])
            .unwrap_err();
        assert!(
            matches!(e, DdpError::World { planned, world: w, .. } if planned == world + 1 && w == world),
            "{e}"
        );
        let mut short = DeviceBuffer::<f32>::zeroed(&streams[0], n).unwrap();
        let e = plan
            .reduce_scatter_in_place(&comms[0], &mut short, Averaging::Avg, &streams[0])
            .unwrap_err();
        assert!(matches!(e, DdpError::Length { found: 1001, .. }), "{e}");
    }
}

#[test]
fn flags_and_means_agree_across_ranks() {
    let _serial = serial();
    let devs = devices(4);
    let comms = Comm::init_all(&devs).unwrap();
    let streams: Vec<Stream> = devs.iter().map(stream).collect();
    assert!(ddp::any_across_devices(&comms, &[false, false, true, false], &streams).unwrap());
    assert!(!ddp::any_across_devices(&comms, &[false; 4], &streams).unwrap());
    let mean = ddp::mean_across_devices(&comms, &[1.0, 2.0, 3.5, 5.5], &streams).unwrap();
    assert_eq!(mean, 3.0);
    let e = ddp::any_across_devices(&comms, &[true; 3], &streams).unwrap_err();
    assert!(
        matches!(
            e,
            DdpError::Length {
                found: 3,
                expected: 4,
                ..
            }
        ),
        "{e}"
    );
    // One thread per rank: the blocking per-rank forms.
    let got: Vec<(bool, bool, f32)> = std::thread::scope(|scope| {
        let hs: Vec<_> = comms
            .iter()
            .zip(&streams)
            .map(|(c, s)| {
                scope.spawn(move || {
                    let r = c.rank();
                    let any = ddp::any_across_ranks(c, r == 2, s).unwrap();
                    let none = ddp::any_across_ranks(c, false, s).unwrap();
                    let mean = ddp::mean_across_ranks(c, r as f32 * 2.0, s).unwrap();
                    (any, none, mean)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(got, vec![(true, false, 3.0); 4]);
    // The device form: no host wait until the caller reads.
    let mut flags: Vec<DeviceBuffer<i32>> = (0..4)
        .map(|r| DeviceBuffer::from_slice(&streams[r], &[0, i32::from(r == 3)]).unwrap())
        .collect();
    let g = GroupGuard::start().unwrap();
    for r in 0..4 {
        ddp::any_in_place(&comms[r], &mut flags[r], &streams[r]).unwrap();
    }
    g.end().unwrap();
    for r in 0..4 {
        comms[r].wait().unwrap();
        assert_eq!(
            flags[r].to_vec(&streams[r]).unwrap(),
            vec![0, 1],
            "rank {r}"
        );
    }
    // The mean as device scalars: rank r holds [r, 10·r]; every rank ends with the means.
    let mut values: Vec<DeviceBuffer<f32>> = (0..4)
        .map(|r| DeviceBuffer::from_slice(&streams[r], &[r as f32, 10.0 * r as f32]).unwrap())
        .collect();
    let g = GroupGuard::start().unwrap();
    for r in 0..4 {
        ddp::mean_in_place(&comms[r], &mut values[r], &streams[r]).unwrap();
    }
    g.end().unwrap();
    for r in 0..4 {
        comms[r].wait().unwrap();
        assert_eq!(
            values[r].to_vec(&streams[r]).unwrap(),
            vec![1.5, 15.0],
            "rank {r}"
        );
    }
}

// --- Several processes through torchrun's variables ----------------------------------------

const CHILD_VAR: &str = "HIPK_DDP_TEST_CHILD";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Start this test binary as one rank, running only `test` with the launcher's variables.
fn spawn_rank(test: &str, rank: usize, world: usize, port: u16, extra: &[(&str, &str)]) -> Child {
    setup();
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([test, "--exact", "--test-threads=1", "--nocapture"])
        .env(CHILD_VAR, "1")
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", world.to_string())
        .env("LOCAL_RANK", rank.to_string())
        .env("LOCAL_WORLD_SIZE", world.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .env("HIPK_RDZV_SECRET", "device-ddp-tests-secret-0123456789")
        .env_remove("HIPK_RDZV_PORT")
        .env_remove("TORCHELASTIC_USE_AGENT_STORE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn a rank")
}

/// Wait for `child` at most `limit` (then kill it): (success, stdout + stderr, elapsed).
fn finish_rank(mut child: Child, limit: Duration) -> (bool, String, Duration) {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            return (status.success(), text, start.elapsed());
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "a rank did not exit within {limit:?} (a hang):\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One rank of the two-process job: init from the variables, one reducer step, the loss mean
/// and the skip flag.
fn two_process_rank() {
    let (env, comm) = ddp::init_from_env(&ddp::RendezvousOptions::default())
        .unwrap()
        .expect("the launcher variables are set");
    assert_eq!((comm.rank(), comm.world()), (env.rank, 2));
    assert_eq!(comm.device().ordinal(), env.device_ordinal());
    comm.set_timeout(Duration::from_secs(60));
    let comm = Arc::new(comm);
    let readiness = order(env.rank, tensors().len());
    let steps = rank_steps::<f32>(comm.clone(), Averaging::Avg, &readiness);
    for (s, got) in steps.iter().enumerate() {
        assert_eq!(
            got,
            &expected::<f32>(2, s, Averaging::Avg),
            "rank {} step {s}",
            env.rank
        );
    }
    let s = stream(comm.device());
    let mean = ddp::mean_across_ranks(&comm, 1.5 + env.rank as f32, &s).unwrap();
    assert_eq!(mean, 2.0);
    assert!(ddp::any_across_ranks(&comm, env.rank == 1, &s).unwrap());
    println!("RANK {} OK", env.rank);
}

#[test]
fn two_processes_join_through_torchruns_variables_and_average() {
    if std::env::var_os(CHILD_VAR).is_some() {
        two_process_rank();
        return;
    }
    let _serial = serial();
    let port = free_port();
    let test = "two_processes_join_through_torchruns_variables_and_average";
    let ranks: Vec<Child> = (0..2).map(|r| spawn_rank(test, r, 2, port, &[])).collect();
    for (r, child) in ranks.into_iter().enumerate() {
        let (ok, out, _) = finish_rank(child, Duration::from_secs(240));
        assert!(
            ok && out.contains(&format!("RANK {r} OK")),
            "rank {r} failed:\n{out}"
        );
    }
}

/// A rank that expects `init_from_env` to fail: prints the error for the parent to check.
fn failing_rank() {
    match ddp::init_from_env(&ddp::RendezvousOptions::default()) {
        Ok(_) => println!("DDP-JOINED"),
        Err(e) => println!("DDP-ERROR: {e}"),
    }
}

#[test]
fn a_missing_rank_or_a_mismatched_world_size_fails_every_process_without_hanging() {
    if std::env::var_os(CHILD_VAR).is_some() {
        failing_rank();
        return;
    }
    let _serial = serial();
    let test = "a_missing_rank_or_a_mismatched_world_size_fails_every_process_without_hanging";
    let short = [("HIPK_COMM_TIMEOUT_S", "1.5")];
    // Rank 1 of 2 never starts.
    let rank0 = spawn_rank(test, 0, 2, free_port(), &short);
    let (_, out, took) = finish_rank(rank0, Duration::from_secs(60));
    assert!(
        out.contains("DDP-ERROR") && out.contains("rank(s) [1] never connected"),
        "{out}"
    );
    assert!(took < Duration::from_secs(30), "{took:?}");
    // Rank 0 alone of a world of 2, seen from rank 1 (no rank 0 at all).
    let rank1 = spawn_rank(test, 1, 2, free_port(), &short);
    let (_, out, _) = finish_rank(rank1, Duration::from_secs(60));
    assert!(
        out.contains("DDP-ERROR") && out.contains("got no unique id from rank 0"),
        "{out}"
    );
    // LOCAL_RANK names a device that is not there: refused before the rendezvous.
    let count = Device::count().unwrap();
    let past = count as usize;
    let child = spawn_rank(test, past, past + 1, free_port(), &short);
    let (_, out, _) = finish_rank(child, Duration::from_secs(60));
    assert!(
        out.contains("DDP-ERROR")
            && out.contains(&format!("LOCAL_RANK={past} selects device {past}")),
        "{out}"
    );
    // Rank 1 thinks the world is 3.
    let port = free_port();
    let rank0 = spawn_rank(test, 0, 2, port, &short);
    let rank1 = spawn_rank(test, 1, 3, port, &short);
    let (_, out0, _) = finish_rank(rank0, Duration::from_secs(60));
    let (_, out1, _) = finish_rank(rank1, Duration::from_secs(60));
    assert!(
        out0.contains("DDP-ERROR")
            && out0.contains("WORLD_SIZE=3")
            && out0.contains("WORLD_SIZE=2"),
        "{out0}"
    );
    assert!(
        out1.contains("DDP-ERROR") && out1.contains("rank 1 has WORLD_SIZE=3"),
        "{out1}"
    );
}

#[test]
fn a_post_scale_hook_runs_after_each_buckets_sum_with_factor_1_over_w() {
    let _serial = serial();
    let world = 2;
    let devs = devices(world);
    let comms: Vec<Arc<Comm>> = Comm::init_all(&devs)
        .unwrap()
        .into_iter()
        .map(Arc::new)
        .collect();
    /// Per rank: buckets, the hook's (length, factor) calls, the result.
    type Seen = (usize, Vec<(usize, f32)>, Vec<f32>);
    let calls: Vec<Seen> = std::thread::scope(|scope| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                let c = c.clone();
                scope.spawn(move || {
                    let d = c.device().clone();
                    let compute = stream(&d);
                    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
                    let log = seen.clone();
                    let mut reducer = GradReducer::<f32>::new(
                        c.clone(),
                        stream(&d),
                        &tensors(),
                        LEN,
                        options(Averaging::Sum),
                    )
                    .unwrap();
                    // The "scale" zeroes the range: zeros at the end prove it ran after the
                    // sum (had it run before, the sum would have overwritten them).
                    reducer.set_post_scale(Box::new(move |view, factor, s| {
                        log.lock().unwrap().push((view.len(), factor));
                        s.memset_zero(view)
                    }));
                    let host: Vec<f32> = (0..LEN).map(|j| grad(c.rank(), 0, j) as f32).collect();
                    let mut grads = DeviceBuffer::from_slice(&compute, &host).unwrap();
                    for i in order(c.rank(), tensors().len()) {
                        reducer.mark_ready(i, &mut grads, &compute).unwrap();
                    }
                    reducer.finish(&compute).unwrap();
                    let out = grads.to_vec(&compute).unwrap();
                    c.wait().unwrap();
                    let buckets = reducer.plan().buckets().len();
                    let seen = seen.lock().unwrap().clone();
                    (buckets, seen, out)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (r, (buckets, seen, out)) in calls.iter().enumerate() {
        let ranges: usize = seen.len();
        assert!(ranges >= *buckets, "rank {r}: {seen:?}");
        assert_eq!(seen.iter().map(|(n, _)| n).sum::<usize>(), LEN, "rank {r}");
        assert!(seen.iter().all(|(_, f)| *f == 0.5), "rank {r}: {seen:?}");
        assert!(out.iter().all(|v| *v == 0.0), "rank {r}: {:?}", &out[..8]);
    }
}
