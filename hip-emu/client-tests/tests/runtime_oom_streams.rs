//! The caching allocator's out-of-memory path with two streams on a small emulated device
//! (issue 19, defect 5): it releases what it can (all streams) and retries before failing, and
//! the hint names the memory stranded on the other stream instead of suggesting
//! `max_split_size_mb`. Own process: the library reads `HIPK_EMU_MEMORY` once.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::sync::Arc;

use hip_rt::caching::{AllocatorConfig, CachingAllocator, HipBackend};
use hip_rt::{Device, DeviceBuffer, Stream, StreamOptions};

#[test]
fn memory_stranded_on_another_stream_is_named_after_release_and_retry() {
    common::setup(&[("HIPK_EMU_MEMORY", "32M"), ("HIPK_EMU_DEVICES", "1")]);
    for conf in ["", "max_split_size_mb:21"] {
        let config = AllocatorConfig::parse(conf).unwrap();
        let cache = Arc::new(CachingAllocator::with_config(HipBackend::new(0), config).unwrap());
        let dev = Device::with_allocator(0, cache.clone()).unwrap();
        let (main, side) = (
            Stream::new(&dev, StreamOptions::default()).unwrap(),
            Stream::new(&dev, StreamOptions::default()).unwrap(),
        );
        // Side stream: a 20 MiB segment with a live 2 MiB block and 18 MiB free next to it,
        // and a whole 12 MiB segment, cached.
        let live = DeviceBuffer::<u8>::alloc(&side, 2 << 20).unwrap();
        let freed = DeviceBuffer::<u8>::alloc(&side, 8 << 20).unwrap();
        // 512 B short of 12 MiB: hip-emu's guard byte after every block (hip-rt's caching
        // allocator on hip-emu) then still rounds it to exactly one 12 MiB segment.
        let whole = DeviceBuffer::<u8>::alloc(&side, (12 << 20) - 512).unwrap();
        drop((freed, whole));
        side.synchronize().unwrap();
        let err = DeviceBuffer::<u8>::alloc(&main, 16 << 20).unwrap_err();
        assert!(err.is_out_of_memory(), "{err}");
        let text = err.to_string();
        assert!(
            text.contains("18.00 MiB is free in cached blocks of other streams"),
            "{conf}: {text}"
        );
        assert!(!text.contains("max_split_size_mb:21 so"), "{conf}: {text}");
        let stats = cache.stats();
        assert_eq!(
            (
                stats.num_alloc_retries,
                stats.num_ooms,
                stats.num_device_free
            ),
            (1, 1, 1),
            "{conf}: the whole cached segment went back and the allocation was retried"
        );
        // On the side stream the cached 18 MiB serves it.
        let served = DeviceBuffer::<u8>::alloc(&side, 16 << 20).unwrap();
        assert_eq!(cache.stats().num_device_alloc, 2, "{conf}: no new segment");
        drop((served, live));
        side.synchronize().unwrap();
        cache.empty_cache().unwrap();
        assert_eq!(dev.memory_info().unwrap().free, 32 << 20, "{conf}");
    }
}
