//! Device tests of the matmul and attention kernels against the CPU reference (`--features
//! device`; needs a HIP device and kernels built for its arch). Run on hip-emu (the
//! emulated device, in CI); never run on a GPU.
//!
//! - golden cases (matmul, attention forward/backward, packed and strided) through the library's
//!   `DeviceBackend`;
//! - random shapes: matmul M, N, K ∈ {1, 7, 64, 129, 300} (every layout, every dtype, alpha and
//!   beta, batches), a K of 2000, a K of 0, and a batched shape that takes the 128×128 tile with
//!   edge tiles on both axes; attention T ∈ {1, 17, 128, 300} (Tq = Tk and Tq ≠ Tk), head dims
//!   16, 32, 64, 80, 96, 128, causal or not, every dtype. The sizes are chosen for what they
//!   cover (1 and 7: a partial first tile; 64 and 128: exact tiles; 129: one element past a tile;
//!   300: several tiles and a partial one, 300 mod 64, 32, 16 and 8 all nonzero); larger sizes
//!   add nothing a tiled kernel can get wrong and cost minutes on hip-emu;
//! - beta = 0 never reads C (C holds NaN); the backward is bit-identical run to run;
//! - misaligned views (the alignment fallback), every layout and dtype; head dims off the buckets
//!   (7, 100) and fully masked rows (causal, Tq > Tk);
//! - the attention backward is held to `Rule::Reduction` (the kernels keep P and dS in f32; see
//!   `src/tolerance.rs`). Strided layouts: `tests/device_attention_strided.rs`.
#![cfg(feature = "device")]

use hip_kernels::cpu;
use hip_kernels::ops::{
    self, AttentionBackward, AttentionForward, AttentionParams, DeviceElement, Matmul, MatmulParams,
};
use hip_kernels::params::{Host, OnDevice};
use hip_kernels::tolerance::Rule;
use hip_rt::Stream;

mod device_common;

use device_common::*;

// ---------------------------------------------------------------------------------------------
// Random shapes
// ---------------------------------------------------------------------------------------------

/// One matmul against the reference; `off` = 0 through the golden-case path (fresh, aligned
/// buffers), `off` > 0 on views that far into their allocations (a, b and out misaligned).
fn check_matmul_at<T: DeviceElement>(s: &Stream, rng: &mut Rng, shape: MatmulParams, off: usize) {
    let (alpha, beta) = (shape.alpha, shape.beta);
    let a = rng.vec::<T>(shape.a_len().unwrap(), 1.0);
    let b = rng.vec::<T>(shape.b_len().unwrap(), 1.0);
    let c: Vec<T> = if beta == 0.0 {
        vec![T::from_f64(f64::NAN); shape.out_len().unwrap()] // must never be read
    } else {
        rng.vec(shape.out_len().unwrap(), 1.0)
    };
    let mut want = c.clone();
    cpu::matmul(Matmul::<Host, T> {
        params: shape,
        a: &a,
        b: &b,
        out: &mut want,
    })
    .unwrap();
    let got = if off == 0 {
        matmul_device(s, &shape, &a, &b, &c).unwrap()
    } else {
        let (da, db) = (Shifted::new(s, &a, off), Shifted::new(s, &b, off));
        let mut out = Shifted::new(s, &c, off);
        ops::matmul(
            s,
            Matmul::<OnDevice, T> {
                params: shape,
                a: &da.view(),
                b: &db.view(),
                out: &mut out.view_mut(),
            },
        )
        .unwrap();
        out.get(s)
    };
    assert_close(
        &format!("out {shape:?} alpha {alpha} beta {beta} offset {off}"),
        Rule::Reduction,
        T::DTYPE,
        shape.k,
        &got,
        &want,
    );
}

fn check_matmul<T: DeviceElement>(s: &Stream, rng: &mut Rng, shape: MatmulParams) {
    check_matmul_at::<T>(s, rng, shape, 0)
}

