//! Mirrors of PyTorch's caching-allocator tests (test/test_cuda.py), on the host backend.

use hip_rt::caching::{
    AllocError, AllocatorConfig, BlockState, CachingAllocator, ConfigError, HostBackend,
    HostStream, OomHint, StatType, MIB,
};

const DEFAULT: HostStream = HostStream::DEFAULT;

fn allocator(capacity: usize) -> (HostBackend, CachingAllocator<HostBackend>) {
    let host = HostBackend::new(capacity);
    let alloc = CachingAllocator::with_config(host.clone(), AllocatorConfig::default())
        .expect("host allocator");
    (host, alloc)
}

fn oom(err: AllocError) -> hip_rt::caching::OutOfMemory {
    match err {
        AllocError::OutOfMemory(o) => *o,
        other => panic!("expected OutOfMemory, got {other}"),
    }
}

/// test_memory_stats: a 256-float tensor (1 KiB) on a fresh allocator.
#[test]
fn memory_stats_exact_after_256_float_alloc() {
    let (host, alloc) = allocator(1 << 30);
    let tmp = alloc.allocate(256 * 4, DEFAULT).unwrap();
    let s = alloc.stats();
    let small = StatType::SmallPool;
    assert_eq!(s.allocated_bytes.all().current, 1024);
    assert_eq!(s.allocated_bytes.get(small).current, 1024);
    assert_eq!(s.allocated_bytes.get(StatType::LargePool).current, 0);
    assert_eq!(s.active_bytes.all().current, 1024);
    assert_eq!(s.active_bytes.all().freed, 0);
    assert_eq!(s.requested_bytes.all().current, 1024);
    assert_eq!(s.reserved_bytes.all().current, 2 * MIB as u64);
    assert_eq!(s.inactive_split_bytes.all().current, 2 * MIB as u64 - 1024);
    assert_eq!(s.inactive_split.all().current, 1);
    assert_eq!(s.segment.all().current, 1);
    assert_eq!(s.allocation.all().current, 1);
    assert_eq!(s.active.all().current, 1);
    assert_eq!((s.num_device_alloc, s.num_device_free), (1, 0));
    assert_eq!(host.counters().mallocs, 1);

    drop(tmp);
    let s = alloc.stats();
    assert_eq!(s.active_bytes.all().current, 0);
    assert_eq!(s.active_bytes.all().freed, 1024);
    assert_eq!(s.active_bytes.all().peak, 1024);
    assert_eq!(s.allocated_bytes.all().current, 0);
    assert_eq!(
        s.reserved_bytes.all().current,
        2 * MIB as u64,
        "segment stays cached"
    );
    assert_eq!(
        s.inactive_split.all().current,
        0,
        "merged back into one block"
    );
    assert_eq!(s.inactive_split_bytes.all().current, 0);

    alloc.empty_cache().unwrap();
    let s = alloc.stats();
    assert_eq!(s.reserved_bytes.all().current, 0);
    assert_eq!(s.reserved_bytes.all().peak, 2 * MIB as u64);
    assert_eq!(s.num_device_free, 1);
    assert_eq!(host.used(), 0);
    alloc.reset_peak_stats();
    assert_eq!(alloc.stats().reserved_bytes.all().peak, 0);
    alloc.reset_accumulated_stats();
    let s = alloc.stats();
    assert_eq!((s.active_bytes.all().allocated, s.num_device_alloc), (0, 0));
}

#[test]
fn flat_stats_use_pytorch_keys() {
    let (_host, alloc) = allocator(1 << 30);
    let _tmp = alloc.allocate(1000, DEFAULT).unwrap();
    let flat = alloc.stats().to_flat();
    let get = |k: &str| flat.iter().find(|(key, _)| key == k).map(|kv| kv.1);
    assert_eq!(get("allocated_bytes.all.current"), Some(1024));
    assert_eq!(get("requested_bytes.small_pool.current"), Some(1000));
    assert_eq!(get("reserved_bytes.large_pool.current"), Some(0));
    assert_eq!(get("num_device_alloc"), Some(1));
}

