//! The device's caching allocator as `torch.cuda` shows it: allocate, free, read the
//! statistics (PyTorch's keys) and print the summary table.
//!
//! `cargo run -p hip-rt --example 05_memory_stats`. Exits 2 with a diagnosis when there is no
//! device.

mod common;

use hip_rt::{DeviceBuffer, Stream, StreamOptions};

fn main() {
    let d = common::device_or_exit();
    let s = common::check(
        "creating a stream",
        Stream::new(&d, StreamOptions::default()),
    );
    // A small buffer (small pool) and two large ones; free one large buffer: it stays cached.
    let small = common::check("allocating", DeviceBuffer::<f32>::zeroed(&s, 1000));
    let large = common::check("allocating", DeviceBuffer::<f32>::zeroed(&s, 3 << 20));
    let kept = common::check("allocating", DeviceBuffer::<f32>::zeroed(&s, 1 << 20));
    drop(large);
    common::check("synchronising", s.synchronize());
    let stats = common::check("reading memory stats", d.memory_stats());
    for key in [
        "allocated_bytes.all.current",
        "allocated_bytes.all.peak",
        "reserved_bytes.all.current",
        "segment.all.current",
        "num_alloc_retries",
        "num_ooms",
    ] {
        let value = common::check("reading a memory stat", stats.get(key));
        println!("{key:<28} {value}");
    }
    print!("{}", common::check("summarising", d.memory_summary()));
    drop((small, kept));
    common::check("emptying the cache", d.empty_cache());
}