fn matmul_random_shapes<T: DeviceElement>() {
    let s = stream();
    let mut rng = Rng(0x5eed_0001);
    const DIMS: [usize; 5] = [1, 7, 64, 129, 300];
    for (trans_a, trans_b) in [(false, false), (false, true), (true, false), (true, true)] {
        for m in DIMS {
            for n in DIMS {
                for k in DIMS {
                    // At most one dimension of 300 (several tiles on one axis is what it adds).
                    if [m, n, k].iter().filter(|&&d| d == 300).count() > 1 {
                        continue;
                    }
                    let shape = MatmulParams {
                        trans_a,
                        trans_b,
                        ..MatmulParams::new(m, n, k)
                    };
                    check_matmul::<T>(&s, &mut rng, shape);
                }
            }
        }
        let batched = MatmulParams {
            batch: 3,
            trans_a,
            trans_b,
            alpha: 0.5,
            beta: -1.25,
            ..MatmulParams::new(129, 7, 64)
        };
        check_matmul::<T>(&s, &mut rng, batched);
    }
    // The 128×128 tile: chosen only when it gives every CU two blocks, so batch 20 of
    // 3 × 2 tiles; 257 = 2·128 + 1 and 130 = 128 + 2 leave edge tiles on both axes, 67 a
    // partial k slice.
    let big = MatmulParams {
        batch: 20,
        trans_b: true,
        beta: 1.0,
        ..MatmulParams::new(257, 130, 67)
    };
    let cus = s.device().compute_units();
    let plan = ops::MatmulPlan::new(&big, T::DTYPE, cus).unwrap();
    assert_eq!(plan.tile, ops::MatmulTile::Big, "{cus} CUs: {plan:?}");
    check_matmul::<T>(&s, &mut rng, big);
    // A long reduction (the accumulation error grows with K).
    let long_k = MatmulParams {
        trans_a: true,
        ..MatmulParams::new(65, 7, 2000)
    };
    check_matmul::<T>(&s, &mut rng, long_k);
    let k0 = MatmulParams {
        batch: 2,
        beta: 2.0,
        ..MatmulParams::new(5, 3, 0)
    };
    check_matmul::<T>(&s, &mut rng, k0);
}

#[test]
fn matmul_random_shapes_f32() {
    matmul_random_shapes::<f32>();
}

#[test]
fn matmul_random_shapes_f16() {
    matmul_random_shapes::<hip_kernels::params::f16>();
}

#[test]
fn matmul_random_shapes_bf16() {
    matmul_random_shapes::<hip_kernels::params::bf16>();
}

/// Every layout on views one element past an aligned start (a, b and out misaligned), beta = 0
/// with a NaN C and beta != 0: the kernels' alignment fallback (bounds-checked loads instead of
/// vector ones, even for interior blocks: 128 × 64 × 80 is whole tiles of the small tile).
fn matmul_misaligned_views<T: DeviceElement>() {
    let s = stream();
    let mut rng = Rng(0x5eed_0004);
    for (trans_a, trans_b) in [(false, false), (false, true), (true, false), (true, true)] {
        for (m, n, k, batch) in [(130, 65, 33, 2), (128, 64, 80, 1)] {
            for (alpha, beta) in [(1.25, 0.0), (0.5, -0.75)] {
                let shape = MatmulParams {
                    batch,
                    trans_a,
                    trans_b,
                    alpha,
                    beta,
                    ..MatmulParams::new(m, n, k)
                };
                check_matmul_at::<T>(&s, &mut rng, shape, 1);
            }
        }
    }
}

#[test]
fn matmul_on_misaligned_views_every_dtype() {
    matmul_misaligned_views::<f32>();
    matmul_misaligned_views::<hip_kernels::params::f16>();
    matmul_misaligned_views::<hip_kernels::params::bf16>();
}

