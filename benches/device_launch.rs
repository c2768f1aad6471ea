//! Host-side cost of queueing one op (`--features device`): the time `ops::gelu_forward` and
//! `ops::residual_add` take to return on a tiny tensor (256 elements), with the device's work
//! excluded: each sample queues `iters` ops back to back, stops the clock, then waits for the
//! stream outside the timed region. What it measures: argument validation, the kernel lookup
//! (resolved once per device and kernel), the argument array and the runtime's launch call.
//!
//! On hip-emu the runtime's launch call includes the emulator's own checks and queue push (and
//! its executor thread competes for the CPU): figures there are labelled "emulated — not a
//! performance figure"; they bound the crate's share from above, they are not a GPU's launch
//! latency. NEVER RUN on a GPU.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use hip_kernels::ops::{self, ElementwiseParams, GeluForward, ResidualAdd};
use hip_kernels::params::OnDevice;
use hip_rt::{Device, DeviceBuffer, Stream, StreamOptions};
use std::time::Instant;

#[path = "device_common/mod.rs"]
mod device_common;
use device_common::{announce, config};

/// Elements per op: small enough that the device's share is negligible.
const N: usize = 256;

fn queue_cost(c: &mut Criterion) {
    let device = Device::get(0).expect("the device bench needs HIP device 0");
    let label = announce(&device);
    let s = Stream::new(&device, StreamOptions::default()).expect("stream");
    let x = DeviceBuffer::from_slice(&s, &[0.5f32; N]).expect("alloc");
    let y = DeviceBuffer::from_slice(&s, &[0.25f32; N]).expect("alloc");
    let mut out = DeviceBuffer::<f32>::alloc(&s, N).expect("alloc");
    let params = ElementwiseParams { len: N };
    // The first call loads the module: keep it out of the figures.
    ops::gelu_forward(
        &s,
        GeluForward::<OnDevice, f32> {
            params,
            x: &x,
            out: &mut out,
        },
    )
    .expect("gelu");
    s.synchronize().expect("sync");

    let mut g = c.benchmark_group(format!("queue_one_op{label}"));
    // Each sample queues `iters` ops, stops the clock, then waits for the stream untimed.
    let mut timed = |name: &str, op: &mut dyn FnMut()| {
        g.bench_function(BenchmarkId::new(name, N), |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    op();
                }
                let took = start.elapsed();
                s.synchronize().expect("sync");
                took
            })
        });
    };
    timed("gelu_forward_f32", &mut || {
        ops::gelu_forward(
            &s,
            GeluForward::<OnDevice, f32> {
                params,
                x: &x,
                out: &mut out,
            },
        )
        .expect("gelu")
    });
    timed("residual_add_f32", &mut || {
        ops::residual_add(
            &s,
            ResidualAdd::<OnDevice, f32> {
                params,
                a: &x,
                b: &y,
                out: &mut out,
            },
        )
        .expect("residual add")
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = config();
    targets = queue_cost
}
criterion_main!(benches);
