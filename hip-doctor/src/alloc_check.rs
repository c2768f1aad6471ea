//! The allocator check per device: a caching allocator over HIP (`hip_rt::caching`) serves a few
//! buffers, and its statistics must agree with what was asked of it.
//!
//! Never run on a GPU: without a device this is not reached. The same rules are tested on the
//! host backend in hip-rt's own tests.

use std::sync::Arc;

use hip_rt::caching::{round_size, CachingAllocator, HipBackend, Stats};
use hip_rt::{Device, DeviceBuffer, Stream, StreamOptions};

/// Request sizes in f32 elements: small pool, large pool (1–10 MiB), above 10 MiB.
const LENS: [usize; 3] = [1000, 3 << 18, 7 << 20];

/// Runs the check on device `ordinal`; `Ok` describes what held.
pub fn check(ordinal: i32) -> Result<String, String> {
    let cache = CachingAllocator::new(HipBackend::new(ordinal))
        .map_err(|e| format!("creating the allocator: {e}"))?;
    let cache = Arc::new(cache);
    let device = Device::with_allocator(ordinal, cache.clone())
        .map_err(|e| format!("opening the device: {e}"))?;
    let stream = Stream::new(&device, StreamOptions::default())
        .map_err(|e| format!("creating a stream: {e}"))?;

    // On hip-emu every block holds a byte more than asked (guard slack for its overrun check).
    let slack = usize::from(hip_rt::emu::is_hip_emu());
    let expected: u64 = LENS.iter().map(|l| round_size(l * 4 + slack) as u64).sum();
    let buffers = LENS
        .iter()
        .map(|&len| {
            DeviceBuffer::<f32>::zeroed(&stream, len)
                .map_err(|e| format!("allocating {len} f32: {e}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let live = cache.stats();
    sane(&live)?;
    expect(
        "allocated bytes with 3 live buffers",
        live.allocated_bytes.all().current,
        expected,
    )?;
    expect(
        "allocations with 3 live buffers",
        live.allocation.all().current,
        LENS.len() as u64,
    )?;

    drop(buffers);
    stream
        .synchronize()
        .map_err(|e| format!("synchronizing: {e}"))?;
    let freed = cache.stats();
    sane(&freed)?;
    expect(
        "allocated bytes after freeing",
        freed.allocated_bytes.all().current,
        0,
    )?;
    let reserved = freed.reserved_bytes.all().current;
    if reserved < expected {
        return Err(format!("reserved {reserved} B after freeing, less than the {expected} B just freed (the cache kept nothing)"));
    }

    // The same sizes again on the same stream must come from the cache: no new device malloc.
    let mallocs = freed.num_device_alloc;
    let again = LENS
        .iter()
        .map(|&len| {
            DeviceBuffer::<f32>::alloc(&stream, len)
                .map_err(|e| format!("reallocating {len} f32: {e}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let reused = cache.stats();
    expect(
        "device mallocs when reusing cached blocks",
        reused.num_device_alloc,
        mallocs,
    )?;
    drop(again);
    stream
        .synchronize()
        .map_err(|e| format!("synchronizing: {e}"))?;

    cache
        .empty_cache()
        .map_err(|e| format!("empty_cache: {e}"))?;
    let empty = cache.stats();
    sane(&empty)?;
    expect(
        "reserved bytes after empty_cache",
        empty.reserved_bytes.all().current,
        0,
    )?;
    device
        .check_err()
        .map_err(|e| format!("errors while dropping: {e}"))?;
    cache
        .check_err()
        .map_err(|e| format!("allocator errors: {e}"))?;
    Ok(format!(
        "{} buffers: allocated {} B, reserved {} B, reused from the cache, empty_cache released everything",
        LENS.len(),
        expected,
        reserved
    ))
}

/// Invariants that hold at any time.
fn sane(s: &Stats) -> Result<(), String> {
    let (alloc, reserved) = (s.allocated_bytes.all(), s.reserved_bytes.all());
    if reserved.current < alloc.current {
        return Err(format!(
            "reserved {} B < allocated {} B",
            reserved.current, alloc.current
        ));
    }
    if alloc.peak < alloc.current || reserved.peak < reserved.current {
        return Err(format!("a peak is below its current value: {s:?}"));
    }
    if alloc.allocated - alloc.freed != alloc.current {
        return Err(format!(
            "allocated {} - freed {} != current {} B",
            alloc.allocated, alloc.freed, alloc.current
        ));
    }
    Ok(())
}

fn expect(what: &str, got: u64, want: u64) -> Result<(), String> {
    if got == want {
        Ok(())
    } else {
        Err(format!("{what}: {got}, expected {want}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invariants_catch_bad_stats() {
        let mut s = Stats::default();
        assert!(sane(&s).is_ok());
        s.allocated_bytes.0[0].current = 10;
        s.allocated_bytes.0[0].allocated = 10;
        s.allocated_bytes.0[0].peak = 10;
        assert!(sane(&s)
            .err()
            .unwrap_or_default()
            .contains("reserved 0 B < allocated 10 B"));
        assert_eq!(expect("x", 1, 2), Err("x: 1, expected 2".to_string()));
    }

    #[test]
    fn sizes_cover_every_pool() {
        assert!(LENS[0] * 4 <= 1 << 20);
        assert!((1 << 20..10 << 20).contains(&(LENS[1] * 4)));
        assert!(LENS[2] * 4 >= 10 << 20);
    }
}
