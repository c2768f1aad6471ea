//! The caching allocator on a real device: `cargo test -p hip-rt --features device`.
//!
//! NEVER RUN ON HARDWARE: no GPU existed where this was written; it compiles and is listed
//! (`-- --list`). Without a device it fails at once with a message saying so.
#![cfg(feature = "device")]

mod common;

use std::sync::Arc;

use hip_rt::caching::{CachingAllocator, HipBackend};
use hip_rt::{
    Device, DeviceBuffer, Event, EventOptions, LaunchConfig, Module, Stream, StreamOptions,
};

/// Element counts (f32) from 4 B to 24 MiB: both pools, split and oversize paths.
const SIZES: [usize; 7] = [1, 255, 4096, 300_000, 2_700_000, 6_000_000, 1_000];

/// A training-like loop: each step allocates buffers of mixed sizes on two streams, a
/// kernel writes a step-specific value into each, one buffer is read on the other stream
/// (event-ordered, so the allocator must delay its reuse), half the buffers are freed while
/// kernels may still run, and new ones reuse the cache. Every buffer is checked on the host.
#[test]
fn training_loop_on_two_streams_keeps_blocks_intact() {
    let probe = Device::get(0).unwrap_or_else(|e| {
        panic!("the `device` tests need a HIP device, and none is usable: {e}")
    });
    let cache = Arc::new(CachingAllocator::new(HipBackend::new(0)).expect("HIPK_ALLOC_CONF"));
    let d = Device::with_allocator(0, cache.clone()).expect("device with the caching allocator");
    let streams = [
        Stream::new(&d, StreamOptions::default()).unwrap(),
        Stream::new(&d, StreamOptions::default()).unwrap(),
    ];
    let bytes = common::build_bundle(&[probe.arch()])
        .unwrap_or_else(|e| panic!("building the test kernels: {e}"));
    let module = Module::load(&d, &bytes).unwrap();
    let add = module.function("hipk_test_add").unwrap();

    let mut kept: Vec<(DeviceBuffer<f32>, f32)> = Vec::new();
    for step in 0..30usize {
        for (i, &n) in SIZES.iter().enumerate() {
            let s = &streams[(step + i) % 2];
            let mut x = DeviceBuffer::<f32>::zeroed(s, n).unwrap();
            let v = (step * 16 + i) as f32;
            let cfg = LaunchConfig::for_num_elems(n as u64, add.limits()).unwrap();
            // SAFETY: hipk_test_add(float*, float, int) gets a buffer of n floats, v and n.
            unsafe {
                s.launch_builder(&add)
                    .arg_mut(&mut x)
                    .value(v)
                    .value(n as i32)
                    .launch(&cfg)
            }
            .unwrap();
            kept.push((x, v));
        }
        // Read the newest buffer on the other stream, after its producer.
        let (src, v) = kept.last().unwrap();
        let (producer, consumer) = (
            &streams[(step + SIZES.len() - 1) % 2],
            &streams[(step + SIZES.len()) % 2],
        );
        let ready = Event::new(&d, EventOptions::NO_TIMING).unwrap();
        producer.record(&ready).unwrap();
        consumer.wait(&ready).unwrap();
        let mut copy = DeviceBuffer::<f32>::zeroed(consumer, src.len()).unwrap();
        consumer.copy_dtod(src, &mut copy).unwrap();
        let v = *v;
        kept.push((copy, v));
        // Free every other buffer (stream-ordered) while work may still be queued.
        let mut index = 0;
        kept.retain(|_| {
            index += 1;
            index % 2 == 0
        });
        for s in &streams {
            s.synchronize().unwrap();
        }
        for (buf, v) in &kept {
            let host = buf.to_vec(&streams[0]).unwrap();
            assert!(
                host.iter().all(|&x| x == *v),
                "step {step}: buffer of {} floats corrupted (expected {v})",
                buf.len()
            );
        }
        if kept.len() > 40 {
            kept.drain(..20);
        }
    }
    drop(kept);
    for s in &streams {
        s.synchronize().unwrap();
    }
    let stats = cache.stats();
    assert_eq!(stats.allocation.all().current, 0);
    assert!(
        stats.num_device_alloc < stats.allocation.all().allocated / 4,
        "the cache should serve most allocations: {stats:?}"
    );
    cache.empty_cache().unwrap();
    cache.check_err().unwrap();
    d.check_err().unwrap();
}
