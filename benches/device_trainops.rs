//! Device bandwidth of the training-step ops (`--features device`): GELU forward/backward and
//! the residual add over 64 MiB tensors, the fused cross-entropy over GPT-2-wide rows
//! (V = 50257 padded to 50304), the encoder forward/backward and the bias gradient, in GB/s of
//! compulsory traffic (each input read once, each output written once; the cross-entropy reads
//! its logits twice by design and is counted once). NEVER RUN: no GPU was available when it was
//! written.
//!
//! `HIPK_BENCH_QUICK=1`: small shapes and criterion's shortest settings, a smoke run (CI runs it
//! on hip-emu). On an emulated device every figure is labelled "emulated — not a performance
//! figure" (`benches/device_common`).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use hip_kernels::ops::{
    self, BiasBackward, BiasParams, CrossEntropyParams, DeviceElement, ElementwiseParams,
    EncoderBackward, EncoderForward, EncoderParams, GeluBackward, GeluForward, ResidualAdd,
    SoftmaxCrossEntropy,
};
use hip_kernels::params::{bf16, OnDevice};
use hip_rt::{Device, DeviceBuffer, Stream, StreamOptions};

#[path = "device_common/mod.rs"]
mod device_common;
use device_common::{announce, config, quick};

/// The stream and the figure label (emulated devices).
fn setup() -> (Stream, String) {
    let device = Device::get(0).expect("the device bench needs HIP device 0");
    let label = announce(&device);
    println!("device 0: {} ({})", device.name(), device.arch());
    (
        Stream::new(&device, StreamOptions::default()).expect("stream"),
        label,
    )
}

fn filled<T: DeviceElement>(s: &Stream, n: usize, v: f64) -> DeviceBuffer<T> {
    DeviceBuffer::from_slice(s, &vec![T::from_f64(v); n]).expect("alloc")
}

fn elementwise<T: DeviceElement>(c: &mut Criterion, s: &Stream, label: &str) {
    let mut g = c.benchmark_group(format!("elementwise_{}{label}", T::DTYPE));
    let bytes = if quick() { 1usize << 18 } else { 1usize << 26 }; // 64 MiB (quick: 256 KiB)
    let n = bytes / T::DTYPE.size_bytes();
    let params = ElementwiseParams { len: n };
    let (x, d) = (filled::<T>(s, n, 0.5), filled::<T>(s, n, 0.25));
    let mut out = filled::<T>(s, n, 0.0);
    let e = (n * T::DTYPE.size_bytes()) as u64;
    g.throughput(Throughput::Bytes(2 * e));
    g.bench_function(BenchmarkId::new("gelu_forward", n), |b| {
        b.iter(|| {
            ops::gelu_forward(
                s,
                GeluForward::<OnDevice, _> {
                    params,
                    x: &x,
                    out: &mut out,
                },
            )
            .expect("gelu");
            s.synchronize().expect("sync");
        })
    });
    g.throughput(Throughput::Bytes(3 * e));
    g.bench_function(BenchmarkId::new("gelu_backward", n), |b| {
        b.iter(|| {
            ops::gelu_backward(
                s,
                GeluBackward::<OnDevice, _> {
                    params,
                    x: &x,
                    dout: &d,
                    dx: &mut out,
                },
            )
            .expect("gelu bwd");
            s.synchronize().expect("sync");
        })
    });
    g.bench_function(BenchmarkId::new("residual_add", n), |b| {
        b.iter(|| {
            ops::residual_add(
                s,
                ResidualAdd::<OnDevice, _> {
                    params,
                    a: &x,
                    b: &d,
                    out: &mut out,
                },
            )
            .expect("add");
            s.synchronize().expect("sync");
        })
    });
    g.finish();
}

fn crossentropy<T: DeviceElement>(c: &mut Criterion, s: &Stream, label: &str) {
    let mut g = c.benchmark_group(format!("crossentropy_{}{label}", T::DTYPE));
    let rows = if quick() { 4 } else { 1024usize };
    let (vocab, padded_vocab) = (50257usize, 50304usize);
    let params = CrossEntropyParams {
        rows,
        vocab,
        padded_vocab,
        dloss: Some(1.0),
        divisor: None,
    };
    let mut logits = filled::<T>(s, rows * padded_vocab, 0.1);
    let targets = DeviceBuffer::from_slice(s, &vec![7i32; rows]).expect("targets");
    let mut losses = filled::<f32>(s, rows, 0.0);
    g.throughput(Throughput::Bytes(
        (2 * rows * padded_vocab * T::DTYPE.size_bytes()) as u64,
    ));
    g.bench_function(BenchmarkId::new("fused", vocab), |b| {
        b.iter(|| {
            ops::softmax_cross_entropy(
                s,
                SoftmaxCrossEntropy::<OnDevice, _> {
                    params,
                    logits: &mut logits,
                    targets: &targets,
                    losses: &mut losses,
                    loss: None,
                    totals: None,
                    error: None,
                },
            )
            .expect("crossentropy");
            s.synchronize().expect("sync");
        })
    });
    g.finish();
}

