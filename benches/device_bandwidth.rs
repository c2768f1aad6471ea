//! Device bandwidth of layernorm forward/backward, the fused residual + layernorm forward and
//! fused AdamW (`--features device`), in GB/s of compulsory traffic (each input read once, each
//! output written once), printed beside the device's peak (2 × memory clock × bus width).
//! Targets: ≥ 80 % of peak for rows of C ≥ 1024 and for AdamW over ≥ 16 M parameters. Never run
//! on a GPU (no GPU was available when it was written).
//!
//! `HIPK_BENCH_QUICK=1`: small shapes and criterion's shortest settings, a smoke run (CI runs it
//! on hip-emu). On an emulated device every figure is labelled "emulated — not a performance
//! figure" (`benches/device_common`).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use hip_kernels::ops::{
    self, AdamW, AdamWParams, AdamWTensor, DeviceElement, LayerNormBackward, LayerNormForward,
    LayerNormParams, ResidualLayerNormForward,
};
use hip_kernels::params::{bf16, OnDevice};
use hip_rt::{Device, DeviceBuffer, Stream, StreamOptions};

#[path = "device_common/mod.rs"]
mod device_common;
use device_common::{announce, config, quick};

/// The stream, the device's peak GB/s and the figure label (emulated devices).
fn setup() -> (Stream, f64, String) {
    let device = Device::get(0).expect("the device bench needs HIP device 0");
    let label = announce(&device);
    let p = device.props();
    let peak = 2.0 * f64::from(p.memory_clock_rate_khz) * 1e3 * f64::from(p.memory_bus_width_bits)
        / 8.0
        / 1e9;
    println!(
        "device 0: {} ({}), peak {peak:.0} GB/s{label}",
        device.name(),
        device.arch()
    );
    (
        Stream::new(&device, StreamOptions::default()).expect("stream"),
        peak,
        label,
    )
}

fn filled<T: DeviceElement>(s: &Stream, n: usize, v: f64) -> DeviceBuffer<T> {
    DeviceBuffer::from_slice(s, &vec![T::from_f64(v); n]).expect("alloc")
}

fn layernorm<T: DeviceElement>(c: &mut Criterion, s: &Stream, label: &str) {
    let mut g = c.benchmark_group(format!("layernorm_{}{label}", T::DTYPE));
    // 64 MiB of x; 256 KiB in quick mode.
    let x_bytes = if quick() { 1usize << 18 } else { 1usize << 26 };
    for cols in [1024usize, 4096, 8192] {
        let rows = x_bytes / cols / T::DTYPE.size_bytes();
        let shape = LayerNormParams {
            rows,
            cols,
            eps: 1e-5,
        };
        let n = rows * cols;
        let (x, w, b, dy) = (
            filled::<T>(s, n, 0.5),
            filled::<T>(s, cols, 1.0),
            filled::<T>(s, cols, 0.0),
            filled::<T>(s, n, 0.25),
        );
        let (mut y, mut dx) = (filled::<T>(s, n, 0.0), filled::<T>(s, n, 0.0));
        let (mut dw, mut db) = (filled::<T>(s, cols, 0.0), filled::<T>(s, cols, 0.0));
        let (mut mean, mut rstd) = (filled::<f32>(s, rows, 0.0), filled::<f32>(s, rows, 1.0));
        let e = T::DTYPE.size_bytes() as u64;
        g.throughput(Throughput::Bytes(2 * n as u64 * e + 8 * rows as u64));
        g.bench_function(BenchmarkId::new("forward", cols), |bench| {
            bench.iter(|| {
                let a = LayerNormForward::<OnDevice, _> {
                    params: shape,
                    x: &x,
                    weight: &w,
                    bias: &b,
                    y: &mut y,
                    mean: &mut mean,
                    rstd: &mut rstd,
                };
                ops::layernorm_forward(s, a).expect("forward");
                s.synchronize().expect("sync");
            })
        });
        // The fused residual forward: a and b read, residual and y written once each.
        let (a2, mut resid) = (filled::<T>(s, n, 0.25), filled::<T>(s, n, 0.0));
        g.throughput(Throughput::Bytes(4 * n as u64 * e + 8 * rows as u64));
        g.bench_function(BenchmarkId::new("residual_forward", cols), |bench| {
            bench.iter(|| {
                let a = ResidualLayerNormForward::<OnDevice, _> {
                    params: shape,
                    a: &x,
                    b: &a2,
                    weight: &w,
                    bias: &b,
                    residual: &mut resid,
                    y: &mut y,
                    mean: &mut mean,
                    rstd: &mut rstd,
                };
                ops::residual_layernorm_forward(s, a).expect("residual forward");
                s.synchronize().expect("sync");
            })
        });
        g.throughput(Throughput::Bytes(3 * n as u64 * e + 8 * rows as u64));
        g.bench_function(BenchmarkId::new("backward", cols), |bench| {
            bench.iter(|| {
                let a = LayerNormBackward::<OnDevice, _> {
                    params: shape,
                    x: &x,
                    weight: &w,
                    dy: &dy,
                    mean: &mean,
                    rstd: &rstd,
                    dx: &mut dx,
                    dweight: &mut dw,
                    dbias: &mut db,
                    accumulate: false,
                };
                ops::layernorm_backward(s, a).expect("backward");
                s.synchronize().expect("sync");
            })
        });
    }
    g.finish();
}

