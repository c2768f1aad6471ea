//! Device tests of the matmul and attention kernels against the CPU reference (`--features
//! device`; needs a HIP device and kernels built for its arch). NEVER RUN: no GPU was available
//! when they were written; they compile in CI.
//!
//! - golden cases (matmul, attention forward/backward) through a device `GoldenBackend`;
//! - random shapes: matmul M, N, K ∈ {1, 7, 64, 129, 300} (every layout, every dtype, alpha and
//!   beta, batches), a K of 2000, a K of 0, and a batched shape that takes the 128×128 tile with
//!   edge tiles on both axes; attention T ∈ {1, 17, 128, 300} (Tq = Tk and Tq ≠ Tk), head dims
//!   16, 32, 64, 80, 96, 128, causal or not, every dtype. The sizes are chosen for what they
//!   cover (1 and 7: a partial first tile; 64 and 128: exact tiles; 129: one element past a tile;
//!   300: several tiles and a partial one, 300 mod 64, 32, 16 and 8 all nonzero); larger sizes
//!   add nothing a tiled kernel can get wrong and cost minutes on hip-emu;
//! - beta = 0 never reads C (C holds NaN); the backward is bit-identical run to run.
#![cfg(feature = "device")]

use hip_kernels::cpu;
use hip_kernels::golden::CaseInputs;
use hip_kernels::ops::{self, DeviceElement};
use hip_kernels::params::{AttentionShape, MatmulShape, Op};
use hip_rt::Stream;

mod device_common;

use device_common::*;

// ---------------------------------------------------------------------------------------------
// Random shapes
// ---------------------------------------------------------------------------------------------

fn check_matmul<T: DeviceElement>(
    s: &Stream,
    rng: &mut Rng,
    shape: MatmulShape,
    alpha: f32,
    beta: f32,
) {
    let a = rng.vec::<T>(shape.a_len().unwrap(), 1.0);
    let b = rng.vec::<T>(shape.b_len().unwrap(), 1.0);
    let c: Vec<T> = if beta == 0.0 {
        vec![T::from_f64(f64::NAN); shape.out_len().unwrap()] // must never be read
    } else {
        rng.vec(shape.out_len().unwrap(), 1.0)
    };
    let mut want = c.clone();
    cpu::matmul(&shape, alpha, beta, &a, &b, &mut want).unwrap();
    let got = matmul_device(s, &shape, alpha, beta, &a, &b, &c).unwrap();
    assert_close(
        &format!("out {shape:?} alpha {alpha} beta {beta}"),
        Op::Matmul,
        T::DTYPE,
        shape.k,
        &got,
        &want,
    );
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
                    let shape = MatmulShape {
                        batch: 1,
                        m,
                        n,
                        k,
                        trans_a,
                        trans_b,
                    };
                    check_matmul::<T>(&s, &mut rng, shape, 1.0, 0.0);
                }
            }
        }
        let batched = MatmulShape {
            batch: 3,
            m: 129,
            n: 7,
            k: 64,
            trans_a,
            trans_b,
        };
        check_matmul::<T>(&s, &mut rng, batched, 0.5, -1.25);
    }
    // The 128×128 tile: chosen only when it gives every CU two blocks, so batch 20 of
    // 3 × 2 tiles; 257 = 2·128 + 1 and 130 = 128 + 2 leave edge tiles on both axes, 67 a
    // partial k slice.
    let big = MatmulShape {
        batch: 20,
        m: 257,
        n: 130,
        k: 67,
        trans_a: false,
        trans_b: true,
    };
    let cus = s.device().compute_units();
    let plan = ops::MatmulPlan::new(&big, T::DTYPE, cus).unwrap();
    assert_eq!(plan.tile, ops::MatmulTile::Big, "{cus} CUs: {plan:?}");
    check_matmul::<T>(&s, &mut rng, big, 1.0, 1.0);
    // A long reduction (the accumulation error grows with K).
    let long_k = MatmulShape {
        batch: 1,
        m: 65,
        n: 7,
        k: 2000,
        trans_a: true,
        trans_b: false,
    };
    check_matmul::<T>(&s, &mut rng, long_k, 1.0, 0.0);
    let k0 = MatmulShape {
        batch: 2,
        m: 5,
        n: 3,
        k: 0,
        trans_a: false,
        trans_b: false,
    };
    check_matmul::<T>(&s, &mut rng, k0, 1.0, 2.0);
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

fn check_attention<T: DeviceElement>(s: &Stream, rng: &mut Rng, shape: AttentionShape) {
    let (q, k, v) = (
        rng.vec::<T>(shape.q_len().unwrap(), 1.0),
        rng.vec::<T>(shape.kv_len().unwrap(), 1.0),
        rng.vec::<T>(shape.kv_len().unwrap(), 1.0),
    );
    let dout = rng.vec::<T>(shape.q_len().unwrap(), 1.0);
    let mut out = vec![T::from_f64(0.0); q.len()];
    let mut lse = vec![0.0f32; shape.lse_len().unwrap()];
    cpu::attention_forward(&shape, &q, &k, &v, &mut out, &mut lse).unwrap();
    let (got_out, got_lse) = attention_forward_device(s, &shape, &q, &k, &v).unwrap();
    let what = format!("{shape:?}");
    assert_close(
        &format!("out {what}"),
        Op::AttentionForward,
        T::DTYPE,
        shape.tk,
        &got_out,
        &out,
    );
    assert_close(
        &format!("lse {what}"),
        Op::AttentionForward,
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
    cpu::attention_backward(
        &shape, &q, &k, &v, &out, &dout, &lse, &mut dq, &mut dk, &mut dv,
    )
    .unwrap();
    let got = attention_backward_device(s, &shape, &q, &k, &v, &out, &dout, &lse).unwrap();
    let len = shape.tq.max(shape.tk);
    assert_close(
        &format!("dq {what}"),
        Op::AttentionBackward,
        T::DTYPE,
        len,
        &got.0,
        &dq,
    );
    assert_close(
        &format!("dk {what}"),
        Op::AttentionBackward,
        T::DTYPE,
        len,
        &got.1,
        &dk,
    );
    assert_close(
        &format!("dv {what}"),
        Op::AttentionBackward,
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
                    let shape = AttentionShape {
                        batch: 1,
                        heads: 2,
                        tq,
                        tk,
                        head_dim,
                        causal,
                        scale: AttentionShape::default_scale(head_dim),
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

#[test]
fn attention_backward_is_bit_identical_run_to_run() {
    let s = stream();
    let mut rng = Rng(0x5eed_0003);
    let shape = AttentionShape {
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
    let shape = MatmulShape::new(2, 2, 3);
    let e = ops::matmul(&s, &shape, 1.0, 0.0, &a, &b, &mut out).unwrap_err();
    assert!(
        e.to_string().contains("`b`") || e.to_string().contains("`a`"),
        "{e}"
    );
    let big = AttentionShape {
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
    let e = ops::attention_forward(&s, &big, &x, &x, &x, &mut o, &mut lse).unwrap_err();
    assert!(e.to_string().contains("head_dim"), "{e}");
}

#[test]
fn golden_matmul_and_attention_cases_pass_on_the_device() {
    run_golden_cases(
        |inputs| {
            matches!(
                inputs,
                CaseInputs::Matmul(_)
                    | CaseInputs::AttentionForward(_)
                    | CaseInputs::AttentionBackward(_)
            )
        },
        "matmul/attention",
    );
}
