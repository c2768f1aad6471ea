//! Criterion bench of the CPU reference ops (f64 accumulation; the oracle, not a fast path).
//! Run: `cargo bench -p hip-kernels --bench cpu_reference`.

#[path = "../tests/cpu_common/mod.rs"]
mod cpu_common;

use cpu_common::{cast, LayerNormData, Normal};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use half::bf16;
use hip_kernels::cpu;
use hip_kernels::ops::{
    AdamW, AdamWParams, AdamWTensor, AttentionBackward, AttentionForward, AttentionParams,
    LayerNormParams, Matmul, MatmulParams,
};
use hip_kernels::params::{DeviceElement, Host};
use std::hint::black_box;

fn matmul<T: DeviceElement>(c: &mut Criterion, rng: &mut Normal) {
    let s = MatmulParams::new(128, 128, 128);
    let (a, b) = (
        cast::<T>(&rng.vec(s.a_len().unwrap_or(0))),
        cast::<T>(&rng.vec(s.b_len().unwrap_or(0))),
    );
    let mut out = vec![T::from_f64(0.0); s.out_len().unwrap_or(0)];
    let mut g = c.benchmark_group("matmul");
    g.throughput(Throughput::Elements((s.m * s.n * s.k) as u64));
    g.bench_function(format!("{}_128x128x128", T::DTYPE), |bch| {
        bch.iter(|| {
            cpu::matmul(Matmul::<Host, T> {
                params: s,
                a: black_box(&a),
                b: black_box(&b),
                out: &mut out,
            })
        })
    });
    g.finish();
}

fn layernorm(c: &mut Criterion, rng: &mut Normal) {
    let s = LayerNormParams {
        rows: 64,
        cols: 768,
        eps: 1e-5,
    };
    let n = s.rows * s.cols;
    let mut d = LayerNormData::<bf16>::random(rng, &s);
    let mut g = c.benchmark_group("layernorm");
    g.throughput(Throughput::Elements(n as u64));
    g.bench_function("forward_bf16_64x768", |bch| {
        bch.iter(|| black_box(&mut d).forward(&s))
    });
    g.bench_function("backward_bf16_64x768", |bch| {
        bch.iter(|| black_box(&mut d).backward(&s))
    });
    g.finish();
}

fn attention(c: &mut Criterion, rng: &mut Normal) {
    let s = AttentionParams {
        batch: 1,
        heads: 4,
        n_kv_heads: 4,
        tq: 128,
        tk: 128,
        head_dim: 64,
        causal: true,
        scale: AttentionParams::default_scale(64),
    };
    let (nq, nk) = (s.q_len().unwrap_or(0), s.kv_len().unwrap_or(0));
    let (q, k, v, dout) = (
        cast::<f32>(&rng.vec(nq)),
        cast::<f32>(&rng.vec(nk)),
        cast::<f32>(&rng.vec(nk)),
        cast::<f32>(&rng.vec(nq)),
    );
    let (mut out, mut lse) = (vec![0.0f32; nq], vec![0.0f32; s.lse_len().unwrap_or(0)]);
    let (mut dq, mut dk, mut dv) = (vec![0.0f32; nq], vec![0.0f32; nk], vec![0.0f32; nk]);
    let forward = |q: &[f32], out: &mut [f32], lse: &mut [f32]| {
        cpu::attention_forward(AttentionForward::<Host, f32> {
            params: s,
            q,
            k: &k,
            v: &v,
            out,
            lse,
            cu_seqlens: None,
        })
    };
    let _ = forward(&q, &mut out, &mut lse);
    let mut g = c.benchmark_group("attention");
    g.bench_function("forward_f32_h4_t128_d64_causal", |bch| {
        bch.iter(|| forward(black_box(&q), &mut out, &mut lse))
    });
    g.bench_function("backward_f32_h4_t128_d64_causal", |bch| {
        bch.iter(|| {
            cpu::attention_backward(AttentionBackward::<Host, f32> {
                params: s,
                q: black_box(&q),
                k: &k,
                v: &v,
                out: &out,
                dout: &dout,
                lse: &lse,
                dq: &mut dq,
                dk: &mut dk,
                dv: &mut dv,
                cu_seqlens: None,
            })
        })
    });
    g.finish();
}

fn adamw(c: &mut Criterion, rng: &mut Normal) {
    let n = 1 << 18;
    let (mut p, grad) = (cast::<f32>(&rng.vec(n)), cast::<f32>(&rng.vec(n)));
    let (mut m, mut v, mut vmax) = (vec![0.0f32; n], vec![0.0f32; n], vec![0.0f32; n]);
    let params = AdamWParams {
        amsgrad: true,
        step: 3,
        ..AdamWParams::default()
    };
    let mut g = c.benchmark_group("adamw");
    g.throughput(Throughput::Elements(n as u64));
    g.bench_function("f32_amsgrad_256k", |bch| {
        bch.iter(|| {
            cpu::adamw(AdamW::<Host, f32> {
                params,
                grad_scale: None,
                found_inf: None,
                tensors: &mut [AdamWTensor {
                    param: &mut p,
                    grad: black_box(&grad),
                    exp_avg: &mut m,
                    exp_avg_sq: &mut v,
                    max_exp_avg_sq: Some(&mut vmax),
                    master: None,
                    weight_decay: None,
                    lr_scale: None,
                }],
            })
        })
    });
    g.finish();
}

fn benches(c: &mut Criterion) {
    let mut rng = Normal::new(42);
    matmul::<f32>(c, &mut rng);
    matmul::<bf16>(c, &mut rng);
    layernorm(c, &mut rng);
    attention(c, &mut rng);
    adamw(c, &mut rng);
}

criterion_group!(cpu_reference, benches);
criterion_main!(cpu_reference);