fn adamw(c: &mut Criterion, s: &Stream, label: &str) {
    let n = if quick() { 1usize << 16 } else { 1usize << 24 }; // 16 M parameters (quick: 64 K)
    let mut g = c.benchmark_group(format!("adamw{label}"));
    let params = AdamWParams {
        step: 10,
        ..AdamWParams::default()
    };
    // f32 params: param r/w, grad r, exp_avg r/w, exp_avg_sq r/w.
    let (mut p, gr, mut m, mut v) = (
        filled::<f32>(s, n, 1.0),
        filled::<f32>(s, n, 1e-3),
        filled::<f32>(s, n, 0.0),
        filled::<f32>(s, n, 0.0),
    );
    g.throughput(Throughput::Bytes(7 * 4 * n as u64));
    g.bench_function(BenchmarkId::new("f32", n), |bench| {
        bench.iter(|| {
            let t = AdamWTensor::<OnDevice, _> {
                param: &mut p,
                grad: &gr,
                exp_avg: &mut m,
                exp_avg_sq: &mut v,
                max_exp_avg_sq: None,
                master: None,
                weight_decay: None,
                lr_scale: None,
            };
            let a = AdamW {
                params,
                grad_scale: None,
                found_inf: None,
                tensors: &mut [t],
            };
            ops::adamw(s, a).expect("adamw");
            s.synchronize().expect("sync");
        })
    });
    // bf16 model copy with f32 master weights: master r/w, copy w, grad r, state r/w.
    let (mut p16, g16, mut master) = (
        filled::<bf16>(s, n, 1.0),
        filled::<bf16>(s, n, 1e-3),
        filled::<f32>(s, n, 1.0),
    );
    g.throughput(Throughput::Bytes((6 * 4 + 2 * 2) * n as u64));
    g.bench_function(BenchmarkId::new("bf16_master", n), |bench| {
        bench.iter(|| {
            let t = AdamWTensor::<OnDevice, _> {
                param: &mut p16,
                grad: &g16,
                exp_avg: &mut m,
                exp_avg_sq: &mut v,
                max_exp_avg_sq: None,
                master: Some(&mut master),
                weight_decay: None,
                lr_scale: None,
            };
            let a = AdamW {
                params,
                grad_scale: None,
                found_inf: None,
                tensors: &mut [t],
            };
            ops::adamw(s, a).expect("adamw");
            s.synchronize().expect("sync");
        })
    });
    g.finish();
}

fn benches(c: &mut Criterion) {
    let (s, peak, label) = setup();
    layernorm::<f32>(c, &s, &label);
    layernorm::<bf16>(c, &s, &label);
    adamw(c, &s, &label);
    println!("compare each GB/s figure above with the peak {peak:.0} GB/s (target ≥ 80 %){label}");
}

criterion_group! {
    name = device_bandwidth;
    config = config();
    targets = benches
}
criterion_main!(device_bandwidth);
