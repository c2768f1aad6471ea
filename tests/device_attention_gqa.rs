//! Device tests of grouped-query heads (`n_kv_heads`) and variable-length sequences
//! (`cu_seqlens`) in `ops::attention_*` against the CPU reference (`--features device`). They
//! ran on hip-emu (the CPU emulation of a device), never on a GPU.
//!
//! - q, k, v straight from a grouped fused projection `[B, T, H + 2K, D]`, out `[B, T, H, D]`,
//!   the backward into the fused gradient (NaN beforehand: every element must be written), for
//!   every head-dim bucket (32, 64, 96, 128: rows aligned, vector loads) and head dims off the
//!   buckets (33, 94, 127: scalar loads, zero-filled columns); T = 70 (edge tiles on both axes:
//!   more than one query block at d96/d128, partial key tiles everywhere); K = 1, K = H / 2 and
//!   K = H; no `cu_seqlens`, and `cu_seqlens` with padding at both ends, a sequence of length 1,
//!   empty sequences and a sequence crossing query blocks; causal or not;
//! - the packed launchers with both, every dtype; padding positions give exactly 0 (out, dq,
//!   dk, dv) and lse = −inf; the backward is bit-identical run to run (dk/dv summed over a group
//!   in registers, no atomics);
//! - bad `n_kv_heads` and `cu_seqlens` lengths are typed errors on the device.
//!
//! Sizes are small on purpose: hip-emu runs one fibre per GPU thread on the CPU.
#![cfg(feature = "device")]

use hip_kernels::cpu;
use hip_kernels::ops::{
    self, AttentionBackward, AttentionBackwardStrided, AttentionForward, AttentionForwardStrided,
    AttentionLayout, AttentionParams, DeviceElement, Qkv, Strided,
};
use hip_kernels::params::{Host, OnDevice, ShapeError};
use hip_kernels::tolerance::Rule;
use hip_rt::{DeviceBuffer, Stream};

mod device_common;

use device_common::*;

const T: usize = 70;

/// Row 0: a sequence of length 1, an empty one, sequences crossing the query blocks, padding
/// at the end. Row 1: padding at the start, two empty sequences, the last sequence to the end.
const CU: [i32; 10] = [0, 1, 1, 33, 66, 5, 40, 40, 40, 70];

fn params(heads: usize, n_kv_heads: usize, head_dim: usize, causal: bool) -> AttentionParams {
    AttentionParams {
        batch: 2,
        heads,
        n_kv_heads,
        tq: T,
        tk: T,
        head_dim,
        causal,
        scale: AttentionParams::default_scale(head_dim),
    }
}

fn hview<T: DeviceElement>(data: &[T], layout: AttentionLayout) -> Strided<'_, Host, T> {
    Strided { data, layout }
}

fn dview<T: DeviceElement>(
    data: &DeviceBuffer<T>,
    layout: AttentionLayout,
) -> Strided<'_, OnDevice, T> {
    Strided { data, layout }
}

