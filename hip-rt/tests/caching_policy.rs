//! The policy's rules one by one: rounding, pools, splitting, `max_split_size`, garbage
//! collection, raw handles, backend failures in `Drop`, and concurrent use.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use hip_rt::caching::{
    allocation_size, round_size, AllocError, AllocatorConfig, Backend, BackendError,
    CachingAllocator, DevicePtr, HostBackend, HostEvent, HostStream, MemInfo, OomHint, MIB,
};

const S0: HostStream = HostStream::DEFAULT;

fn allocator_with(capacity: usize, conf: &str) -> (HostBackend, CachingAllocator<HostBackend>) {
    let host = HostBackend::new(capacity);
    let config = AllocatorConfig::parse(conf).unwrap();
    (
        host.clone(),
        CachingAllocator::with_config(host, config).unwrap(),
    )
}

#[test]
fn rounding_and_segment_sizes() {
    assert_eq!(round_size(1), 512);
    assert_eq!(round_size(512), 512);
    assert_eq!(round_size(513), 1024);
    assert_eq!(allocation_size(MIB), 2 * MIB);
    assert_eq!(allocation_size(MIB + 512), 20 * MIB);
    assert_eq!(allocation_size(10 * MIB - 512), 20 * MIB);
    assert_eq!(allocation_size(10 * MIB), 10 * MIB);
    assert_eq!(allocation_size(10 * MIB + 512), 12 * MIB);
}

#[test]
fn small_requests_pack_into_one_segment_and_merge_back() {
    let (host, alloc) = allocator_with(1 << 30, "");
    let blocks: Vec<_> = (0..8)
        .map(|_| alloc.allocate(100_000, S0).unwrap())
        .collect();
    assert_eq!(
        host.counters().mallocs,
        1,
        "8 x ~98 KiB share one 2 MiB segment"
    );
    let base = blocks[0].ptr().0;
    for (i, b) in blocks.iter().enumerate() {
        assert_eq!(b.ptr().0, base + (i * round_size(100_000)) as u64);
    }
    drop(blocks);
    let snap = alloc.snapshot();
    assert_eq!(snap.segments[0].blocks.len(), 1, "fully merged");
    assert_eq!(alloc.stats().inactive_split.all().current, 0);
}

#[test]
fn large_pool_splits_only_with_more_than_1mib_left() {
    let (host, alloc) = allocator_with(1 << 30, "");
    // 5 MiB from a 20 MiB segment: 15 MiB remain, split.
    let a = alloc.allocate(5 * MIB, S0).unwrap();
    let b = alloc.allocate(14 * MIB, S0).unwrap();
    assert_eq!(host.counters().mallocs, 1);
    assert_eq!(b.ptr().0, a.ptr().0 + 5 * MIB as u64);
    // 1 MiB left in the segment: not split off, so the next request needs a new segment.
    let c = alloc.allocate(1024, S0).unwrap();
    assert_eq!(
        host.counters().mallocs,
        2,
        "small requests never use the large pool"
    );
    drop((a, b, c));
    let d = alloc.allocate(19 * MIB + 512, S0).unwrap();
    let seg = &alloc.snapshot().segments;
    let large = seg.iter().find(|s| !s.is_small).unwrap();
    assert_eq!(
        large.blocks.len(),
        1,
        "remainder < 1 MiB stays in the block"
    );
    assert_eq!(large.blocks[0].size, 20 * MIB);
    drop(d);
}

#[test]
fn best_fit_picks_the_smallest_block_that_fits() {
    let (_host, alloc) = allocator_with(1 << 30, "");
    let a = alloc.allocate(12 * MIB, S0).unwrap();
    let b = alloc.allocate(16 * MIB, S0).unwrap();
    let c = alloc.allocate(14 * MIB, S0).unwrap();
    let (pa, pc) = (a.ptr(), c.ptr());
    drop((a, b, c));
    assert_eq!(alloc.allocate(13 * MIB, S0).unwrap().ptr(), pc);
    assert_eq!(alloc.allocate(11 * MIB, S0).unwrap().ptr(), pa);
}

