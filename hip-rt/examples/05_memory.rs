//! The caching allocator's statistics, as `torch.cuda` gives them: allocate and free a few
//! buffers through `Device::get`'s shared cache, then print `memory_stats` figures and the
//! `memory_summary` table, release the cache and print the reserved bytes again.
//!
//! `cargo run -p hip-rt --example 05_memory`. Exits 2 with a diagnosis when there is no device.

mod common;

use common::check;
use hip_rt::{DeviceBuffer, Stream, StreamOptions};

const MIB: usize = 1 << 20;

fn main() {
    let device = common::device_or_exit();
    let stream = check(
        "creating a stream",
        Stream::new(&device, StreamOptions::default()),
    );
    check("resetting the peaks", device.reset_peak_memory_stats());
    // Three buffers (4 MiB, 1 MiB, 20 KiB of f32); the 1 MiB one is freed and its block is
    // reused by a second 1 MiB request.
    let big = check("allocating", DeviceBuffer::<f32>::alloc(&stream, MIB));
    let mid = check("allocating", DeviceBuffer::<f32>::alloc(&stream, MIB / 4));
    let small = check("allocating", DeviceBuffer::<f32>::alloc(&stream, 5 * 1024));
    drop(mid);
    let again = check("allocating", DeviceBuffer::<f32>::alloc(&stream, MIB / 4));

    let stats = check("reading the statistics", device.memory_stats());
    for key in [
        "allocated_bytes.all.current",
        "allocated_bytes.all.peak",
        "reserved_bytes.all.current",
        "active_bytes.all.current",
        "allocation.all.allocated",
        "segment.all.current",
        "num_alloc_retries",
        "num_ooms",
    ] {
        let value = stats
            .get(key)
            .map_or_else(|| "(missing)".to_string(), |v| v.to_string());
        println!("{key:<30} {value}");
    }
    println!();
    println!("{}", check("summarising", device.memory_summary()));

    drop((big, small, again));
    check("emptying the cache", device.empty_cache());
    let after = check("reading the statistics", device.memory_stats());
    println!(
        "after freeing every buffer and empty_cache(): reserved_bytes.all.current = {}",
        after.reserved_bytes.all().current
    );
}