fn check_attention<T: DeviceElement>(s: &Stream, rng: &mut Rng, shape: AttentionParams) {
    let (q, k, v) = (
        rng.vec::<T>(shape.q_len().unwrap(), 1.0),
        rng.vec::<T>(shape.kv_len().unwrap(), 1.0),
        rng.vec::<T>(shape.kv_len().unwrap(), 1.0),
    );
    let dout = rng.vec::<T>(shape.q_len().unwrap(), 1.0);
    let mut out = vec![T::from_f64(0.0); q.len()];
    let mut lse = vec![0.0f32; shape.lse_len().unwrap()];
    cpu::attention_forward(AttentionForward::<Host, T> {
        params: shape,
        q: &q,
        k: &k,
        v: &v,
        out: &mut out,
        lse: &mut lse,
    })
    .unwrap();
    let (got_out, got_lse) = attention_forward_device(s, &shape, &q, &k, &v).unwrap();
    let what = format!("{shape:?}");
    assert_close(
        &format!("out {what}"),
        Rule::Reduction,
        T::DTYPE,
        shape.tk,
        &got_out,
        &out,
    );
    assert_close(
        &format!("lse {what}"),
        Rule::Reduction,
        T::DTYPE,
        shape.tk,
        &got_lse,
        &lse,
    );

    // The backward from the reference's out and lse, so both sides see the same inputs.
    let (mut dq, mut dk, mut dv) = (
        vec![T::from_f64(0.0); q.len()],
        vec![T::from_f64(0.0); k.len()],
        vec![T::from_f64(0.0); v.len()],
    );
    cpu::attention_backward(AttentionBackward::<Host, T> {
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
    })
    .unwrap();
    let got = attention_backward_device(s, &shape, &q, &k, &v, &out, &dout, &lse).unwrap();
    let len = shape.tq.max(shape.tk);
    assert_close(
        &format!("dq {what}"),
        Rule::Reduction,
        T::DTYPE,
        len,
        &got.0,
        &dq,
    );
    assert_close(
        &format!("dk {what}"),
        Rule::Reduction,
        T::DTYPE,
        len,
        &got.1,
        &dk,
    );
    assert_close(
        &format!("dv {what}"),
        Rule::Reduction,
        T::DTYPE,
        len,
        &got.2,
        &dv,
    );
}

fn attention_random_shapes<T: DeviceElement>() {
    let s = stream();
    let mut rng = Rng(0x5eed_0002);
    const TS: [usize; 4] = [1, 17, 128, 300];
    for head_dim in [16, 32, 64, 80, 96, 128] {
        for tq in TS {
            for tk in TS {
                // Every Tq = Tk, and Tq ≠ Tk pairs around 17 and 128 (300 × 300 once per head dim).
                if tq != tk && tq.max(tk) == 300 && tq.min(tk) != 17 {
                    continue;
                }
                for causal in [false, true] {
                    let shape = AttentionParams {
                        batch: 1,
                        heads: 2,
                        tq,
                        tk,
                        head_dim,
                        causal,
                        scale: AttentionParams::default_scale(head_dim),
                    };
                    check_attention::<T>(&s, &mut rng, shape);
                }
            }
        }
    }
}

#[test]
fn attention_random_shapes_f32() {
    attention_random_shapes::<f32>();
}

#[test]
fn attention_random_shapes_f16() {
    attention_random_shapes::<hip_kernels::params::f16>();
}

#[test]
fn attention_random_shapes_bf16() {
    attention_random_shapes::<hip_kernels::params::bf16>();
}