#[test]
fn max_split_size_keeps_oversize_blocks_whole() {
    let (host, alloc) = allocator_with(1 << 30, "max_split_size_mb:32");
    let big = alloc.allocate(40 * MIB, S0).unwrap();
    let ptr = big.ptr();
    drop(big);
    // A splittable request does not take the oversize block.
    let mid = alloc.allocate(12 * MIB, S0).unwrap();
    assert_ne!(mid.ptr(), ptr);
    // An oversize request takes it only when it wastes less than 20 MiB.
    let near = alloc.allocate(36 * MIB, S0).unwrap();
    assert_eq!(near.ptr(), ptr);
    assert_eq!(
        alloc
            .snapshot()
            .segments
            .iter()
            .map(|s| s.blocks.len())
            .max(),
        Some(1)
    );
    drop(near);
    let far = alloc.allocate(20 * MIB + 512, S0).unwrap();
    assert_ne!(far.ptr(), ptr, "40 MiB block would waste 20 MiB");
    let s = alloc.stats();
    assert_eq!(s.oversize_segments.current, 1);
    assert_eq!(s.oversize_allocations.current, 0);
    assert_eq!(s.max_split_size, 32 * MIB);
    drop((mid, far));
    assert_eq!(host.live_allocations(), 3);
}

#[test]
fn oversize_cache_released_before_full_flush() {
    // With a split limit, the OOM path first frees an oversize cached segment (no event
    // sync, no retry counted). A 30 MiB request may not take the cached 40 MiB block.
    let (host, alloc) = allocator_with(96 * MIB, "max_split_size_mb:32");
    let a = alloc.allocate(40 * MIB, S0).unwrap();
    let b = alloc.allocate(40 * MIB, S0).unwrap();
    drop(a);
    let c = alloc.allocate(30 * MIB, S0).unwrap();
    let s = alloc.stats();
    assert_eq!((s.num_alloc_retries, s.num_sync_all_streams), (0, 0));
    assert_eq!(s.num_device_free, 1);
    assert_eq!(host.used(), 70 * MIB);
    drop((b, c));
}

#[test]
fn fragmentation_hint_names_max_split_size() {
    let (_host, alloc) = allocator_with(40 * MIB, "");
    // Two 20 MiB segments cut into 5 + 5 + 10 MiB; the middle blocks stay live, so 30 MiB
    // is cached but no free piece exceeds 10 MiB and no segment can be released.
    let mut blocks = Vec::new();
    for size in [5, 5, 10, 5, 5, 10] {
        blocks.push(alloc.allocate(size * MIB, S0).unwrap());
    }
    let _keep: Vec<_> = blocks
        .drain(..)
        .filter(|b| b.size() == 5 * MIB)
        .skip(1)
        .step_by(2)
        .collect();
    assert_eq!(alloc.stats().segment.all().current, 2);
    let err = alloc.allocate(12 * MIB, S0).unwrap_err();
    let oom = err.as_out_of_memory().unwrap();
    assert_eq!(oom.reserved_unallocated(), 30 * MIB, "{oom}");
    assert_eq!(oom.free, 0);
    assert_eq!(oom.hint, OomHint::Fragmentation { suggested_mb: 21 });
    assert!(err.to_string().contains("max_split_size_mb:21"), "{err}");
}

#[test]
fn garbage_collection_frees_old_cached_segments_without_sync() {
    let (host, alloc) = allocator_with(100 * MIB, "garbage_collection_threshold:0.5");
    let side = host.new_stream();
    drop(alloc.allocate(30 * MIB, side).unwrap());
    // 54 MiB reserved, above the 50 MiB threshold. Searches on S0 age the side block.
    for _ in 0..6 {
        drop(alloc.allocate(24 * MIB, S0).unwrap());
    }
    assert_eq!(host.used(), 54 * MIB);
    // A miss triggers GC: the old 30 MiB block goes, the recently used 24 MiB one stays.
    let _k = alloc.allocate(26 * MIB, S0).unwrap();
    let s = alloc.stats();
    assert_eq!(s.num_sync_all_streams, 0, "GC never synchronises");
    assert_eq!((s.num_alloc_retries, s.num_device_free), (0, 1));
    assert_eq!(host.used(), 50 * MIB);
    assert!(alloc.snapshot().segments.iter().all(|seg| seg.stream == S0));
}

