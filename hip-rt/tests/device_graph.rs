//! A captured graph and the caching allocator's stream-ordered reuse: blocks freed during the
//! capture are held for the graph (never handed out again while it lives, not even to the
//! capture's own later requests), the replays keep computing into them correctly beside eager
//! work, and the blocks return to the cache when the graph goes.
//! `cargo test -p hip-rt --features device --test device_graph` with hip-emu as the runtime.
#![cfg(feature = "device")]

mod common;

use hip_rt::emu::{self, StatsScope};
use hip_rt::{CaptureMode, Device, DeviceBuffer, Function, LaunchConfig, Module, Stream};

const N: usize = 1000;

/// `x[i] += v` for the n floats of `x`, queued on `s`.
fn add(s: &Stream, f: &Function, x: &mut DeviceBuffer<f32>, v: f32) {
    let cfg = LaunchConfig::for_num_elems(N as u64, f.limits()).unwrap();
    // SAFETY: hipk_test_add(float*, float, int) gets a live buffer of N floats, a float and N.
    unsafe {
        s.launch_builder(f)
            .arg_mut(x)
            .value(v)
            .value(N as i32)
            .launch(&cfg)
    }
    .unwrap();
}

#[test]
fn a_graph_that_frees_and_reuses_a_block() {
    let d = Device::get(0).unwrap_or_else(|e| panic!("the `device` tests need a HIP device: {e}"));
    if !hip_rt::graph::supported() {
        assert!(!d.is_emulated(), "hip-emu exports the graph entry points");
        return;
    }
    let s = Stream::new(&d, Default::default()).unwrap();
    let m = Module::load(&d, &common::build_bundle(&[d.arch()]).unwrap()).unwrap();
    let f = m.function("hipk_test_add").unwrap();
    let mut out = DeviceBuffer::<f32>::zeroed(&s, 2 * N).unwrap();
    // Warm the cache with a block of the temporaries' size, freed (reusable) before the capture.
    let warm = DeviceBuffer::<f32>::zeroed(&s, N).unwrap();
    let cached = warm.device_ptr();
    drop(warm);
    s.synchronize().unwrap();

    let mut addresses = Vec::new();
    let graph = s
        .capture(CaptureMode::Global, |s| {
            // A temporary, computed into, copied out, freed...
            let mut a = DeviceBuffer::<f32>::alloc(s, N).unwrap();
            s.memset_zero(&mut a)?;
            add(s, &f, &mut a, 2.0);
            s.copy_dtod(&a, &mut out.slice_mut(0..N)?)?;
            addresses.push(a.device_ptr());
            drop(a);
            // ...and the next request of the same size: a new block (the freed one is the
            // graph's: each replay writes it again).
            let mut b = DeviceBuffer::<f32>::alloc(s, N).unwrap();
            s.memset_zero(&mut b)?;
            add(s, &f, &mut b, 5.0);
            s.copy_dtod(&b, &mut out.slice_mut(N..2 * N)?)?;
            addresses.push(b.device_ptr());
            drop(b);
            Ok(())
        })
        .unwrap();
    assert_eq!(
        addresses[0], cached,
        "a capture's requests are served from the cache"
    );
    assert_ne!(
        addresses[0], addresses[1],
        "a block freed in the capture is not reused by it"
    );
    let exec = graph.instantiate().unwrap();
    let held = d.memory_stats().unwrap().allocated_bytes.all().current;

    // Eager work beside the graph: never given a held block, never overwritten by a replay.
    let mut c = DeviceBuffer::<f32>::zeroed(&s, N).unwrap();
    assert!(
        !addresses.contains(&c.device_ptr()),
        "an eager request got a block the graph holds"
    );
    add(&s, &f, &mut c, 100.0);
    let before = emu::stats(StatsScope::Thread);
    for replay in 1..=3 {
        // SAFETY: `out` and the held temporaries are all the graph touches; all are alive.
        unsafe { exec.launch(&s) }.unwrap();
        let got = out.to_vec(&s).unwrap();
        assert!(
            got[..N].iter().all(|&x| x == 2.0),
            "replay {replay}: first temporary"
        );
        assert!(
            got[N..].iter().all(|&x| x == 5.0),
            "replay {replay}: second temporary"
        );
        add(&s, &f, &mut c, 1.0);
    }
    assert_eq!(
        c.to_vec(&s).unwrap(),
        vec![103.0f32; N],
        "the eager buffer is intact"
    );
    if let (Some(b), Some(a)) = (before, emu::stats(StatsScope::Thread)) {
        let d = a.since(&b);
        // 3 replays of 6 nodes each (2 × memset, kernel, copy); the 3 eager adds are launches.
        assert_eq!((d.graph_launches, d.graph_nodes, d.launches), (3, 18, 3));
    }
    drop(c);

    // The graph goes: its two blocks return to the cache and are reused.
    drop(exec);
    drop(graph);
    s.synchronize().unwrap();
    let after = d.memory_stats().unwrap().allocated_bytes.all().current;
    assert_eq!(
        held - after,
        2 * (N * 4).next_multiple_of(512) as u64,
        "the held blocks are freed with the graph"
    );
    let again = DeviceBuffer::<f32>::alloc(&s, N).unwrap();
    assert!(
        addresses.contains(&again.device_ptr()),
        "a block the graph held is reused once it is gone"
    );
}
