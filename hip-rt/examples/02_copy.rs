//! Copy data host → device → device → host, synchronously and asynchronously through pinned
//! memory, and time it with events.
//!
//! `cargo run -p hip-rt --example 02_copy`. Exits 2 with a diagnosis when there is no device.

mod common;

use common::check;
use hip_rt::{DeviceBuffer, Event, EventOptions, PinnedHostBuffer, Stream, StreamOptions};

fn main() {
    let device = common::device_or_exit();
    let stream = check(
        "creating a stream",
        Stream::new(&device, StreamOptions::default()),
    );
    let len = 16 << 20; // 64 MiB of f32
    let host: Vec<f32> = (0..len).map(|i| i as f32).collect();

    let src = check("uploading", DeviceBuffer::from_slice(&stream, &host));
    let mut dst = check("allocating", DeviceBuffer::<f32>::alloc(&stream, len));
    check("device-to-device copy", stream.copy_dtod(&src, &mut dst));
    let back = check("downloading", dst.to_vec(&stream));
    assert!(back == host, "synchronous round trip differs");
    println!("sync round trip of {} MiB: ok", (len * 4) >> 20);

    let pinned = check(
        "allocating pinned memory",
        PinnedHostBuffer::from_slice(&device, &host),
    );
    let mut pinned_back = check(
        "allocating pinned memory",
        PinnedHostBuffer::<f32>::new(&device, len),
    );
    let (start, end) = (
        check(
            "creating an event",
            Event::new(&device, EventOptions::TIMING),
        ),
        check(
            "creating an event",
            Event::new(&device, EventOptions::TIMING),
        ),
    );
    check("recording", start.record(&stream));
    check("async upload", stream.copy_htod_async(&pinned, &mut dst));
    check(
        "async download",
        stream.copy_dtoh_async(&dst, &mut pinned_back),
    );
    check("recording", end.record(&stream));
    let same = check("waiting for the copies", pinned_back.as_slice())
        == check("reading", pinned.as_slice());
    assert!(same, "asynchronous round trip differs");
    let ms = check("timing", start.elapsed_ms(&end));
    let gbs = 2.0 * (len * 4) as f64 / (f64::from(ms) * 1e6);
    // On hip-emu the copies are host memcpys: the figure says so (hip_rt::EMULATED_FIGURE_LABEL).
    let label = if device.is_emulated() {
        format!(" [{}]", hip_rt::EMULATED_FIGURE_LABEL)
    } else {
        String::new()
    };
    println!("async pinned round trip: {ms:.2} ms ({gbs:.1} GB/s){label}");
    check("errors recorded while dropping", device.check_err());
}
