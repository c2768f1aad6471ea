//! Device throughput of matmul and attention (`--features device`), in TFLOPS, beside hipBLAS.
//! Never run on a GPU (no GPU was available when it was written).
//!
//! - matmul: square 1024³, 2048³, 4096³ and the skinny 8192×64×8192, 64×8192×8192 (M×N×K),
//!   f32 and f16, against `Blas::gemm` on the same shapes; the ratio ours / hipBLAS is printed.
//!   Targets (unverified until measured on a DCU): f32 ≥ 80 % of hipBLAS at 4096³, ≥ 100 % on
//!   the skinny shapes. The same shapes also run `matmul_bias` with GELU (`hip-kernels-bias-gelu`:
//!   the bias + GELU epilogue fused into the GEMM's store).
//! - attention forward and backward (non-causal, f16 and f32) for T ∈ {512, 2048, 8192},
//!   packed `[B, H, T, D]` and on the projections' layout (`forward_fused_qkv`: q, k, v from one
//!   fused `[B, T, 3, H, D]` buffer, out `[B, T, H, D]`, the backward into a fused gradient),
//!   D ∈ {64, 128}, FLOPs counted as FlashAttention-2 does (forward 4·BH·T²·D, backward 2.5×),
//!   beside a baseline of two hipBLAS strided-batched GEMMs (S = Q·Kᵀ into an f32/f16 T×T
//!   buffer, then S·V). The baseline has no softmax pass (this project has no standalone softmax
//!   kernel), so it is a lower bound on the time of "hipBLAS + softmax": the printed speed-up is
//!   conservative. Target: forward ≥ 2× that baseline at T = 2048.
//!
//! `HIPK_BENCH_QUICK=1`: small shapes and criterion's shortest settings, a smoke run (CI runs it
//! on hip-emu). On an emulated device every figure is labelled "emulated — not a performance
//! figure" (`benches/device_common`).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use hip_kernels::ops::{
    self, AttentionBackward, AttentionBackwardStrided, AttentionForward, AttentionForwardStrided,
    AttentionLayout, AttentionParams, DeviceElement, Matmul, MatmulBias, MatmulBiasParams,
    MatmulParams, Qkv, Strided,
};
use hip_kernels::params::{f16, OnDevice};
use hip_rt::{Batch, Blas, Device, DeviceBuffer, Gemm, GemmElement, Stream, StreamOptions};
use std::sync::Arc;
use std::time::Instant;

#[path = "device_common/mod.rs"]
mod device_common;
use device_common::{announce, config, quick};

/// The stream, the BLAS handle and the figure label (emulated devices).
fn setup() -> (Arc<Stream>, Blas, String) {
    let device = Device::get(0).expect("the device bench needs HIP device 0");
    let label = announce(&device);
    println!(
        "device 0: {} ({}), {} CUs",
        device.name(),
        device.arch(),
        device.compute_units()
    );
    let stream = Arc::new(Stream::new(&device, StreamOptions::default()).expect("stream"));
    let blas = Blas::new(stream.clone()).expect("hipBLAS or rocBLAS (DTK ships both)");
    (stream, blas, label)
}

fn filled<T: DeviceElement>(s: &Stream, n: usize, v: f64) -> DeviceBuffer<T> {
    DeviceBuffer::from_slice(s, &vec![T::from_f64(v); n]).expect("alloc")
}

/// Mean seconds per call of `f` (queued back to back, one sync at the end), after a warm-up.
fn seconds_per_call(s: &Stream, mut f: impl FnMut()) -> f64 {
    f();
    s.synchronize().expect("sync");
    let iters = 10;
    let t = Instant::now();
    for _ in 0..iters {
        f();
    }
    s.synchronize().expect("sync");
    t.elapsed().as_secs_f64() / f64::from(iters)
}

/// Quick mode: one square and one skinny shape, small enough for hip-emu.
const QUICK_MATMUL: [(usize, usize, usize); 2] = [(128, 128, 128), (256, 16, 128)];
const FULL_MATMUL: [(usize, usize, usize); 5] = [
    (1024, 1024, 1024),
    (2048, 2048, 2048),
    (4096, 4096, 4096),
    (8192, 64, 8192),
    (64, 8192, 8192),
];

