//! Stream capture and graphs on hip-emu through hip-rt (issue 35 §4): capture records instead
//! of running, one `hipGraphLaunch` replays everything (hip-emu's counters), a refused call
//! invalidates the capture, an update swaps arguments, a replay repeats the eager checks, and
//! the caching allocator holds the blocks freed during a capture until the graph is gone.
//! Copies and memsets only: no kernel build needed (the kernels' graph test is hip-kernels'
//! tests/device_graph.rs).

#[path = "../../tests/common/mod.rs"]
mod common;

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};

use hip_rt::caching::{AllocatorConfig, CachingAllocator, HipBackend, StatType};
use hip_rt::emu::{self, StatsScope};
use hip_rt::{
    CaptureMode, CaptureStatus, Device, DeviceBuffer, DirectAllocator, Stream, StreamOptions,
    UpdateRefused,
};
use hip_sys::hipError_t;

/// The tests share device 0 (and its graph state); run them one at a time.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    common::setup(&[("HIPK_EMU_DEVICES", "1")]);
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// A device with a private caching allocator (so its statistics are this test's own).
fn cached_device() -> (Device, Arc<CachingAllocator<HipBackend>>) {
    let cache = Arc::new(
        CachingAllocator::with_config(HipBackend::new(0), AllocatorConfig::default()).unwrap(),
    );
    (Device::with_allocator(0, cache.clone()).unwrap(), cache)
}

/// Blocks the cache counts as allocated.
fn live(cache: &CachingAllocator<HipBackend>) -> u64 {
    cache.stats().allocation.get(StatType::All).current
}

fn hip_code(e: &hip_rt::Error) -> Option<hipError_t> {
    match e {
        hip_rt::Error::Sys(hip_sys::Error::Hip(h)) => Some(h.code),
        _ => None,
    }
}

#[test]
fn a_captured_graph_runs_only_when_launched_and_counts_one_launch_each_time() {
    let _s = serial();
    assert!(hip_rt::graph::supported());
    let (dev, _) = cached_device();
    let stream = Stream::new(&dev, StreamOptions::default()).unwrap();
    let n = 1000;
    let mut a = DeviceBuffer::<u32>::zeroed(&stream, n).unwrap();
    let mut b = DeviceBuffer::<u32>::zeroed(&stream, n).unwrap();
    stream.synchronize().unwrap();
    let graph = stream
        .capture(CaptureMode::Global, |s| {
            assert_eq!(s.capture_status()?, CaptureStatus::Active);
            s.memset_bytes(&mut a, 1)?;
            s.copy_dtod(&a, &mut b)
        })
        .unwrap();
    assert_eq!(stream.capture_status().unwrap(), CaptureStatus::None);
    assert_eq!(graph.node_count().unwrap(), 2);
    assert_eq!(b.to_vec(&stream).unwrap(), vec![0; n], "nothing ran yet");
    let exec = graph.instantiate().unwrap();
    drop(graph); // the executable keeps its own copy
    let before = emu::stats(StatsScope::Thread).unwrap();
    for _ in 0..3 {
        // SAFETY: `a` and `b`, the graph's only memory, outlive the launches.
        unsafe { exec.launch(&stream) }.unwrap();
    }
    stream.synchronize().unwrap();
    let d = emu::stats(StatsScope::Thread).unwrap().since(&before);
    assert_eq!((d.graph_launches, d.graph_nodes, d.launches), (3, 6, 0));
    assert_eq!((d.memsets, d.bytes_dtod), (3, 3 * 4 * n as u64));
    assert_eq!(b.to_vec(&stream).unwrap(), vec![0x0101_0101; n]);
}

