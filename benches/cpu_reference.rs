//! Criterion bench of the CPU reference ops (f64 accumulation; the oracle, not a fast path).
//! Run: `cargo bench -p hip-kernels --bench cpu_reference`.

#[path = "../tests/cpu_common/mod.rs"]
mod cpu_common;

use cpu_common::{cast, LayerNormData, Normal};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use half::bf16;
use hip_kernels::cpu::{
    self, AdamWConfig, AdamWStep, AttentionShape, Element, LayerNormShape, MatmulShape,
};
use std::hint::black_box;

fn matmul<T: Element>(c: &mut Criterion, rng: &mut Normal) {
    let s = MatmulShape::new(128, 128, 128);
    let (a, b) = (
        cast::<T>(&rng.vec(s.a_len().unwrap_or(0))),
        cast::<T>(&rng.vec(s.b_len().unwrap_or(0))),
    );
    let mut out = vec![T::from_f64(0.0); s.out_len().unwrap_or(0)];
    let mut g = c.benchmark_group("matmul");
    g.throughput(Throughput::Elements((s.m * s.n * s.k) as u64));
    g.bench_function(format!("{}_128x128x128", T::DTYPE), |bch| {
        bch.iter(|| cpu::matmul(&s, 1.0, 0.0, black_box(&a), black_box(&b), &mut out))
    });
    g.finish();
}

fn layernorm(c: &mut Criterion, rng: &mut Normal) {
    let s = LayerNormShape {
        rows: 64,
        cols: 768,
    };
    let n = s.rows * s.cols;
    let mut d = LayerNormData::<bf16>::random(rng, &s);
    let mut g = c.benchmark_group("layernorm");
    g.throughput(Throughput::Elements(n as u64));
    g.bench_function("forward_bf16_64x768", |bch| {
        bch.iter(|| black_box(&mut d).forward(&s, 1e-5))
    });
    g.bench_function("backward_bf16_64x768", |bch| {
        bch.iter(|| black_box(&mut d).backward(&s))
    });
    g.finish();
}

fn attention(c: &mut Criterion, rng: &mut Normal) {
    let s = AttentionShape {
        batch: 1,
        heads: 4,
        tq: 128,
        tk: 128,
        head_dim: 64,
        causal: true,
        scale: AttentionShape::default_scale(64),
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
    let _ = cpu::attention_forward(&s, &q, &k, &v, &mut out, &mut lse);
    let mut g = c.benchmark_group("attention");
    g.bench_function("forward_f32_h4_t128_d64_causal", |bch| {
        bch.iter(|| cpu::attention_forward(&s, black_box(&q), &k, &v, &mut out, &mut lse))
    });
    g.bench_function("backward_f32_h4_t128_d64_causal", |bch| {
        bch.iter(|| {
            cpu::attention_backward(
                &s,
                black_box(&q),
                &k,
                &v,
                &out,
                &dout,
                &lse,
                &mut dq,
                &mut dk,
                &mut dv,
            )
        })
    });
    g.finish();
}

fn adamw(c: &mut Criterion, rng: &mut Normal) {
    let n = 1 << 18;
    let (mut p, grad) = (cast::<f32>(&rng.vec(n)), cast::<f32>(&rng.vec(n)));
    let (mut m, mut v, mut vmax) = (vec![0.0f32; n], vec![0.0f32; n], vec![0.0f32; n]);
    let cfg = AdamWConfig {
        amsgrad: true,
        ..AdamWConfig::default()
    };
    let mut g = c.benchmark_group("adamw");
    g.throughput(Throughput::Elements(n as u64));
    g.bench_function("f32_amsgrad_256k", |bch| {
        bch.iter(|| {
            cpu::adamw(
                &cfg,
                &AdamWStep::new(3),
                &mut p,
                black_box(&grad),
                &mut m,
                &mut v,
                Some(&mut vmax),
            )
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
