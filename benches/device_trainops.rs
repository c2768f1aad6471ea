//! Device bandwidth of the training-step ops (`--features device`): GELU forward/backward and
//! the residual add over 64 MiB tensors, the fused cross-entropy over GPT-2-wide rows
//! (V = 50257 padded to 50304), the encoder forward/backward and the bias gradient, the
//! LLaMA-family ops (RMS norm, fused SwiGLU, rotary on q in place), in GB/s of
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
use hip_kernels::ops::{
    AttentionLayout, GateUp, Qkv, RmsNormBackward, RmsNormForward, RmsNormParams, Rope, RopeParams,
    RopeScaling, SwigluForward, SwigluParams,
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

/// The LLaMA-family ops at a LLaMA-7B layer's shapes (quick: small): RMS norm forward and
/// backward over C = 4096, SwiGLU forward on the fused gate-up output (F = 11008), rotary in
/// place on q (32 heads of 128) inside a fused QKV projection.
fn llama_ops<T: DeviceElement>(c: &mut Criterion, s: &Stream, label: &str) {
    let mut g = c.benchmark_group(format!("llama_ops_{}{label}", T::DTYPE));
    let (rows, cols, ffn) = if quick() {
        (64, 256, 688)
    } else {
        (4096, 4096, 11008)
    };
    let e = T::DTYPE.size_bytes() as u64;
    let p = RmsNormParams {
        rows,
        cols,
        eps: 1e-6,
    };
    let (x, w, dy) = (
        filled::<T>(s, rows * cols, 0.5),
        filled::<T>(s, cols, 1.0),
        filled::<T>(s, rows * cols, 0.25),
    );
    let (mut y, mut dx, mut dw) = (
        filled::<T>(s, rows * cols, 0.0),
        filled::<T>(s, rows * cols, 0.0),
        filled::<T>(s, cols, 0.0),
    );
    let mut rstd = DeviceBuffer::<f32>::zeroed(s, rows).expect("alloc");
    g.throughput(Throughput::Bytes(2 * e * (rows * cols) as u64));
    g.bench_function(BenchmarkId::new("rmsnorm_forward", cols), |b| {
        b.iter(|| {
            ops::rmsnorm_forward(
                s,
                RmsNormForward::<OnDevice, _> {
                    params: p,
                    x: &x,
                    weight: &w,
                    y: &mut y,
                    rstd: &mut rstd,
                },
            )
            .expect("rmsnorm");
            s.synchronize().expect("sync");
        })
    });
    g.throughput(Throughput::Bytes(3 * e * (rows * cols) as u64));
    g.bench_function(BenchmarkId::new("rmsnorm_backward", cols), |b| {
        b.iter(|| {
            let a = RmsNormBackward::<OnDevice, _> {
                params: p,
                x: &x,
                weight: &w,
                dy: &dy,
                rstd: &rstd,
                dx: &mut dx,
                dweight: &mut dw,
                accumulate: false,
            };
            ops::rmsnorm_backward(s, a).expect("rmsnorm bwd");
            s.synchronize().expect("sync");
        })
    });
    let sp = SwigluParams { rows, ffn };
    let gu = filled::<T>(s, rows * 2 * ffn, 0.5);
    let mut h = filled::<T>(s, rows * ffn, 0.0);
    g.throughput(Throughput::Bytes(3 * e * (rows * ffn) as u64));
    g.bench_function(BenchmarkId::new("swiglu_forward_fused", ffn), |b| {
        b.iter(|| {
            let a = SwigluForward::<OnDevice, _> {
                params: sp,
                input: GateUp::Fused { gate_up: &gu },
                h: &mut h,
            };
            ops::swiglu_forward(s, a).expect("swiglu");
            s.synchronize().expect("sync");
        })
    });
    let (heads, d) = (cols / 128, 128);
    let rp = RopeParams {
        batch: 1,
        seq: rows,
        heads,
        head_dim: d,
        rotary_dim: d,
        interleaved: false,
    };
    let mut qkv = filled::<T>(s, rows * 3 * heads * d, 0.5);
    let pos: Vec<i32> = (0..rows as i32).collect();
    let pos = DeviceBuffer::from_slice(s, &pos).expect("alloc");
    let freqs = ops::rope_frequencies(10000.0, d, RopeScaling::Default).expect("freqs");
    let freqs = DeviceBuffer::from_slice(s, &freqs).expect("alloc");
    let layout = AttentionLayout::fused_qkv(Qkv::Q, rows, heads, d);
    g.throughput(Throughput::Bytes(2 * e * (rows * heads * d) as u64));
    g.bench_function(BenchmarkId::new("rope_forward_q", d), |b| {
        b.iter(|| {
            let a = Rope::<OnDevice, _> {
                params: rp,
                x: &mut qkv,
                layout,
                positions: &pos,
                freqs: &freqs,
            };
            ops::rope_forward(s, a).expect("rope");
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
    llama_ops::<bf16>(c, &s, &label);
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
