//! Capacity accounting with a small `HIPK_EMU_MEMORY` and two devices (own process: the library
//! reads its environment once).

#[path = "../../tests/common/mod.rs"]
mod common;

use std::sync::Arc;

use hip_rt::caching::{CachingAllocator, HipBackend};
use hip_rt::{Device, DeviceBuffer, Stream, StreamOptions};

const CAPACITY: usize = 64 << 20;

fn setup() {
    common::setup(&[("HIPK_EMU_MEMORY", "64M"), ("HIPK_EMU_DEVICES", "2")]);
}

#[test]
fn out_of_memory_is_typed_and_memory_comes_back() {
    setup();
    assert_eq!(Device::count().unwrap(), 2);
    let dev = Device::get_direct(1).unwrap();
    assert_eq!(dev.total_memory(), CAPACITY);
    let stream = Stream::new(&dev, StreamOptions::default()).unwrap();
    let a = DeviceBuffer::<u8>::alloc(&stream, 40 << 20).unwrap();
    assert_eq!(dev.memory_info().unwrap().free, CAPACITY - (40 << 20));
    let err = DeviceBuffer::<u8>::alloc(&stream, 40 << 20).unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("device 1") && text.contains("24 MiB free of 64 MiB"),
        "{text}"
    );
    let detail = common::last_message();
    assert!(
        detail.contains("HIPK_EMU_MEMORY") && detail.contains("41943040 requested"),
        "{detail}"
    );
    drop(a);
    assert_eq!(dev.memory_info().unwrap().free, CAPACITY);
    // Device 0 has its own 64 MiB (the other test of this file uses it).
    assert_eq!(Device::get_direct(0).unwrap().total_memory(), CAPACITY);
    assert!(DeviceBuffer::<u8>::alloc(&stream, 60 << 20).is_ok());
}

#[test]
fn caching_allocator_frees_its_cache_and_retries_on_out_of_memory() {
    setup();
    let cache = Arc::new(CachingAllocator::new(HipBackend::new(0)).expect("allocator config"));
    let dev = Device::with_allocator(0, cache.clone()).unwrap();
    let stream = Stream::new(&dev, StreamOptions::default()).unwrap();
    // Fill the device with cached (freed but held) blocks, then ask for one larger block:
    // only releasing the cache to hipFree makes room, which the allocator must do itself.
    for _ in 0..2 {
        let held: Vec<DeviceBuffer<u8>> = (0..5)
            .map(|_| DeviceBuffer::alloc(&stream, 10 << 20).unwrap())
            .collect();
        drop(held);
    }
    let before = cache.stats();
    let big = DeviceBuffer::<u8>::alloc(&stream, 48 << 20).expect("the cache is released on OOM");
    assert_eq!(big.len(), 48 << 20);
    let after = cache.stats();
    assert!(
        after.num_alloc_retries > before.num_alloc_retries,
        "{after:?}"
    );
    assert!(
        after.num_device_free > before.num_device_free,
        "the cache went back to hipFree"
    );
    assert_eq!(after.num_ooms, before.num_ooms);
    // Larger than the whole device: a typed OOM even after releasing everything.
    drop(big);
    let err = DeviceBuffer::<u8>::alloc(&stream, 65 << 20).unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    assert_eq!(cache.stats().num_ooms, after.num_ooms + 1);
}

#[test]
fn the_current_device_is_per_thread() {
    setup();
    let (set, get) = (
        hip_sys::sym!(hipSetDevice).unwrap(),
        hip_sys::sym!(hipGetDevice).unwrap(),
    );
    let current = move || {
        let mut d = -1;
        // SAFETY: a valid out-pointer.
        unsafe { get(&mut d) }.result().unwrap();
        d
    };
    // SAFETY: plain integers; hip-emu validates them.
    unsafe {
        set(1).result().unwrap();
        assert_eq!(set(2), hip_sys::hipError_t::hipErrorInvalidDevice);
    }
    assert_eq!(current(), 1);
    assert_eq!(
        std::thread::spawn(current).join().unwrap(),
        0,
        "a new thread starts on device 0"
    );
    assert_eq!(current(), 1);
}