fn matmul<T: DeviceElement + GemmElement>(c: &mut Criterion, s: &Stream, blas: &Blas, label: &str) {
    let mut g = c.benchmark_group(format!("matmul_{}{label}", T::DTYPE));
    g.sample_size(10);
    let shapes: &[(usize, usize, usize)] = if quick() { &QUICK_MATMUL } else { &FULL_MATMUL };
    for &(m, n, k) in shapes {
        let params = MatmulParams::new(m, n, k);
        let (gemm, _) = params.gemm(); // the same product through hipBLAS
        let (a, b) = (filled::<T>(s, m * k, 0.01), filled::<T>(s, k * n, 0.02));
        let mut out = filled::<T>(s, m * n, 0.0);
        let ours = |out: &mut DeviceBuffer<T>| {
            let args = Matmul::<OnDevice, T> {
                params,
                a: &a,
                b: &b,
                out,
            };
            ops::matmul(s, args).expect("matmul");
        };
        let flops = 2.0 * (m * n * k) as f64;
        let id = format!("{m}x{n}x{k}");
        g.throughput(Throughput::Elements(flops as u64));
        g.bench_function(BenchmarkId::new("hip-kernels", &id), |bench| {
            bench.iter(|| {
                ours(&mut out);
                s.synchronize().expect("sync");
            })
        });
        // The same GEMM with the fused bias + GELU epilogue (matmul_bias, one launch).
        let bias = filled::<T>(s, n, 0.1);
        let bias_params = MatmulBiasParams {
            batch: 1,
            m,
            n,
            k,
            trans_a: false,
            trans_b: false,
            gelu: true,
        };
        g.bench_function(BenchmarkId::new("hip-kernels-bias-gelu", &id), |bench| {
            bench.iter(|| {
                let args = MatmulBias::<OnDevice, T> {
                    params: bias_params,
                    a: &a,
                    b: &b,
                    bias: &bias,
                    out: &mut out,
                    pre_gelu: None,
                };
                ops::matmul_bias(s, args).expect("matmul_bias");
                s.synchronize().expect("sync");
            })
        });
        g.bench_function(BenchmarkId::new("hipblas", &id), |bench| {
            bench.iter(|| {
                blas.gemm(&gemm, &a, &b, &mut out).expect("gemm");
                s.synchronize().expect("sync");
            })
        });
        let ours = seconds_per_call(s, || ours(&mut out));
        let theirs = seconds_per_call(s, || blas.gemm(&gemm, &a, &b, &mut out).expect("gemm"));
        println!(
            "matmul {} {id}: hip-kernels {:.2} TFLOPS, {:?} {:.2} TFLOPS, ratio {:.2}{label}",
            T::DTYPE,
            flops / ours / 1e12,
            blas.backend(),
            flops / theirs / 1e12,
            theirs / ours
        );
    }
    g.finish();
}

fn attention<T: DeviceElement + GemmElement>(
    c: &mut Criterion,
    s: &Stream,
    blas: &Blas,
    label: &str,
) {
    let mut g = c.benchmark_group(format!("attention_{}{label}", T::DTYPE));
    g.sample_size(10);
    let (ts, ds): (&[usize], &[usize]) = if quick() {
        (&[64], &[64])
    } else {
        (&[512, 2048, 8192], &[64, 128])
    };
    for &t in ts {
        for &d in ds {
            let heads = if quick() {
                1
            } else if t == 8192 {
                4
            } else {
                16
            };
            let shape = AttentionParams {
                batch: 1,
                heads,
                n_kv_heads: heads,
                tq: t,
                tk: t,
                head_dim: d,
                causal: false,
                scale: AttentionParams::default_scale(d),
            };
            let n = heads * t * d;
            let (q, k, v, dout) = (
                filled::<T>(s, n, 0.01),
                filled::<T>(s, n, 0.02),
                filled::<T>(s, n, 0.03),
                filled::<T>(s, n, 0.04),
            );
            let (mut out, mut dq, mut dk, mut dv) = (
                filled::<T>(s, n, 0.0),
                filled::<T>(s, n, 0.0),
                filled::<T>(s, n, 0.0),
                filled::<T>(s, n, 0.0),
            );
            let mut lse = filled::<f32>(s, heads * t, 0.0);
            let fwd_flops = 4.0 * (heads * t * t * d) as f64;
            let id = format!("T{t}_D{d}");
            g.throughput(Throughput::Elements(fwd_flops as u64));
            let forward = |out: &mut DeviceBuffer<T>, lse: &mut DeviceBuffer<f32>| {
                let args = AttentionForward::<OnDevice, T> {
                    params: shape,
                    q: &q,
                    k: &k,
                    v: &v,
                    out,
                    lse,
                    cu_seqlens: None,
                };
                ops::attention_forward(s, args).expect("forward");
            };
            g.bench_function(BenchmarkId::new("forward", &id), |bench| {
                bench.iter(|| {
                    forward(&mut out, &mut lse);
                    s.synchronize().expect("sync");
                })
            });
            let fwd = seconds_per_call(s, || forward(&mut out, &mut lse));
            let bwd = seconds_per_call(s, || {
                let args = AttentionBackward::<OnDevice, T> {
                    params: shape,
                    q: &q,
                    k: &k,
                    v: &v,
                    out: &out,
                    dout: &dout,
                    lse: &lse,
                    dq: &mut dq,
                    dk: &mut dk,
                    dv: &mut dv,
                    cu_seqlens: None,
                };
                ops::attention_backward(s, args).expect("backward")
            });
            // Baseline: S = Q·Kᵀ ([heads, t, t]) then O = S·V, two strided-batched GEMMs.
            let mut scores = filled::<T>(s, heads * t * t, 0.0);
            let qk = Gemm {
                trans_b: true,
                ..Gemm::new(t, t, d)
            };
            let sv = Gemm::new(t, d, t);
            let baseline = seconds_per_call(s, || {
                blas.gemm_strided_batched(&qk, &Batch::packed(&qk, heads), &q, &k, &mut scores)
                    .expect("qk");
                blas.gemm_strided_batched(&sv, &Batch::packed(&sv, heads), &scores, &v, &mut out)
                    .expect("sv");
            });
            println!(
                "attention {} {id} (BH {heads}): forward {:.2} TFLOPS, backward {:.2} TFLOPS, \
                 forward vs 2-GEMM baseline (no softmax) {:.2}x{label}",
                T::DTYPE,
                fwd_flops / fwd / 1e12,
                2.5 * fwd_flops / bwd / 1e12,
                baseline / fwd
            );
            attention_strided::<T>(&mut g, s, shape, &id, label, fwd_flops);
        }
    }
    g.finish();
}

