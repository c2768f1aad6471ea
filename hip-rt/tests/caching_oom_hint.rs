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