#[test]
fn a_call_that_waits_invalidates_the_capture() {
    let _s = serial();
    let (dev, cache) = cached_device();
    let stream = Stream::new(&dev, StreamOptions::default()).unwrap();
    let mut a = DeviceBuffer::<u8>::zeroed(&stream, 64).unwrap();
    stream.begin_capture(CaptureMode::Global).unwrap();
    assert!(cache.capturing());
    stream.memset_bytes(&mut a, 3).unwrap();
    let e = stream.synchronize().unwrap_err();
    assert_eq!(
        hip_code(&e),
        Some(hipError_t::hipErrorStreamCaptureUnsupported),
        "{e}"
    );
    assert_eq!(stream.capture_status().unwrap(), CaptureStatus::Invalidated);
    // A synchronous copy on the capturing stream's device (legacy null stream) is refused too.
    let e = a.to_vec(&Stream::null(&dev)).unwrap_err();
    assert_eq!(
        hip_code(&e),
        Some(hipError_t::hipErrorStreamCaptureImplicit),
        "{e}"
    );
    let e = stream.end_capture().unwrap_err();
    assert_eq!(
        hip_code(&e),
        Some(hipError_t::hipErrorStreamCaptureInvalidated),
        "{e}"
    );
    assert!(e.to_string().contains("hipStreamSynchronize"), "{e}");
    assert!(!cache.capturing(), "the allocator stops holding frees");
    assert_eq!(
        a.to_vec(&stream).unwrap(),
        vec![0; 64],
        "nothing captured ran"
    );
    // The null stream cannot be captured.
    let e = Stream::null(&dev)
        .begin_capture(CaptureMode::Relaxed)
        .unwrap_err();
    assert_eq!(
        hip_code(&e),
        Some(hipError_t::hipErrorStreamCaptureUnsupported),
        "{e}"
    );
    assert!(!cache.capturing());
}

#[test]
fn update_swaps_addresses_and_refuses_another_shape() {
    let _s = serial();
    let (dev, _) = cached_device();
    let stream = Stream::new(&dev, StreamOptions::default()).unwrap();
    let mut one = DeviceBuffer::<u8>::zeroed(&stream, 256).unwrap();
    let mut two = DeviceBuffer::<u8>::zeroed(&stream, 256).unwrap();
    let first = stream
        .capture(CaptureMode::Global, |s| s.memset_bytes(&mut one, 1))
        .unwrap();
    let mut exec = first.instantiate().unwrap();
    let second = stream
        .capture(CaptureMode::Global, |s| s.memset_bytes(&mut two, 2))
        .unwrap();
    assert_eq!(exec.update(&second).unwrap(), Ok(()));
    // SAFETY: both buffers outlive the launch.
    unsafe { exec.launch(&stream) }.unwrap();
    assert_eq!(two.to_vec(&stream).unwrap(), vec![2; 256]);
    assert_eq!(
        one.to_vec(&stream).unwrap(),
        vec![0; 256],
        "the old node is gone"
    );
    let bigger = stream
        .capture(CaptureMode::Global, |s| {
            s.memset_bytes(&mut one, 5)?;
            s.memset_bytes(&mut two, 6)
        })
        .unwrap();
    assert_eq!(
        exec.update(&bigger).unwrap(),
        Err(UpdateRefused::TopologyChanged)
    );
}

#[test]
fn a_replay_repeats_the_eager_checks() {
    let _s = serial();
    // The direct allocator frees with hipFree: the graph's buffer is really gone.
    let dev = Device::with_allocator(0, Arc::new(DirectAllocator::new(0))).unwrap();
    let stream = Stream::new(&dev, StreamOptions::default()).unwrap();
    let mut a = DeviceBuffer::<u8>::zeroed(&stream, 64).unwrap();
    let exec = stream
        .capture(CaptureMode::Global, |s| s.memset_bytes(&mut a, 9))
        .unwrap()
        .instantiate()
        .unwrap();
    drop(a);
    // SAFETY: deliberately broken contract, caught by hip-emu's launch-time check before anything
    // is queued (on a GPU this would be a use after free).
    let e = unsafe { exec.launch(&stream) }.unwrap_err();
    assert_eq!(hip_code(&e), Some(hipError_t::hipErrorInvalidValue), "{e}");
    assert!(e.to_string().contains("hipGraphLaunch: node 0"), "{e}");
    // With the direct allocator a free during a capture is hipFree, which waits: refused.
    let mut b = DeviceBuffer::<u8>::zeroed(&stream, 64).unwrap();
    stream.begin_capture(CaptureMode::Global).unwrap();
    stream.memset_bytes(&mut b, 1).unwrap();
    drop(b);
    let e = stream.end_capture().unwrap_err();
    assert_eq!(
        hip_code(&e),
        Some(hipError_t::hipErrorStreamCaptureInvalidated),
        "{e}"
    );
    let dropped = dev.check_err().unwrap_err();
    assert_eq!(
        hip_code(&dropped),
        Some(hipError_t::hipErrorStreamCaptureUnsupported),
        "{dropped}"
    );
}