/// The same shape on the projections' layout: q, k, v read from one fused `[B, T, 3, H, D]`
/// buffer, out written as `[B, T, H, D]`, the backward into a fused `[B, T, 3, H, D]` gradient
/// (`ops::attention_forward_strided` / `attention_backward_strided`).
fn attention_strided<T: DeviceElement>(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    s: &Stream,
    shape: AttentionParams,
    id: &str,
    label: &str,
    fwd_flops: f64,
) {
    let (t, h, d) = (shape.tq, shape.heads, shape.head_dim);
    let n = shape.batch * t * h * d;
    let qkv = filled::<T>(s, 3 * n, 0.01);
    let dout = filled::<T>(s, n, 0.04);
    let (mut out, mut dqkv) = (filled::<T>(s, n, 0.0), filled::<T>(s, 3 * n, 0.0));
    let mut lse = filled::<f32>(s, shape.batch * h * t, 0.0);
    let fused = |w| AttentionLayout::fused_qkv(w, t, h, d);
    let bthd = AttentionLayout::bthd(t, h, d);
    let forward = |out: &mut DeviceBuffer<T>, lse: &mut DeviceBuffer<f32>| {
        let view = |w| Strided::<OnDevice, T> {
            data: &qkv,
            layout: fused(w),
        };
        let args = AttentionForwardStrided {
            params: shape,
            q: view(Qkv::Q),
            k: view(Qkv::K),
            v: view(Qkv::V),
            out,
            out_layout: bthd,
            lse,
            cu_seqlens: None,
        };
        ops::attention_forward_strided(s, args).expect("forward (strided)");
    };
    g.bench_function(BenchmarkId::new("forward_fused_qkv", id), |bench| {
        bench.iter(|| {
            forward(&mut out, &mut lse);
            s.synchronize().expect("sync");
        })
    });
    let fwd = seconds_per_call(s, || forward(&mut out, &mut lse));
    let bwd = seconds_per_call(s, || {
        let args = AttentionBackwardStrided::<OnDevice, T> {
            params: shape,
            q: Strided {
                data: &qkv,
                layout: fused(Qkv::Q),
            },
            k: Strided {
                data: &qkv,
                layout: fused(Qkv::K),
            },
            v: Strided {
                data: &qkv,
                layout: fused(Qkv::V),
            },
            out: Strided {
                data: &out,
                layout: bthd,
            },
            dout: Strided {
                data: &dout,
                layout: bthd,
            },
            lse: &lse,
            dqkv: &mut dqkv,
            dq: fused(Qkv::Q),
            dk: fused(Qkv::K),
            dv: fused(Qkv::V),
            cu_seqlens: None,
        };
        ops::attention_backward_strided(s, args).expect("backward (strided)")
    });
    println!(
        "attention {} {id} fused QKV -> [B, T, H, D] (BH {h}): forward {:.2} TFLOPS, backward \
         {:.2} TFLOPS{label}",
        T::DTYPE,
        fwd_flops / fwd / 1e12,
        2.5 * fwd_flops / bwd / 1e12,
    );
}

fn benches(c: &mut Criterion) {
    let (s, blas, label) = setup();
    matmul::<f32>(c, &s, &blas, &label);
    matmul::<f16>(c, &s, &blas, &label);
    attention::<f16>(c, &s, &blas, &label);
    attention::<f32>(c, &s, &blas, &label);
}

criterion_group! {
    name = device;
    config = config();
    targets = benches
}
criterion_main!(device);