/// Forward and backward through the grouped fused layout, device against the CPU reference.
fn check_fused<T: DeviceElement>(
    s: &Stream,
    rng: &mut Rng,
    p: AttentionParams,
    cu: Option<&[i32]>,
) {
    let (b, t, h, kv, d) = (p.batch, p.tq, p.heads, p.n_kv_heads, p.head_dim);
    let qkv = rng.vec::<T>(b * t * (h + 2 * kv) * d, 1.0);
    let fused = |w| AttentionLayout::fused_qkv_grouped(w, t, h, kv, d);
    let bthd = AttentionLayout::bthd(t, h, d);
    let n = p.q_len().unwrap();
    let what = format!("{p:?} cu {} {}", cu.is_some(), T::DTYPE);

    let mut out = vec![T::from_f64(0.0); n];
    let mut lse = vec![0.0f32; p.lse_len().unwrap()];
    cpu::attention_forward_strided(AttentionForwardStrided::<Host, T> {
        params: p,
        q: hview(&qkv, fused(Qkv::Q)),
        k: hview(&qkv, fused(Qkv::K)),
        v: hview(&qkv, fused(Qkv::V)),
        out: &mut out,
        out_layout: bthd,
        lse: &mut lse,
        cu_seqlens: cu,
    })
    .unwrap();
    let bqkv = upload(s, &qkv);
    let bcu = cu.map(|c| up_i32(s, c));
    let mut d_out = upload(s, &vec![T::from_f64(f64::NAN); n]);
    let mut d_lse = upload(s, &vec![f32::NAN; lse.len()]);
    ops::attention_forward_strided(
        s,
        AttentionForwardStrided {
            params: p,
            q: dview(&bqkv, fused(Qkv::Q)),
            k: dview(&bqkv, fused(Qkv::K)),
            v: dview(&bqkv, fused(Qkv::V)),
            out: &mut d_out,
            out_layout: bthd,
            lse: &mut d_lse,
            cu_seqlens: bcu.as_ref().map(|c| c as _),
        },
    )
    .unwrap();
    let len = p.tk.max(d);
    let ty = T::DTYPE;
    let got_out = download(s, &d_out);
    assert_close(
        &format!("out {what}"),
        Rule::Reduction,
        ty,
        len,
        &got_out,
        &out,
    );
    let got_lse = download(s, &d_lse);
    assert_close(
        &format!("lse {what}"),
        Rule::Reduction,
        ty,
        len,
        &got_lse,
        &lse,
    );

    let dout = rng.vec::<T>(n, 1.0);
    let mut dqkv = vec![T::from_f64(0.0); qkv.len()];
    cpu::attention_backward_strided(AttentionBackwardStrided::<Host, T> {
        params: p,
        q: hview(&qkv, fused(Qkv::Q)),
        k: hview(&qkv, fused(Qkv::K)),
        v: hview(&qkv, fused(Qkv::V)),
        out: hview(&out, bthd),
        dout: hview(&dout, bthd),
        lse: &lse,
        dqkv: &mut dqkv,
        dq: fused(Qkv::Q),
        dk: fused(Qkv::K),
        dv: fused(Qkv::V),
        cu_seqlens: cu,
    })
    .unwrap();
    let (bo, bdo, blse) = (upload(s, &out), upload(s, &dout), upload(s, &lse));
    let mut d_dqkv = upload(s, &vec![T::from_f64(f64::NAN); qkv.len()]);
    ops::attention_backward_strided(
        s,
        AttentionBackwardStrided {
            params: p,
            q: dview(&bqkv, fused(Qkv::Q)),
            k: dview(&bqkv, fused(Qkv::K)),
            v: dview(&bqkv, fused(Qkv::V)),
            out: dview(&bo, bthd),
            dout: dview(&bdo, bthd),
            lse: &blse,
            dqkv: &mut d_dqkv,
            dq: fused(Qkv::Q),
            dk: fused(Qkv::K),
            dv: fused(Qkv::V),
            cu_seqlens: bcu.as_ref().map(|c| c as _),
        },
    )
    .unwrap();
    // dk and dv reduce over the queries of a whole group.
    let blen = (p.tq * p.group()).max(d);
    let got = download(s, &d_dqkv);
    assert_close(
        &format!("dqkv {what}"),
        Rule::Reduction,
        ty,
        blen,
        &got,
        &dqkv,
    );
}

/// Every head-dim bucket (aligned rows) and head dims off the buckets (odd: scalar loads),
/// K ∈ {1, H/2, H}, with and without cu_seqlens, causal or not (f32).
#[test]
fn grouped_varlen_fused_views_every_bucket() {
    let s = stream();
    let mut rng = Rng(0x5eed_0031);
    for (head_dim, kv, causal, cu) in [
        (32, 1, true, true),
        (32, 4, false, true),
        (64, 2, true, true),
        (64, 1, false, false),
        (96, 2, false, true),
        (96, 4, true, false),
        (128, 1, true, true),
        (128, 2, true, false),
        (33, 2, true, true),
        (94, 1, false, true),
        (127, 4, true, true),
    ] {
        let p = params(4, kv, head_dim, causal);
        check_fused::<f32>(&s, &mut rng, p, cu.then_some(&CU[..]));
    }
}