#[test]
fn zero_bytes_never_touch_the_backend() {
    let (host, alloc) = allocator_with(MIB, "");
    let z = alloc.allocate(0, S0).unwrap();
    assert!(z.ptr().is_null());
    drop(z);
    assert_eq!(host.counters().mallocs, 0);
    assert_eq!(alloc.stats().allocation.all().allocated, 0);
}

#[test]
fn raw_allocations_free_once_and_only_here() {
    let (_h1, a1) = allocator_with(1 << 30, "");
    let (_h2, a2) = allocator_with(1 << 30, "");
    let raw = a1.allocate(4096, S0).unwrap().into_raw();
    assert_eq!(a1.stats().allocation.all().current, 1);
    let other = a2.allocate_raw(4096, S0).unwrap();
    assert!(matches!(
        a1.free_raw(other),
        Err(AllocError::ForeignAllocation { .. })
    ));
    a1.free_raw(raw).unwrap();
    assert_eq!(a1.stats().allocation.all().current, 0);
}

#[test]
fn frees_by_address_check_the_address() {
    let (host, alloc) = allocator_with(1 << 30, "");
    let side = host.new_stream();
    let ptr = alloc.allocate_ptr(8192, S0).unwrap();
    alloc.record_stream_ptr(ptr, side).unwrap();
    let bogus = DevicePtr(ptr.0 + 512);
    assert!(matches!(
        alloc.record_stream_ptr(bogus, side),
        Err(AllocError::ForeignAllocation { .. })
    ));
    // SAFETY: `bogus` is not an allocation; the allocator must refuse it without effect.
    let err = unsafe { alloc.free_ptr(bogus) }.unwrap_err();
    assert!(err.to_string().contains("not handed out"), "{err}");
    // SAFETY: `ptr` came from `allocate_ptr` here and is not used again.
    unsafe { alloc.free_ptr(ptr) }.unwrap();
    assert_eq!(host.pending_events(side), 1, "recorded use honoured");
    // SAFETY: a second free of the same address must be refused, not double-free.
    assert!(unsafe { alloc.free_ptr(ptr) }.is_err());
}

#[test]
fn empty_cache_waits_for_events_then_releases() {
    let (host, alloc) = allocator_with(1 << 30, "");
    let side = host.new_stream();
    let a = alloc.allocate(MIB * 4, S0).unwrap();
    a.record_stream(side).unwrap();
    drop(a);
    alloc.empty_cache().unwrap();
    assert_eq!(host.used(), 0);
    assert_eq!(host.counters().event_syncs, 1);
    assert_eq!(alloc.stats().num_sync_all_streams, 1);
}

/// A host backend whose `record_event` can be made to fail.
#[derive(Clone)]
struct Flaky {
    host: HostBackend,
    fail_events: Arc<AtomicBool>,
}

#[derive(Debug, thiserror::Error)]
#[error("injected event failure")]
struct Injected;

impl Backend for Flaky {
    type Stream = HostStream;
    type Event = HostEvent;
    fn device(&self) -> i32 {
        3
    }
    fn malloc(&mut self, size: usize) -> Result<Option<DevicePtr>, BackendError> {
        self.host.malloc(size)
    }
    unsafe fn free(&mut self, ptr: DevicePtr, size: usize) -> Result<(), BackendError> {
        // SAFETY: forwarded unchanged; the caller upholds the contract for `host`.
        unsafe { self.host.free(ptr, size) }
    }
    fn mem_info(&mut self) -> Result<MemInfo, BackendError> {
        self.host.mem_info()
    }
    fn record_event(&mut self, stream: HostStream) -> Result<HostEvent, BackendError> {
        if self.fail_events.load(Ordering::SeqCst) {
            return Err(Box::new(Injected));
        }
        self.host.record_event(stream)
    }
    fn event_query(&mut self, event: &HostEvent) -> Result<bool, BackendError> {
        self.host.event_query(event)
    }
    fn event_synchronize(&mut self, event: &HostEvent) -> Result<(), BackendError> {
        self.host.event_synchronize(event)
    }
    fn synchronize_device(&mut self) -> Result<(), BackendError> {
        self.host.synchronize_device()
    }
}

