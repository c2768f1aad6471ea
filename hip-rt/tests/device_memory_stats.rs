//! `Device`'s memory statistics reach the shared caching allocator behind `Device::get`
//! (issue 20, gap 1): concrete numbers after a known sequence of allocations and frees, peak
//! reset, `empty_cache`, the memory fraction and the summary table. On hip-emu
//! (`HIPK_HIP_LIBRARY=.../libhip_emu.so`, `--features device`); the one test runs alone in its
//! process, so the shared cache starts empty.
#![cfg(feature = "device")]

use hip_rt::{Device, DeviceBuffer, Error, Stream, StreamOptions};

const MIB: u64 = 1 << 20;

#[test]
fn memory_stats_follow_a_known_sequence_on_the_shared_cache() {
    // hip-emu reads its memory size when it loads (ignored by a real device).
    std::env::set_var("HIPK_EMU_MEMORY", "64M");
    let d = Device::get(0).unwrap_or_else(|e| {
        panic!("the `device` tests need a HIP device (or hip-emu), and none is usable: {e}")
    });
    let total = d.total_memory() as u64;
    if d.is_emulated() {
        assert_eq!(total, 64 * MIB);
    }
    let s = Stream::new(&d, StreamOptions::default()).unwrap();
    let get = |key: &str| {
        d.memory_stats()
            .unwrap()
            .get(key)
            .unwrap_or_else(|e| panic!("{e}"))
    };
    assert_eq!(get("allocated_bytes.all.current"), 0);

    // On hip-emu the caching allocator adds a byte to every request (guard slack for the
    // overrun check): a 3 MiB request takes a 3 MiB + 512 B block there.
    let guard = if d.is_emulated() { 512 } else { 0 };
    // 1000 B: small pool, 1 KiB block of a 2 MiB segment. 3 MiB: a 20 MiB large segment.
    let a = DeviceBuffer::<u8>::alloc(&s, 1000).unwrap();
    let b = DeviceBuffer::<u8>::alloc(&s, 3 << 20).unwrap();
    let st = d.memory_stats().unwrap();
    assert_eq!(st.allocated_bytes.all().current, 1024 + 3 * MIB + guard);
    assert_eq!(get("allocated_bytes.small_pool.current"), 1024);
    assert_eq!(get("allocated_bytes.large_pool.current"), 3 * MIB + guard);
    assert_eq!(get("requested_bytes.all.current"), 1000 + 3 * MIB);
    assert_eq!(get("reserved_bytes.all.current"), 22 * MIB);
    assert_eq!(get("segment.all.current"), 2);
    assert_eq!(
        (get("allocation.all.current"), get("active.all.current")),
        (2, 2)
    );
    assert_eq!(get("num_device_alloc"), 2);
    // Every Device::get of the ordinal shares the cache.
    assert_eq!(Device::get(0).unwrap().memory_stats().unwrap(), st);

    drop(b);
    s.synchronize().unwrap();
    let st = d.memory_stats().unwrap();
    let allocated = st.allocated_bytes.all();
    assert_eq!(
        (
            allocated.current,
            allocated.peak,
            allocated.allocated,
            allocated.freed
        ),
        (
            1024,
            1024 + 3 * MIB + guard,
            1024 + 3 * MIB + guard,
            3 * MIB + guard
        )
    );
    assert_eq!(
        get("reserved_bytes.all.current"),
        22 * MIB,
        "cached, not released"
    );
    assert_eq!(
        get("inactive_split_bytes.small_pool.current"),
        2 * MIB - 1024
    );

    d.reset_peak_memory_stats().unwrap();
    assert_eq!(get("allocated_bytes.all.peak"), 1024);
    assert_eq!(get("reserved_bytes.all.peak"), 22 * MIB);

    d.empty_cache().unwrap();
    assert_eq!(
        get("reserved_bytes.all.current"),
        2 * MIB,
        "the live block's segment stays"
    );
    assert_eq!((get("segment.all.current"), get("num_device_free")), (1, 1));

    // The fraction: validated, then enforced with a message that names it.
    for bad in [0.0, 1.5, f64::NAN] {
        let err = d.set_memory_fraction(bad).unwrap_err();
        assert!(matches!(err, Error::Caching(_)), "{bad}: {err}");
    }
    d.set_memory_fraction(0.25).unwrap();
    let err = DeviceBuffer::<u8>::alloc(&s, 20 << 20).unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    let cap = format!(
        "memory fraction cap 0.25 = {:.2} MiB",
        (total as f64 * 0.25) / MIB as f64
    );
    assert!(err.to_string().contains(&cap), "{err}");
    assert_eq!((get("num_ooms"), get("num_alloc_retries")), (1, 1));
    // 2 MiB reserved + a 10 MiB segment fit under the cap.
    let c = DeviceBuffer::<u8>::alloc(&s, 10 << 20).unwrap();
    d.set_memory_fraction(1.0).unwrap();

    let summary = d.memory_summary().unwrap();
    let row = summary
        .lines()
        .find(|l| l.starts_with("Allocated memory"))
        .unwrap_or_else(|| panic!("{summary}"));
    let cells: Vec<&str> = row.split('|').map(str::trim).collect();
    assert_eq!(
        cells[1..5],
        ["10.00 MiB", "10.00 MiB", "13.00 MiB", "3.00 MiB"],
        "{summary}"
    );
    assert!(summary.contains("OOMs: 1 "), "{summary}");
    drop((a, c));
    s.synchronize().unwrap();
    assert_eq!(get("allocated_bytes.all.current"), 0);
    d.check_err().unwrap();
}