/// The 16-bit dtypes on the paths most likely to differ (d64 spread dq, d96 row dq).
#[test]
fn grouped_varlen_fused_views_16_bit() {
    let s = stream();
    let mut rng = Rng(0x5eed_0032);
    for (head_dim, kv) in [(64, 2), (96, 1)] {
        let p = params(4, kv, head_dim, true);
        check_fused::<hip_kernels::params::f16>(&s, &mut rng, p, Some(&CU));
        check_fused::<hip_kernels::params::bf16>(&s, &mut rng, p, Some(&CU));
    }
}

type Grads<T> = (Vec<T>, Vec<T>, Vec<T>);

/// The packed launchers: out, lse and (dq, dk, dv) from the device.
fn packed_device<T: DeviceElement>(
    s: &Stream,
    p: &AttentionParams,
    [q, k, v, dout]: [&[T]; 4],
    cu: &[i32],
) -> (Vec<T>, Vec<f32>, Grads<T>) {
    let (bq, bk, bv, bdo) = (upload(s, q), upload(s, k), upload(s, v), upload(s, dout));
    let bcu = up_i32(s, cu);
    let nan = T::from_f64(f64::NAN);
    let mut out = upload(s, &vec![nan; q.len()]);
    let mut lse = upload(s, &vec![f32::NAN; p.lse_len().unwrap()]);
    ops::attention_forward(
        s,
        AttentionForward {
            params: *p,
            q: &bq,
            k: &bk,
            v: &bv,
            out: &mut out,
            lse: &mut lse,
            cu_seqlens: Some(&bcu),
        },
    )
    .unwrap();
    let (mut dq, mut dk, mut dv) = (
        upload(s, &vec![nan; q.len()]),
        upload(s, &vec![nan; k.len()]),
        upload(s, &vec![nan; v.len()]),
    );
    ops::attention_backward(
        s,
        AttentionBackward {
            params: *p,
            q: &bq,
            k: &bk,
            v: &bv,
            out: &out,
            dout: &bdo,
            lse: &lse,
            dq: &mut dq,
            dk: &mut dk,
            dv: &mut dv,
            cu_seqlens: Some(&bcu),
        },
    )
    .unwrap();
    let grads = (download(s, &dq), download(s, &dk), download(s, &dv));
    (download(s, &out), download(s, &lse), grads)
}