/// test_out_of_memory: absurd requests fail cleanly and leave other memory usable.
#[test]
fn out_of_memory_then_memory_still_works() {
    let (_host, alloc) = allocator(64 * MIB);
    let tensor = alloc.allocate(1024 * 4, DEFAULT).unwrap();
    let err = oom(alloc
        .allocate(1024 * 1024 * 1024 * 800_000_000, DEFAULT)
        .unwrap_err());
    let text = err.to_string();
    assert!(text.contains("800000000.00 GiB"), "{text}");
    assert_eq!(err.hint, OomHint::Exhausted, "{text}");
    let err = alloc
        .allocate(1024 * 1024 * 1024 * 8_000_000_000, DEFAULT)
        .unwrap_err();
    assert!(matches!(err, AllocError::TooLarge { .. }), "{err}");
    // The surviving allocation is still real memory.
    let p = tensor.ptr().0 as *mut u8;
    // SAFETY: `tensor` is a live 4 KiB host allocation from the host backend.
    unsafe { std::ptr::write_bytes(p, 1, tensor.size()) };
    // SAFETY: as above; the 4096 bytes were just initialised.
    let all_ones = unsafe { std::slice::from_raw_parts(p, tensor.size()) }
        .iter()
        .all(|&b| b == 1);
    assert!(all_ones);
    assert_eq!(alloc.stats().num_ooms, 1);
}

/// test_out_of_memory_retry: half the device fails while another half is held, then works.
#[test]
fn out_of_memory_retry_after_free() {
    let (host, alloc) = allocator(64 * MIB);
    let _small = alloc.allocate(4096, DEFAULT).unwrap();
    let size = 32 * MIB;
    let a = alloc.allocate(size, DEFAULT).unwrap();
    let err = oom(alloc.allocate(size, DEFAULT).unwrap_err());
    assert_eq!(
        (err.requested, err.rounded, err.segment_size),
        (size, size, size)
    );
    assert_eq!(err.capacity, 64 * MIB);
    assert_eq!(err.free, 30 * MIB);
    assert_eq!(err.allocated, size + 4096);
    assert_eq!(err.reserved, 34 * MIB);
    assert_eq!(err.hint, OomHint::Exhausted);
    let text = err.to_string();
    for needle in [
        "device 0",
        "32.00 MiB",
        "64.00 MiB",
        "30.00 MiB free",
        "Hint",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in {text}");
    }
    let s = alloc.stats();
    assert_eq!((s.num_ooms, s.num_alloc_retries), (1, 1));

    drop(a);
    let mallocs = host.counters().mallocs;
    let b = alloc.allocate(size, DEFAULT).unwrap();
    assert_eq!(host.counters().mallocs, mallocs, "served from the cache");
    drop(b);
    alloc.empty_cache().unwrap();
    assert_eq!(alloc.stats().reserved_bytes.all().current, 2 * MIB as u64);
}

/// test_set_per_process_memory_fraction.
#[test]
fn memory_fraction_0_499_fits_0_5_does_not() {
    let capacity = 100 * MIB;
    let (_host, alloc) = allocator(capacity);
    for bad in [-0.1, 2.0, f64::NAN] {
        let err = alloc.set_memory_fraction(bad).unwrap_err();
        assert!(
            matches!(err, AllocError::Config(ConfigError::InvalidFraction(_))),
            "{err}"
        );
    }
    let tensor = alloc.allocate(1024 * 4, DEFAULT).unwrap();
    alloc.empty_cache().unwrap();
    alloc.set_memory_fraction(0.5).unwrap();

    let max_reserved = alloc.stats().reserved_bytes.all().peak as usize;
    let application = (capacity as f64 * 0.499) as usize - max_reserved;
    let tmp = alloc.allocate(application, DEFAULT).unwrap();
    drop(tmp);
    alloc.empty_cache().unwrap();

    let application = (capacity as f64 * 0.5) as usize;
    let err = oom(alloc.allocate(application, DEFAULT).unwrap_err());
    assert_eq!(err.fraction, Some((0.5, capacity / 2)));
    assert_eq!(err.hint, OomHint::FractionCap);
    assert!(err.to_string().contains("memory fraction cap 0.5"), "{err}");
    assert_eq!(tensor.size(), 4096, "earlier allocation unaffected");
}

/// test_record_stream: a block used on another stream is not reused before that stream's
/// event completes, and is reused on its own stream after.
#[test]
fn record_stream_delays_reuse_until_event_completes() {
    let (host, alloc) = allocator(1 << 30);
    let side = host.new_stream();
    let tmp = alloc.allocate(16, side).unwrap();
    let ptr = tmp.ptr();
    tmp.record_stream(DEFAULT).unwrap();
    drop(tmp);
    assert_eq!(host.pending_events(DEFAULT), 1);
    let s = alloc.stats();
    assert_eq!((s.allocation.all().current, s.active.all().current), (0, 1));

    let tmp2 = alloc.allocate(16, side).unwrap();
    assert_ne!(tmp2.ptr(), ptr, "allocation re-used too soon");

    host.complete_stream(DEFAULT);
    let tmp3 = alloc.allocate(16, side).unwrap();
    assert_eq!(tmp3.ptr(), ptr, "allocation not re-used");
    assert_eq!(
        host.counters().event_syncs,
        0,
        "no host sync on the allocation path"
    );
    drop((tmp2, tmp3));
}