fn encoder_and_bias<T: DeviceElement>(c: &mut Criterion, s: &Stream, label: &str) {
    let mut g = c.benchmark_group(format!("encoder_{}{label}", T::DTYPE));
    let p = if quick() {
        EncoderParams {
            batch: 1,
            seq: 64,
            channels: 768,
            vocab: 1000,
            positions: 64,
            accumulate: true,
        }
    } else {
        EncoderParams {
            batch: 8,
            seq: 1024,
            channels: 768,
            vocab: 50257,
            positions: 1024,
            accumulate: true,
        }
    };
    let rows = p.batch * p.seq;
    let tokens: Vec<i32> = (0..rows).map(|i| ((i * 7919) % p.vocab) as i32).collect();
    let tokens = DeviceBuffer::from_slice(s, &tokens).expect("tokens");
    let (wte, wpe) = (
        filled::<T>(s, p.vocab * p.channels, 0.1),
        filled::<T>(s, p.positions * p.channels, 0.1),
    );
    let mut out = filled::<T>(s, rows * p.channels, 0.0);
    let (mut dwte, mut dwpe) = (
        filled::<T>(s, p.vocab * p.channels, 0.0),
        filled::<T>(s, p.positions * p.channels, 0.0),
    );
    let e = (rows * p.channels * T::DTYPE.size_bytes()) as u64;
    g.throughput(Throughput::Bytes(3 * e));
    g.bench_function(BenchmarkId::new("forward", rows), |b| {
        b.iter(|| {
            ops::encoder_forward(
                s,
                EncoderForward::<OnDevice, _> {
                    params: p,
                    tokens: &tokens,
                    wte: &wte,
                    wpe: &wpe,
                    out: &mut out,
                    error: None,
                },
            )
            .expect("fwd");
            s.synchronize().expect("sync");
        })
    });
    g.bench_function(BenchmarkId::new("backward", rows), |b| {
        b.iter(|| {
            ops::encoder_backward(
                s,
                EncoderBackward::<OnDevice, _> {
                    params: p,
                    tokens: &tokens,
                    dout: &out,
                    dwte: &mut dwte,
                    dwpe: &mut dwpe,
                    error: None,
                },
            )
            .expect("bwd");
            s.synchronize().expect("sync");
        })
    });
    let bp = BiasParams {
        rows,
        cols: 3 * p.channels,
        accumulate: false,
    };
    let dout = filled::<T>(s, rows * bp.cols, 0.1);
    let mut dbias = filled::<T>(s, bp.cols, 0.0);
    g.throughput(Throughput::Bytes(
        (rows * bp.cols * T::DTYPE.size_bytes()) as u64,
    ));
    g.bench_function(BenchmarkId::new("bias_backward", bp.cols), |b| {
        b.iter(|| {
            ops::bias_backward(
                s,
                BiasBackward::<OnDevice, _> {
                    params: bp,
                    dout: &dout,
                    dbias: &mut dbias,
                },
            )
            .expect("dbias");
            s.synchronize().expect("sync");
        })
    });
    g.finish();
}

fn benches(c: &mut Criterion) {
    let (s, label) = setup();
    elementwise::<f32>(c, &s, &label);
    elementwise::<bf16>(c, &s, &label);
    crossentropy::<f32>(c, &s, &label);
    crossentropy::<bf16>(c, &s, &label);
    encoder_and_bias::<bf16>(c, &s, &label);
}

/// 20 samples (the default 100 takes minutes on 64 MiB tensors); quick mode's settings with
/// `HIPK_BENCH_QUICK=1`.
fn trainops_config() -> Criterion {
    if quick() {
        config()
    } else {
        Criterion::default().sample_size(20)
    }
}

criterion_group!(name = trainops; config = trainops_config(); targets = benches);
criterion_main!(trainops);