#[test]
fn blocks_freed_during_a_capture_stay_with_the_graph_until_it_drops() {
    let _s = serial();
    let (dev, cache) = cached_device();
    let stream = Stream::new(&dev, StreamOptions::default()).unwrap();
    let n = 4096;
    let mut out = DeviceBuffer::<u8>::zeroed(&stream, 3 * n).unwrap();
    let mut early = DeviceBuffer::<u8>::alloc(&stream, n).unwrap();
    stream.synchronize().unwrap();
    let live_before = live(&cache);
    let mut freed_in_capture = HashSet::new();
    let mut x_ptr = None;
    let graph = stream
        .capture(CaptureMode::Global, |s| {
            // Allocated before, used and freed inside: held for the graph.
            s.memset_bytes(&mut early, 3)?;
            s.copy_dtod(&early, &mut out.slice_mut(2 * n..)?)?;
            freed_in_capture.insert(early.device_ptr());
            drop(std::mem::replace(&mut early, DeviceBuffer::alloc(s, 1)?));
            // Allocated, used and freed inside; then a request of the same size on the same
            // stream: the capture's private pool hands the block back (the replay runs in the
            // captured stream order, so the reuse is ordered as in eager mode).
            let mut x = DeviceBuffer::<u8>::alloc(s, n)?;
            s.memset_bytes(&mut x, 1)?;
            s.copy_dtod(&x, &mut out.slice_mut(..n)?)?;
            x_ptr = Some(x.device_ptr());
            freed_in_capture.insert(x.device_ptr());
            drop(x);
            let mut y = DeviceBuffer::<u8>::alloc(s, n)?;
            assert_eq!(
                Some(y.device_ptr()),
                x_ptr,
                "a block freed during the capture on its stream is reused by the capture"
            );
            s.memset_bytes(&mut y, 2)?;
            s.copy_dtod(&y, &mut out.slice_mut(n..2 * n)?)?;
            drop(y);
            Ok(())
        })
        .unwrap();
    drop(early);
    assert_eq!(
        live(&cache),
        live_before,
        "the early block is held (still counted); x/y's block is back in the graph's pool, \
         which counts as reserved, not allocated; the 1-byte stand-in was freed after the capture"
    );
    let exec = graph.instantiate().unwrap();
    drop(graph);
    // After the capture, eager requests of the same size get other blocks: the graph still
    // writes the held ones at every launch.
    let mut eager = DeviceBuffer::<u8>::alloc(&stream, n).unwrap();
    assert!(!freed_in_capture.contains(&eager.device_ptr()));
    stream.memset_bytes(&mut eager, 7).unwrap();
    for _ in 0..2 {
        // SAFETY: `out` is alive; the graph's temporaries are held by the executable.
        unsafe { exec.launch(&stream) }.unwrap();
    }
    let got = out.to_vec(&stream).unwrap();
    assert!(
        got[..n].iter().all(|&v| v == 1),
        "x's contents were copied before y reused it"
    );
    assert!(got[n..2 * n].iter().all(|&v| v == 2));
    assert!(got[2 * n..].iter().all(|&v| v == 3));
    assert_eq!(eager.to_vec(&stream).unwrap(), vec![7; n], "not clobbered");
    drop(eager);
    // The executable was the last holder: its blocks go back to the cache, stream-ordered.
    drop(exec);
    assert_eq!(live(&cache), live_before - 1);
    let again = DeviceBuffer::<u8>::alloc(&stream, n).unwrap();
    let reused = DeviceBuffer::<u8>::alloc(&stream, n).unwrap();
    assert!(
        freed_in_capture.contains(&again.device_ptr())
            || freed_in_capture.contains(&reused.device_ptr()),
        "the held blocks are reusable once the graph is gone"
    );
    cache.check_err().unwrap();
    dev.check_err().unwrap();
}