/// Recording the allocation stream itself is a no-op, and a block freed on one stream is
/// never handed to another stream.
#[test]
fn blocks_stay_on_their_stream() {
    let (host, alloc) = allocator(1 << 30);
    let side = host.new_stream();
    let a = alloc.allocate(4096, DEFAULT).unwrap();
    a.record_stream(DEFAULT).unwrap();
    let ptr = a.ptr();
    drop(a);
    assert_eq!(host.counters().events_recorded, 0);
    let b = alloc.allocate(4096, side).unwrap();
    assert_ne!(b.ptr(), ptr);
    let c = alloc.allocate(4096, DEFAULT).unwrap();
    assert_eq!(c.ptr(), ptr);
    let snap = alloc.snapshot();
    assert_eq!(snap.segments.len(), 2);
    assert!(snap.segments.iter().any(|s| s.stream == side));
}

/// test_caching_allocator_record_stream_oom: blocks held back by record_stream are released
/// by the out-of-memory retry instead of failing.
#[test]
fn record_stream_blocks_released_by_oom_retry() {
    let (host, alloc) = allocator(64 * MIB);
    let stream = host.new_stream();
    let _y = alloc.allocate(16 * MIB, stream).unwrap();
    for _ in 0..100 {
        let x = alloc.allocate(16 * MIB, DEFAULT).unwrap();
        x.record_stream(stream).unwrap();
        drop(x);
    }
    let s = alloc.stats();
    assert_eq!(s.num_ooms, 0);
    assert!(s.num_alloc_retries >= 30, "{}", s.num_alloc_retries);
    assert!(host.counters().event_syncs > 0);
    alloc.empty_cache().unwrap();
    assert_eq!(alloc.stats().reserved_bytes.all().current, 16 * MIB as u64);
    alloc.check_err().unwrap();
}

/// Config parsing: PyTorch syntax accepted, unknown keys and bad values named.
#[test]
fn config_parsing() {
    let c =
        AllocatorConfig::parse("max_split_size_mb:128,garbage_collection_threshold:0.8").unwrap();
    assert_eq!(c.max_split_size, 128 * MIB);
    assert_eq!(c.garbage_collection_threshold, 0.8);
    assert_eq!(c.memory_fraction, None);
    let c = AllocatorConfig::parse(" per_process_memory_fraction : 0.25 , ").unwrap();
    assert_eq!(c.memory_fraction, Some(0.25));
    assert_eq!(
        AllocatorConfig::parse("").unwrap(),
        AllocatorConfig::default()
    );

    let rejected = [
        ("max_split_size_mb:20", "`20`"),
        ("max_split_size_mb:abc", "`abc`"),
        ("max_split_size_mb:-5", "`-5`"),
        (
            "garbage_collection_threshold:1.0",
            "garbage_collection_threshold",
        ),
        ("garbage_collection_threshold:0", "`0`"),
        ("per_process_memory_fraction:1.5", "`1.5`"),
        ("foo:1", "unknown option `foo`"),
        ("expandable_segments:True", "`expandable_segments`"),
        ("max_split_size_mb", "has no value"),
        ("max_split_size_mb:64,max_split_size_mb:64", "twice"),
    ];
    for (text, needle) in rejected {
        let err = AllocatorConfig::parse(text).expect_err(text);
        let msg = err.to_string();
        assert!(msg.contains(needle), "{text}: {msg}");
        assert!(msg.contains("HIPK_ALLOC_CONF"), "{text}: {msg}");
    }
}

#[test]
fn config_from_string_drives_the_allocator() {
    let host = HostBackend::new(1 << 30);
    let config = AllocatorConfig::parse("per_process_memory_fraction:0.5").unwrap();
    let alloc = CachingAllocator::with_config(host, config).unwrap();
    assert!(alloc.allocate(600 * MIB, DEFAULT).is_err());
    assert!(alloc.allocate(400 * MIB, DEFAULT).is_ok());
}

#[test]
fn snapshot_shows_pending_blocks() {
    let (host, alloc) = allocator(1 << 30);
    let side = host.new_stream();
    let a = alloc.allocate(3 * MIB, DEFAULT).unwrap();
    a.record_stream(side).unwrap();
    drop(a);
    let snap = alloc.snapshot();
    assert_eq!(snap.segments.len(), 1);
    let seg = &snap.segments[0];
    assert_eq!(seg.total_size, 20 * MIB);
    assert!(!seg.is_small);
    assert_eq!(seg.blocks[0].state, BlockState::ActivePendingFree);
    assert_eq!(seg.blocks[0].size, 3 * MIB);
    assert_eq!(seg.blocks[1].state, BlockState::Inactive);
    assert_eq!((seg.active_size, seg.allocated_size), (3 * MIB, 0));
}
