//! A captured graph and the caching allocator's stream-ordered reuse: the capture's requests
//! come from a private pool in which a block it frees is reused by its later requests (so the
//! graph keeps its eager peak, not the sum of its temporaries), blocks freed during the capture
//! that it did not allocate on its stream (older ones, ones used on another stream) are held,
//! the replays keep computing into all of them correctly beside eager work, and everything
//! returns to the cache when the graph goes.
//! `cargo test -p hip-rt --features device --test device_graph` with hip-emu as the runtime.
#![cfg(feature = "device")]

mod common;

use hip_rt::caching::allocation_size;
use hip_rt::emu::{self, StatsScope};
use hip_rt::{
    CaptureMode, Device, DeviceBuffer, DevicePtr, Function, LaunchConfig, Module, Stream,
};

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

/// A step's two temporaries of one size, each computed into, copied out and freed; the
/// addresses they got.
fn temporaries(
    s: &Stream,
    f: &Function,
    out: &mut DeviceBuffer<f32>,
) -> hip_rt::Result<Vec<DevicePtr>> {
    let mut addresses = Vec::new();
    for (half, v) in [(0, 2.0), (1, 5.0)] {
        let mut t = DeviceBuffer::<f32>::alloc(s, N)?;
        s.memset_zero(&mut t)?;
        add(s, f, &mut t, v);
        s.copy_dtod(&t, &mut out.slice_mut(half * N..(half + 1) * N)?)?;
        addresses.push(t.device_ptr());
    }
    Ok(addresses)
}

#[test]
fn a_graph_that_frees_and_reuses_a_block() {
    let d = Device::get(0).unwrap_or_else(|e| panic!("the `device` tests need a HIP device: {e}"));
    if !hip_rt::graph::supported() {
        assert!(!d.is_emulated(), "hip-emu exports the graph entry points");
        return;
    }
    let s = Stream::new(&d, Default::default()).unwrap();
    let side = Stream::new(&d, Default::default()).unwrap();
    let m = Module::load(&d, &common::build_bundle(&[d.arch()]).unwrap()).unwrap();
    let f = m.function("hipk_test_add").unwrap();
    let mut out = DeviceBuffer::<f32>::zeroed(&s, 2 * N).unwrap();
    let allocated = || *d.memory_stats().unwrap().allocated_bytes.all();

    // Eager: the second temporary reuses the first's block; the peak is one block.
    s.synchronize().unwrap();
    d.reset_peak_memory_stats().unwrap();
    let base = allocated().current;
    let eager = temporaries(&s, &f, &mut out).unwrap();
    assert_eq!(eager[0], eager[1]);
    let block = allocated().peak - base;
    assert_eq!(block, ((N * 4 + 1) as u64).next_multiple_of(512));

    // Captured: the same reuse inside the graph's pool, beside two frees the graph holds: a
    // buffer from before the capture, and the pool's block once it is also used on another
    // stream (freed when the graph ends, so the pool's segment stays in use).
    let mut old = DeviceBuffer::<f32>::zeroed(&s, N).unwrap();
    let old_ptr = old.device_ptr();
    let mut shared_ptr = DevicePtr::NULL;
    s.synchronize().unwrap();
    d.reset_peak_memory_stats().unwrap();
    let base = allocated().current;
    let mut addresses = Vec::new();
    let graph = s
        .capture(CaptureMode::Global, |s| {
            addresses = temporaries(s, &f, &mut out)?;
            add(s, &f, &mut old, 1.0);
            drop(old);
            let mut shared = DeviceBuffer::<f32>::alloc(s, N)?;
            shared.record_stream(&side)?;
            s.memset_zero(&mut shared)?;
            shared_ptr = shared.device_ptr();
            Ok(())
        })
        .unwrap();
    assert_eq!(
        addresses[0], addresses[1],
        "the capture's second request gets the block it freed"
    );
    assert!(
        !eager.contains(&addresses[0]),
        "the capture has a pool of its own"
    );
    assert_eq!(
        shared_ptr, addresses[0],
        "a third request of that size gets it too"
    );
    assert_eq!(
        allocated().peak - base,
        block,
        "the capture's peak is the eager one"
    );
    assert_eq!(
        allocated().current - base,
        block,
        "held: the old buffer and the shared one"
    );
    assert_eq!(
        graph.memory_bytes() as u64,
        allocation_size(block as usize) as u64 + block,
        "the graph keeps its pool (one segment, eager's) and the old buffer"
    );
    let exec = graph.instantiate().unwrap();

    // Eager work beside the graph: never given a block of the graph, never overwritten.
    let mut c = DeviceBuffer::<f32>::zeroed(&s, N).unwrap();
    assert!(
        ![addresses[0], old_ptr].contains(&c.device_ptr()),
        "an eager request got a block the graph keeps"
    );
    add(&s, &f, &mut c, 100.0);
    let before = emu::stats(StatsScope::Thread);
    for replay in 1..=3 {
        // SAFETY: `out` and the graph's own blocks are all it touches; all are alive.
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
        // 3 replays of 8 nodes each (2 × (memset, kernel, copy), add, memset); 3 eager adds.
        assert_eq!((d.graph_launches, d.graph_nodes, d.launches), (3, 24, 3));
    }
    drop(c);

    // The cache keeps the graph's pool while it lives, and gives it back once it is gone.
    d.empty_cache().unwrap();
    let reserved = || d.memory_stats().unwrap().reserved_bytes.all().current;
    let (held, kept) = (allocated().current, reserved());
    drop(exec);
    drop(graph);
    s.synchronize().unwrap();
    side.synchronize().unwrap();
    assert_eq!(
        held - allocated().current,
        2 * block,
        "the held blocks are freed"
    );
    d.empty_cache().unwrap();
    assert!(
        kept - reserved() >= allocation_size(block as usize) as u64,
        "the pool's segment is released with the graph gone ({kept} -> {})",
        reserved()
    );
}