#[test]
fn drop_records_backend_errors_and_stays_safe() {
    let host = HostBackend::new(1 << 30);
    let fail = Arc::new(AtomicBool::new(true));
    let flaky = Flaky {
        host: host.clone(),
        fail_events: fail.clone(),
    };
    let alloc = CachingAllocator::with_config(flaky, AllocatorConfig::default()).unwrap();
    let side = host.new_stream();
    let a = alloc.allocate(4096, S0).unwrap();
    let ptr = a.ptr();
    a.record_stream(side).unwrap();
    drop(a); // must not panic
    let err = alloc.check_err().unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("device 3") && text.contains("record_event"),
        "{text}"
    );
    assert!(alloc.check_err().is_ok(), "check_err clears the error");
    // The device was synchronised instead, so the block is safely reusable.
    assert_eq!(host.counters().device_syncs, 1);
    assert_eq!(alloc.allocate(4096, S0).unwrap().ptr(), ptr);
}

#[test]
fn concurrent_threads_share_one_allocator() {
    let (host, alloc) = allocator_with(1 << 30, "");
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let alloc = alloc.clone();
            std::thread::spawn(move || {
                for i in 0..2000u64 {
                    let size = 512 + ((i * 7919 + t * 104_729) % (3 * MIB as u64)) as usize;
                    let a = alloc.allocate(size, S0).unwrap();
                    let p = a.ptr().0 as *mut u64;
                    // SAFETY: `a` is a live host block of at least 512 bytes, owned here.
                    unsafe { p.write(t << 32 | i) };
                    std::thread::yield_now();
                    assert_eq!(
                        // SAFETY: as above; written by this thread just before.
                        unsafe { p.read() },
                        t << 32 | i,
                        "block shared between threads"
                    );
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(alloc.stats().allocation.all().current, 0);
    alloc.empty_cache().unwrap();
    assert_eq!(host.used(), 0);
}

/// A step's temporaries: frees and requests that reuse them, in one stream's order; returns the
/// addresses handed out, in order.
fn temporaries(alloc: &CachingAllocator<HostBackend>) -> Vec<DevicePtr> {
    let mut seen = Vec::new();
    let mut take = |size: usize| {
        let a = alloc.allocate(size, S0).unwrap();
        seen.push(a.ptr());
        a
    };
    let a = take(4 * MIB);
    let b = take(300 << 10);
    drop(a);
    let c = take(2 * MIB);
    let d = take(2 * MIB);
    drop(b);
    let e = take(300 << 10);
    drop((c, d, e));
    let f = take(4 * MIB);
    drop(f);
    seen
}

#[test]
fn a_capture_reuses_its_own_frees_and_its_pool_is_the_eager_peak() {
    // Eager, from an empty cache: the peak and what it reserved.
    let (_, eager) = allocator_with(1 << 30, "");
    let eager_seen = temporaries(&eager);
    let (peak, reserved) = {
        let s = eager.stats();
        (s.allocated_bytes.all().peak, s.reserved_bytes.all().current)
    };
    assert_eq!(
        peak,
        4 * MIB as u64 + (300 << 10),
        "a and b, then b, c and d at once"
    );

    // The same work captured, beside a warm cache of another size.
    let (host, alloc) = allocator_with(1 << 30, "");
    drop(alloc.allocate(8 * MIB, S0).unwrap());
    let before = alloc.stats().reserved_bytes.all().current;
    alloc.reset_peak_stats();
    alloc.begin_capture(S0).unwrap();
    let seen = temporaries(&alloc);
    let pool = alloc.end_capture();
    assert_eq!(
        seen[2], seen[0],
        "c splits a's freed block, as in eager mode"
    );
    assert_eq!(seen[4], seen[1], "e gets b's freed block");
    assert_eq!(seen[5], seen[0], "f gets a's merged block back");
    let same = |v: &[DevicePtr]| {
        let n = v.len();
        (0..n * n).map(|k| v[k / n] == v[k % n]).collect::<Vec<_>>()
    };
    assert_eq!(same(&seen), same(&eager_seen), "the same reuse as eager");
    let s = alloc.stats();
    assert_eq!(
        s.allocated_bytes.all().peak,
        peak,
        "the capture's peak is eager's"
    );
    assert_eq!(s.allocated_bytes.all().current, 0, "nothing is held");
    assert_eq!(
        pool.bytes(),
        reserved as usize,
        "the pool is eager's reservation"
    );
    assert_eq!(pool.private_segments(), (reserved as usize, 2));
    assert_eq!(s.reserved_bytes.all().current - before, reserved);

    // Closed: an eager request of a pool block's size gets another block, and neither
    // empty_cache nor the out-of-memory path releases the pool's segments.
    let eager_block = alloc.allocate(300 << 10, S0).unwrap();
    assert!(!seen.contains(&eager_block.ptr()));
    drop(eager_block);
    alloc.empty_cache().unwrap();
    assert_eq!(
        host.used(),
        reserved as usize,
        "only the pool's segments remain"
    );

    // The graph goes: the pool's blocks join S0's cache.
    drop(pool);
    let again = alloc.allocate(4 * MIB, S0).unwrap();
    assert_eq!(again.ptr(), seen[0], "a's block is reusable again");
    drop(again);
    alloc.empty_cache().unwrap();
    assert_eq!(host.used(), 0, "and releasable");
}

#[test]
fn frees_of_other_streams_and_older_blocks_stay_held_for_the_graph() {
    let (host, alloc) = allocator_with(1 << 30, "");
    let side = host.new_stream();
    let old = alloc.allocate(MIB, S0).unwrap();
    let old_ptr = old.ptr();
    alloc.begin_capture(S0).unwrap();
    drop(old); // allocated before the capture: held
    let on_side = alloc.allocate(MIB, side).unwrap(); // not the capture's stream: the cache
    let side_ptr = on_side.ptr();
    drop(on_side);
    let shared = alloc.allocate(MIB, S0).unwrap(); // the pool, then used on `side`: held
    shared.record_stream(side).unwrap();
    let shared_ptr = shared.ptr();
    drop(shared);
    let fresh = alloc.allocate(MIB, S0).unwrap();
    assert!(
        ![old_ptr, side_ptr, shared_ptr].contains(&fresh.ptr()),
        "no held block is reused in the capture"
    );
    let fresh_ptr = fresh.ptr();
    drop(fresh); // the pool's own, used on S0 only: back to the pool
    let mut pool = alloc.end_capture();
    let mut held = pool.addresses();
    held.sort();
    let mut want = vec![old_ptr, side_ptr, shared_ptr];
    want.sort();
    assert_eq!(held, want);
    assert_eq!(alloc.stats().allocated_bytes.all().current, 3 * MIB as u64);
    let eager = alloc.allocate(MIB, S0).unwrap();
    assert!(
        !want.contains(&eager.ptr()),
        "held blocks stay out of eager requests"
    );
    drop(eager);

    // Launched on `side` too: nothing comes back before `side` has done that work.
    pool.record_stream(side).unwrap();
    drop(pool);
    assert_eq!(alloc.stats().allocated_bytes.all().current, 0);
    let early = alloc.allocate(MIB, S0).unwrap();
    assert!(
        ![old_ptr, shared_ptr, fresh_ptr].contains(&early.ptr()),
        "a block of the graph came back before `side` completed"
    );
    drop(early);
    host.complete_stream(side);
    let late: Vec<_> = (0..4).map(|_| alloc.allocate(MIB, S0).unwrap()).collect();
    for p in [old_ptr, shared_ptr, fresh_ptr] {
        assert!(late.iter().any(|a| a.ptr() == p), "{p:?} is S0's again");
    }
    drop(late);
    alloc.empty_cache().unwrap();
    assert_eq!(host.used(), 0);
}
