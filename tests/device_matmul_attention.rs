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

/// `packed` (`[batch, rows, row]`) placed into a buffer of `len` elements filled with `pad`,
/// row `r` of item `b` at `b·stride + r·ld`.
#[allow(clippy::too_many_arguments)]
fn embed<T: DeviceElement>(
    packed: &[T],
    (batch, rows, row): (usize, usize, usize),
    ld: usize,
    stride: usize,
    len: usize,
    pad: T,
) -> Vec<T> {
    let mut out = vec![pad; len];
    for bi in 0..batch {
        for r in 0..rows {
            let src = (bi * rows + r) * row;
            let at = bi * stride + r * ld;
            out[at..at + row].copy_from_slice(&packed[src..src + row]);
        }
    }
    out
}

/// Strided and padded operands (a with padded rows and items, out with the items side by side
/// in each row like the heads of `[T, H, D]`, b broadcast with stride 0) give the packed result:
/// on the CPU bit for bit, on the device within the op's tolerance of it, and the elements of
/// `out` outside the layout keep their value.
fn matmul_strided_equals_packed<T: DeviceElement>() {
    let s = stream();
    let mut rng = Rng(0x5eed_0005);
    let (batch, m, n, k) = (3usize, 33usize, 20usize, 17usize);
    for (trans_a, trans_b) in [(false, false), (false, true), (true, false), (true, true)] {
        for (alpha, beta) in [(1.0f32, 0.0f32), (1.5, -0.5)] {
            let packed = MatmulParams {
                batch,
                trans_a,
                trans_b,
                alpha,
                beta,
                ..MatmulParams::new(m, n, k)
            };
            let [(ar, ac), (br, bc), (or, oc)] = packed.stored();
            let a = rng.vec::<T>(packed.a_len().unwrap(), 1.0);
            let b_one = rng.vec::<T>(br * bc, 1.0);
            let b: Vec<T> = (0..batch).flat_map(|_| b_one.clone()).collect();
            let c: Vec<T> = if beta == 0.0 {
                vec![T::from_f64(f64::NAN); packed.out_len().unwrap()]
            } else {
                rng.vec(packed.out_len().unwrap(), 1.0)
            };
            let mut want = c.clone();
            cpu::matmul(Matmul::<Host, T> {
                params: packed,
                a: &a,
                b: &b,
                out: &mut want,
            })
            .unwrap();

            let (lda, ldb, ldc) = (ac + 3, bc + 2, batch * n + 5);
            let layout = ops::MatmulLayout {
                lda: Some(lda),
                ldb: Some(ldb),
                ldc: Some(ldc),
                stride_a: Some(ar * lda + 7),
                stride_b: Some(0),
                stride_c: Some(n),
            };
            let strided = MatmulParams { layout, ..packed };
            let r = strided.resolve().unwrap();
            let pad = T::from_f64(7.0);
            let sa = embed(&a, (batch, ar, ac), lda, r.stride[0], r.reach[0] + 2, pad);
            let sb = embed(&b_one, (1, br, bc), ldb, 0, r.reach[1], pad);
            let sc = embed(&c, (batch, or, oc), ldc, n, r.reach[2] + 1, pad);
            let expect_out = embed(&want, (batch, or, oc), ldc, n, r.reach[2] + 1, pad);
            let what = format!("strided {strided:?}");

            let mut cpu_out = sc.clone();
            cpu::matmul(Matmul::<Host, T> {
                params: strided,
                a: &sa,
                b: &sb,
                out: &mut cpu_out,
            })
            .unwrap();
            assert_eq!(bits(&cpu_out), bits(&expect_out), "cpu {what}");

            let (da, db) = (upload(&s, &sa), upload(&s, &sb));
            let mut dout = upload(&s, &sc);
            ops::matmul(
                &s,
                Matmul::<OnDevice, T> {
                    params: strided,
                    a: &da,
                    b: &db,
                    out: &mut dout,
                },
            )
            .unwrap();
            let got = download(&s, &dout);
            let inside: Vec<bool> = {
                let mut v = vec![false; got.len()];
                for bi in 0..batch {
                    for row in 0..m {
                        let at = bi * n + row * ldc;
                        v[at..at + n].fill(true);
                    }
                }
                v
            };
            let (mut g_in, mut w_in) = (Vec::new(), Vec::new());
            for (i, &is_in) in inside.iter().enumerate() {
                if is_in {
                    g_in.push(got[i]);
                    w_in.push(expect_out[i]);
                } else {
                    assert_eq!(bits(&[got[i]]), bits(&[pad]), "{what}: pad [{i}] written");
                }
            }
            assert_close(&what, Rule::Reduction, T::DTYPE, k, &g_in, &w_in);
        }
    }
}

#[test]
fn matmul_strided_and_padded_operands_equal_the_packed_result_every_dtype() {
    matmul_strided_equals_packed::<f32>();
    matmul_strided_equals_packed::<hip_kernels::params::f16>();
    matmul_strided_equals_packed::<hip_kernels::params::bf16>();
}

/// Bad leading dimensions, overlapping output strides and short buffers are typed errors that
/// name the field, before any launch.
#[test]
fn bad_matmul_layouts_are_typed_errors_naming_the_field() {
    let s = stream();
    let (a, b) = (upload(&s, &[0f32; 64]), upload(&s, &[0f32; 64]));
    let mut out = upload(&s, &[0f32; 64]);
    let base = MatmulParams {
        batch: 2,
        ..MatmulParams::new(2, 3, 4)
    };
    for (layout, field) in [
        (
            ops::MatmulLayout {
                lda: Some(3), // < k = 4
                ..ops::MatmulLayout::PACKED
            },
            "lda",
        ),
        (
            ops::MatmulLayout {
                ldc: Some(2), // < n = 3
                ..ops::MatmulLayout::PACKED
            },
            "ldc",
        ),
        (
            ops::MatmulLayout {
                stride_c: Some(0), // both items on one place
                ..ops::MatmulLayout::PACKED
            },
            "stride_c",
        ),
        (
            ops::MatmulLayout {
                stride_b: Some(60), // item 1 of b ends at 60 + 12 > 64
                ..ops::MatmulLayout::PACKED
            },
            "b",
        ),
    ] {
        let e = ops::matmul(
            &s,
            Matmul::<OnDevice, f32> {
                params: MatmulParams { layout, ..base },
                a: &a,
                b: &b,
                out: &mut out,
            },
        )
        .unwrap_err();
        assert!(
            matches!(&e, ops::OpError::Shape(hip_kernels::params::ShapeError::Invalid { name, .. }) if *name == field),
            "{field}: {e}"
        );
        assert!(e.to_string().contains(field), "{field}: {e}");
    }
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
        cu_seqlens: None,
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
        cu_seqlens: None,
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
                        n_kv_heads: 2,
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
            n_kv_heads: 2,
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
        n_kv_heads: 3,
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
        n_kv_heads: 1,
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
        cu_seqlens: None,
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
