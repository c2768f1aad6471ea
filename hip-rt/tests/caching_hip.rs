//! The HIP backend without a device: construction calls nothing, and every path that reaches
//! HIP returns the runtime's error (no device, or no runtime library) without panicking.

use hip_rt::caching::{AllocError, AllocatorConfig, CachingAllocator, HipBackend};
use hip_rt::{DeviceAllocator, Error, RawStream};

fn cache() -> CachingAllocator<HipBackend> {
    CachingAllocator::with_config(HipBackend::new(0), AllocatorConfig::default())
        .expect("constructing calls no HIP function")
}

#[test]
fn allocation_without_a_device_is_a_backend_error() {
    if has_device() {
        return; // these assertions are about machines without one
    }
    let cache = cache();
    match cache.allocate(4096, RawStream::NULL) {
        Err(AllocError::Backend { op, device, source }) => {
            assert_eq!((op, device), ("malloc", 0));
            assert!(source.downcast_ref::<Error>().is_some(), "{source}");
        }
        other => panic!("expected a backend error without a device, got {other:?}"),
    }
    assert_eq!(cache.stats().num_device_alloc, 0);
    assert!(
        cache.empty_cache().is_ok(),
        "nothing cached, nothing to call"
    );
}

#[test]
fn device_allocator_maps_to_hip_rt_errors() {
    if has_device() {
        return; // these assertions are about machines without one
    }
    let cache = cache();
    let err = DeviceAllocator::allocate(&cache, 1 << 20, RawStream::NULL).unwrap_err();
    assert!(matches!(err, Error::Sys(_)), "the HIP error itself: {err}");
    // A pointer this allocator never handed out is refused, not freed.
    let bogus = hip_rt::RawAllocation {
        ptr: hip_rt::DevicePtr(0x1000),
        bytes: 512,
    };
    // SAFETY: the allocator must reject an unknown pointer without touching it.
    let err = unsafe { DeviceAllocator::deallocate(&cache, bogus, RawStream::NULL) }.unwrap_err();
    assert!(matches!(err, Error::Caching(_)), "{err}");
    assert!(err.to_string().contains("not handed out"), "{err}");
}

/// `true` on a machine with a usable HIP device, where these no-device checks do not apply.
fn has_device() -> bool {
    hip_rt::Device::count().is_ok_and(|n| n > 0)
}