/// Head dims that are not a bucket size (7: not a multiple of 4 either, the scalar paths; 100:
/// the 128 bucket, partly used), Tq != Tk both ways, causal; with Tq > Tk causal, the first
/// Tq − Tk query rows see no key: out 0, lse −inf and zero gradients.
#[test]
fn attention_head_dims_off_the_buckets_and_fully_masked_rows() {
    let s = stream();
    let mut rng = Rng(0x5eed_0005);
    for (head_dim, tq, tk, causal) in [
        (7, 5, 9, false),
        (7, 40, 17, true),
        (100, 33, 47, true),
        (100, 40, 17, true),
    ] {
        let shape = AttentionParams {
            batch: 1,
            heads: 2,
            tq,
            tk,
            head_dim,
            causal,
            scale: AttentionParams::default_scale(head_dim),
        };
        check_attention::<f32>(&s, &mut rng, shape);
        check_attention::<hip_kernels::params::f16>(&s, &mut rng, shape);
        check_attention::<hip_kernels::params::bf16>(&s, &mut rng, shape);
        if causal && tq > tk {
            let (q, k, v) = (
                rng.vec::<f32>(shape.q_len().unwrap(), 1.0),
                rng.vec::<f32>(shape.kv_len().unwrap(), 1.0),
                rng.vec::<f32>(shape.kv_len().unwrap(), 1.0),
            );
            let (out, lse) = attention_forward_device(&s, &shape, &q, &k, &v).unwrap();
            let dout = rng.vec::<f32>(q.len(), 1.0);
            let (dq, _, _) =
                attention_backward_device(&s, &shape, &q, &k, &v, &out, &dout, &lse).unwrap();
            for h in 0..shape.heads {
                for i in 0..tq - tk {
                    let row = h * tq + i;
                    let span = row * head_dim..(row + 1) * head_dim;
                    assert_eq!(lse[row], f32::NEG_INFINITY, "lse of masked row {row}");
                    assert!(out[span.clone()].iter().all(|&x| x == 0.0), "out row {row}");
                    assert!(dq[span].iter().all(|&x| x == 0.0), "dq row {row}");
                }
            }
        }
    }
}

#[test]
fn attention_backward_is_bit_identical_run_to_run() {
    let s = stream();
    let mut rng = Rng(0x5eed_0003);
    let shape = AttentionParams {
        batch: 2,
        heads: 3,
        tq: 300,
        tk: 257,
        head_dim: 80,
        causal: true,
        scale: 0.1,
    };
    let (q, k, v, dout) = (
        rng.vec::<f32>(shape.q_len().unwrap(), 1.0),
        rng.vec::<f32>(shape.kv_len().unwrap(), 1.0),
        rng.vec::<f32>(shape.kv_len().unwrap(), 1.0),
        rng.vec::<f32>(shape.q_len().unwrap(), 1.0),
    );
    let (out, lse) = attention_forward_device(&s, &shape, &q, &k, &v).unwrap();
    let first = attention_backward_device(&s, &shape, &q, &k, &v, &out, &dout, &lse).unwrap();
    for _ in 0..3 {
        let again = attention_backward_device(&s, &shape, &q, &k, &v, &out, &dout, &lse).unwrap();
        let pairs = [
            ("dq", &first.0, &again.0),
            ("dk", &first.1, &again.1),
            ("dv", &first.2, &again.2),
        ];
        for (name, a, b) in pairs {
            assert!(bits(a) == bits(b), "{name} differs");
        }
    }
}

#[test]
fn bad_shapes_are_rejected_before_any_launch() {
    let s = stream();
    // 2×3 · 3×2 needs 6 elements of b: 5 is one short.
    let (a, b) = (upload(&s, &[0f32; 6]), upload(&s, &[0f32; 5]));
    let mut out = upload(&s, &[0f32; 4]);
    let args = Matmul::<OnDevice, _> {
        params: MatmulParams::new(2, 2, 3),
        a: &a,
        b: &b,
        out: &mut out,
    };
    let e = ops::matmul(&s, args).unwrap_err();
    assert!(
        e.to_string().contains("`b`") || e.to_string().contains("`a`"),
        "{e}"
    );
    let big = AttentionParams {
        batch: 1,
        heads: 1,
        tq: 1,
        tk: 1,
        head_dim: 129,
        causal: false,
        scale: 1.0,
    };
    let (x, mut o) = (upload(&s, &[0f32; 129]), upload(&s, &[0f32; 129]));
    let mut lse = upload(&s, &[0f32; 1]);
    let args = AttentionForward::<OnDevice, _> {
        params: big,
        q: &x,
        k: &x,
        v: &x,
        out: &mut o,
        lse: &mut lse,
    };
    let e = ops::attention_forward(&s, args).unwrap_err();
    assert!(e.to_string().contains("head_dim"), "{e}");
}

#[test]
fn golden_matmul_and_attention_cases_pass_on_the_device() {
    run_golden_cases(
        |op| {
            matches!(
                op,
                "matmul"
                    | "attention_forward"
                    | "attention_backward"
                    | "attention_forward_strided"
                    | "attention_backward_strided"
            )
        },
        "matmul/attention",
    );
}