fn packed<T: DeviceElement>(seed: u64) {
    let s = stream();
    let mut rng = Rng(seed);
    let p = params(6, 2, 64, true);
    let (q, k, v, dout) = (
        rng.vec::<T>(p.q_len().unwrap(), 1.0),
        rng.vec::<T>(p.kv_len().unwrap(), 1.0),
        rng.vec::<T>(p.kv_len().unwrap(), 1.0),
        rng.vec::<T>(p.q_len().unwrap(), 1.0),
    );
    let (out, lse, (dq, dk, dv)) = packed_device(&s, &p, [&q, &k, &v, &dout], &CU);
    let (mut want_out, mut want_lse) = (vec![T::from_f64(0.0); q.len()], vec![0.0f32; lse.len()]);
    cpu::attention_forward(AttentionForward::<Host, T> {
        params: p,
        q: &q,
        k: &k,
        v: &v,
        out: &mut want_out,
        lse: &mut want_lse,
        cu_seqlens: Some(&CU),
    })
    .unwrap();
    let ty = T::DTYPE;
    assert_close("out", Rule::Reduction, ty, T, &out, &want_out);
    assert_close("lse", Rule::Reduction, ty, T, &lse, &want_lse);
    // The backward from the device's own out and lse (what a trainer does).
    let (mut wq, mut wk, mut wv) = (q.clone(), k.clone(), v.clone());
    cpu::attention_backward(AttentionBackward::<Host, T> {
        params: p,
        q: &q,
        k: &k,
        v: &v,
        out: &out,
        dout: &dout,
        lse: &lse,
        dq: &mut wq,
        dk: &mut wk,
        dv: &mut wv,
        cu_seqlens: Some(&CU),
    })
    .unwrap();
    let blen = T * p.group();
    assert_close("dq", Rule::Reduction, ty, blen, &dq, &wq);
    assert_close("dk", Rule::Reduction, ty, blen, &dk, &wk);
    assert_close("dv", Rule::Reduction, ty, blen, &dv, &wv);

    // Padding: row 0 from 66, row 1 before 5: exactly 0 and lse = −inf, in every head.
    let d = p.head_dim;
    let zero = T::from_f64(0.0);
    for (b, pad) in [(0, 66..T), (1, 0..5)] {
        for h in 0..p.heads {
            for i in pad.clone() {
                let r = (b * p.heads + h) * T + i;
                assert_eq!(lse[r], f32::NEG_INFINITY, "lse b {b} h {h} i {i}");
                assert!(
                    out[r * d..][..d].iter().all(|x| *x == zero),
                    "out {b} {h} {i}"
                );
                assert!(
                    dq[r * d..][..d].iter().all(|x| *x == zero),
                    "dq {b} {h} {i}"
                );
            }
            if h < p.n_kv_heads {
                for i in pad.clone() {
                    let r = ((b * p.n_kv_heads + h) * T + i) * d;
                    assert!(dk[r..][..d].iter().all(|x| *x == zero), "dk {b} {h} {i}");
                    assert!(dv[r..][..d].iter().all(|x| *x == zero), "dv {b} {h} {i}");
                }
            }
        }
    }

    // Deterministic: the same bits again.
    let again = packed_device(&s, &p, [&q, &k, &v, &dout], &CU);
    let bits = |x: &[T]| x.iter().map(|v| v.to_f64().to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&again.2 .0), bits(&dq));
    assert_eq!(bits(&again.2 .1), bits(&dk));
    assert_eq!(bits(&again.2 .2), bits(&dv));
}

#[test]
fn packed_grouped_varlen_f32() {
    packed::<f32>(0x5eed_0033);
}

#[test]
fn packed_grouped_varlen_f16() {
    packed::<hip_kernels::params::f16>(0x5eed_0034);
}

#[test]
fn packed_grouped_varlen_bf16() {
    packed::<hip_kernels::params::bf16>(0x5eed_0035);
}

#[test]
fn bad_groups_and_cu_seqlens_are_typed_errors_on_the_device() {
    let s = stream();
    let run = |p: AttentionParams, cu: &[i32]| -> ops::OpError {
        let q = upload(&s, &vec![0.0f32; p.q_len().unwrap()]);
        let k = upload(&s, &vec![0.0f32; p.kv_len().unwrap_or(0)]);
        let bcu = up_i32(&s, cu);
        let mut out = upload(&s, &vec![0.0f32; p.q_len().unwrap()]);
        let mut lse = upload(&s, &vec![0.0f32; p.lse_len().unwrap()]);
        ops::attention_forward(
            &s,
            AttentionForward {
                params: p,
                q: &q,
                k: &k,
                v: &k,
                out: &mut out,
                lse: &mut lse,
                cu_seqlens: (!cu.is_empty()).then_some(&bcu as _),
            },
        )
        .unwrap_err()
    };
    let name = |e: &ops::OpError| match e {
        ops::OpError::Shape(ShapeError::Invalid { name, .. }) => *name,
        other => panic!("not a typed shape error: {other}"),
    };
    let e = run(params(4, 3, 32, true), &[]);
    assert_eq!(name(&e), "n_kv_heads", "{e}");
    assert!(e.to_string().contains("3 (heads = 4)"), "{e}");
    let e = run(params(4, 2, 32, true), &[0, 3, 70]);
    assert_eq!(name(&e), "cu_seqlens", "{e}");
    let e = run(
        AttentionParams {
            tk: 9,
            ..params(4, 2, 32, true)
        },
        &CU,
    );
    assert!(e.to_string().contains("tq == tk"), "{e}");
}
