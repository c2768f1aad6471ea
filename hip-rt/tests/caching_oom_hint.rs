//! The out-of-memory hint says what is true when the request itself would fit but the segment
//! the allocator reserves for it does not (issue 12, found by the probe).

use hip_rt::caching::{AllocatorConfig, CachingAllocator, HostBackend, HostStream, OomHint, MIB};

#[test]
fn a_segment_larger_than_the_free_memory_is_named_not_called_fragmentation() {
    // Nothing allocated: a 2 MiB request needs a 20 MiB large-pool segment on a 10 MiB device.
    let host = HostBackend::new(10 * MIB);
    let alloc = CachingAllocator::with_config(host, AllocatorConfig::default()).unwrap();
    let err = alloc.allocate(2 * MIB, HostStream::DEFAULT).unwrap_err();
    let oom = err.as_out_of_memory().expect("out of memory");
    assert_eq!((oom.rounded, oom.segment_size), (2 * MIB, 20 * MIB));
    assert_eq!(
        (oom.capacity, oom.free, oom.reserved),
        (10 * MIB, 10 * MIB, 0)
    );
    assert_eq!(
        oom.hint,
        OomHint::SegmentTooLarge { segment: 20 * MIB },
        "{err}"
    );
    let text = err.to_string();
    assert!(!text.contains("max_split_size"), "{text}");
    assert!(!text.contains("fragmentation"), "{text}");
    assert!(
        text.contains("20.00 MiB segment")
            && text.contains("more than the device's whole capacity"),
        "{text}"
    );
    // A request that gets its own segment and fits is served by the same allocator.
    let fits = alloc.allocate(10 * MIB, HostStream::DEFAULT).unwrap();
    assert_eq!(fits.size(), 10 * MIB);
}

fn allocator_with(capacity: usize, conf: &str) -> (HostBackend, CachingAllocator<HostBackend>) {
    let host = HostBackend::new(capacity);
    let config = AllocatorConfig::parse(conf).unwrap();
    (
        host.clone(),
        CachingAllocator::with_config(host, config).unwrap(),
    )
}

/// A 32 MiB device; on a side stream, a 20 MiB segment keeps a live 2 MiB block and caches
/// 18 MiB free next to it, and a whole 12 MiB segment is cached. A 16 MiB request on the
/// default stream: releasing every whole cached segment (the 12 MiB) and retrying is not
/// enough; the 18 MiB that would fit is free only for the side stream.
fn stranded_on_another_stream(conf: &str) {
    let (host, alloc) = allocator_with(32 * MIB, conf);
    let side = host.new_stream();
    let live = alloc.allocate(2 * MIB, side).unwrap();
    let freed = alloc.allocate(8 * MIB, side).unwrap();
    let whole = alloc.allocate(12 * MIB, side).unwrap();
    assert_eq!(host.used(), 32 * MIB);
    drop((freed, whole));
    let err = alloc.allocate(16 * MIB, HostStream::DEFAULT).unwrap_err();
    let oom = err.as_out_of_memory().expect("out of memory");
    let stats = alloc.stats();
    assert_eq!(
        (
            stats.num_alloc_retries,
            stats.num_ooms,
            stats.num_device_free
        ),
        (1, 1, 1),
        "the whole cached segment is released and the allocation retried before failing"
    );
    assert_eq!(
        (oom.free, oom.reserved, oom.allocated),
        (12 * MIB, 20 * MIB, 2 * MIB)
    );
    assert_eq!(
        oom.hint,
        OomHint::OtherStreams {
            bytes: 18 * MIB,
            largest: 18 * MIB
        },
        "{err}"
    );
    let text = err.to_string();
    assert!(!text.contains("max_split_size_mb:"), "{text}");
    assert!(!text.contains("fragmentation"), "{text}");
    assert!(
        text.contains("18.00 MiB is free in cached blocks of other streams")
            && text.contains("segments that also hold live blocks"),
        "{text}"
    );
    drop(live);
}

#[test]
fn free_blocks_stranded_on_another_stream_are_named_not_called_fragmentation() {
    stranded_on_another_stream("");
    // The probe applied the suggested setting and got the same advice again.
    stranded_on_another_stream("max_split_size_mb:21");
}

/// Fragmentation on the request's own stream with `max_split_size_mb` already at the value
/// the hint would suggest: the hint says what holds the memory instead of repeating it.
#[test]
fn the_hint_never_suggests_a_setting_already_in_force() {
    for conf in ["", "max_split_size_mb:21"] {
        let (_host, alloc) = allocator_with(40 * MIB, conf);
        let s0 = HostStream::DEFAULT;
        // Two 20 MiB segments cut into 5 + 5 + 10 MiB; the second 5 MiB of each stays live.
        let mut blocks: Vec<_> = [5, 5, 10, 5, 5, 10]
            .iter()
            .map(|&mb| alloc.allocate(mb * MIB, s0).unwrap())
            .collect();
        let _live = (blocks.remove(4), blocks.remove(1));
        drop(blocks);
        let err = alloc.allocate(12 * MIB, s0).unwrap_err();
        let oom = err.as_out_of_memory().unwrap();
        let text = err.to_string();
        if conf.is_empty() {
            assert_eq!(oom.hint, OomHint::Fragmentation { suggested_mb: 21 });
            assert!(text.contains("max_split_size_mb:21"), "{text}");
        } else {
            assert_eq!(
                oom.hint,
                OomHint::LiveBlocksHoldSegments {
                    bytes: 30 * MIB,
                    largest: 10 * MIB
                },
                "{text}"
            );
            assert!(
                !text.contains("HIPK_ALLOC_CONF=max_split_size_mb"),
                "{text}"
            );
            assert!(text.contains("already in force"), "{text}");
        }
    }
}

/// A block freed while another stream still used it comes back only once that stream's work
/// is done; on the out-of-memory path the allocator waits for it and then serves the request
/// from it, instead of failing.
#[test]
fn the_retry_after_synchronising_reuses_blocks_the_wait_freed() {
    let (host, alloc) = allocator_with(20 * MIB, "");
    let s0 = HostStream::DEFAULT;
    let side = host.new_stream();
    let live = alloc.allocate(2 * MIB, s0).unwrap();
    let shared = alloc.allocate(16 * MIB, s0).unwrap();
    shared.record_stream(side).unwrap();
    drop(shared); // pending on the side stream's event
    let again = alloc
        .allocate(16 * MIB, s0)
        .expect("served after waiting for the side stream");
    let stats = alloc.stats();
    assert_eq!(
        (
            stats.num_alloc_retries,
            stats.num_ooms,
            stats.num_sync_all_streams
        ),
        (1, 0, 1)
    );
    assert_eq!(host.counters().mallocs, 1, "no second segment");
    drop((again, live));
}
