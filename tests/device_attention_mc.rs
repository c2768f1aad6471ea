//! Device tests of the matrix-core attention (`kernels/attention_mc.hip`, selected with
//! `AttentionKernel::MatrixCore`) against the CPU reference (`--features device`). Run on
//! hip-emu, which emulates the 16x16x16 tile instruction (MFMA layout) as a wave-level
//! operation; never run on a GPU.
//!
//! - f16 and bf16; head dims 64 and 128 (whole buckets: the unchecked vector loads and the
//!   unmasked tile loop) and off them (7: scalar loads; 8, 100: zero-filled columns); Tq and Tk
//!   below, at and across the 64/128-key tiles and the 64/128-query blocks, Tq ≠ Tk both ways,
//!   causal (with Tq > Tk: rows that see no key, out 0 and lse −inf) or not; grouped-query
//!   heads (K = 1, K = H / 2); a negative scale;
//! - variable-length sequences (`cu_seqlens`: padding at both ends, empty sequences, a
//!   sequence of length 1, sequences crossing query blocks) with grouped heads;
//! - q, k, v straight from the fused projection `[B, T, 3, H, D]`, out `[B, T, H, D]`;
//! - the committed attention golden cases in f16 and bf16;
//! - the kernel choice: f32 has no matrix-core kernel (a typed error), `Auto` keeps the vector
//!   kernels on hip-emu's gfx906.
//!
//! Sizes are small on purpose: hip-emu runs one fibre per GPU thread on the CPU.
#![cfg(feature = "device")]

use hip_kernels::cpu;
use hip_kernels::golden::{
    case_files, committed_dir, load_case, run_case_with, GoldenBackend, GoldenCase, Outputs,
};
use hip_kernels::ops::{
    self, AttentionBackward, AttentionBackwardCase, AttentionBackwardStrided, AttentionForward,
    AttentionForwardCase, AttentionForwardStrided, AttentionKernel, AttentionLayout,
    AttentionParams, AttentionStridedCase, DeviceElement, OpError, Qkv, Strided,
};
use hip_kernels::params::{bf16, f16, Host, OnDevice};
use hip_kernels::tolerance::Rule;
use hip_rt::Stream;

mod device_common;

use device_common::*;

const MC: AttentionKernel = AttentionKernel::MatrixCore;

#[allow(clippy::too_many_arguments)]
fn params(
    batch: usize,
    heads: usize,
    n_kv_heads: usize,
    tq: usize,
    tk: usize,
    head_dim: usize,
    causal: bool,
) -> AttentionParams {
    AttentionParams {
        batch,
        heads,
        n_kv_heads,
        tq,
        tk,
        head_dim,
        causal,
        scale: AttentionParams::default_scale(head_dim),
    }
}

/// The forward of `p` on the matrix-core kernels (out and lse start as NaN: every element must
/// be written).
fn forward_mc<T: DeviceElement>(
    s: &Stream,
    p: &AttentionParams,
    [q, k, v]: [&[T]; 3],
    cu: Option<&[i32]>,
) -> (Vec<T>, Vec<f32>) {
    let (bq, bk, bv) = (upload(s, q), upload(s, k), upload(s, v));
    let bcu = cu.map(|c| up_i32(s, c));
    let mut out = upload(s, &vec![T::from_f64(f64::NAN); q.len()]);
    let mut lse = upload(s, &vec![f32::NAN; p.lse_len().unwrap()]);
    ops::attention_forward_with(
        s,
        AttentionForward {
            params: *p,
            q: &bq,
            k: &bk,
            v: &bv,
            out: &mut out,
            lse: &mut lse,
            cu_seqlens: bcu.as_ref().map(|c| c as _),
        },
        MC,
    )
    .unwrap();
    (download(s, &out), download(s, &lse))
}

/// Random q, k, v for `p`.
fn inputs<T: DeviceElement>(rng: &mut Rng, p: &AttentionParams) -> [Vec<T>; 3] {
    [
        rng.vec::<T>(p.q_len().unwrap(), 1.0),
        rng.vec::<T>(p.kv_len().unwrap(), 1.0),
        rng.vec::<T>(p.kv_len().unwrap(), 1.0),
    ]
}

/// The backward of `p` on the matrix-core kernels (dq, dk, dv start as NaN: every element
/// must be written).
fn backward_mc<T: DeviceElement>(
    s: &Stream,
    p: &AttentionParams,
    [q, k, v, out, dout]: [&[T]; 5],
    lse: &[f32],
    cu: Option<&[i32]>,
) -> Grads<T> {
    let (bq, bk, bv) = (upload(s, q), upload(s, k), upload(s, v));
    let (bo, bdo, blse) = (upload(s, out), upload(s, dout), upload(s, lse));
    let bcu = cu.map(|c| up_i32(s, c));
    let nan = T::from_f64(f64::NAN);
    let (mut dq, mut dk, mut dv) = (
        upload(s, &vec![nan; q.len()]),
        upload(s, &vec![nan; k.len()]),
        upload(s, &vec![nan; v.len()]),
    );
    ops::attention_backward_with(
        s,
        AttentionBackward {
            params: *p,
            q: &bq,
            k: &bk,
            v: &bv,
            out: &bo,
            dout: &bdo,
            lse: &blse,
            dq: &mut dq,
            dk: &mut dk,
            dv: &mut dv,
            cu_seqlens: bcu.as_ref().map(|c| c as _),
        },
        MC,
    )
    .unwrap();
    (download(s, &dq), download(s, &dk), download(s, &dv))
}

/// The forward and the backward (from the reference's out and lse) on the matrix-core kernels
/// against the reference.
fn check<T: DeviceElement>(s: &Stream, rng: &mut Rng, p: AttentionParams, cu: Option<&[i32]>) {
    let [q, k, v] = inputs::<T>(rng, &p);
    let dout = rng.vec::<T>(p.q_len().unwrap(), 1.0);
    let (out, lse) = forward_mc(s, &p, [&q, &k, &v], cu);
    let mut want = vec![T::from_f64(0.0); q.len()];
    let mut want_lse = vec![0.0f32; p.lse_len().unwrap()];
    cpu::attention_forward(AttentionForward::<Host, T> {
        params: p,
        q: &q,
        k: &k,
        v: &v,
        out: &mut want,
        lse: &mut want_lse,
        cu_seqlens: cu,
    })
    .unwrap();
    let len = p.tk.max(p.head_dim);
    let what = format!("{p:?} cu {cu:?}");
    assert_close(
        &format!("out {what}"),
        Rule::Reduction,
        T::DTYPE,
        len,
        &out,
        &want,
    );
    assert_close(
        &format!("lse {what}"),
        Rule::Reduction,
        T::DTYPE,
        len,
        &lse,
        &want_lse,
    );

    let (mut wq, mut wk, mut wv) = (q.clone(), k.clone(), v.clone());
    cpu::attention_backward(AttentionBackward::<Host, T> {
        params: p,
        q: &q,
        k: &k,
        v: &v,
        out: &want,
        dout: &dout,
        lse: &want_lse,
        dq: &mut wq,
        dk: &mut wk,
        dv: &mut wv,
        cu_seqlens: cu,
    })
    .unwrap();
    let (dq, dk, dv) = backward_mc(s, &p, [&q, &k, &v, &want, &dout], &want_lse, cu);
    // P and dS go through their tile MACs as hi + lo pairs (f32 accuracy): the vector
    // kernels' rule.
    let rule = Rule::Reduction;
    let (lq, lk) = (p.tk.max(p.head_dim), p.tq.max(p.head_dim));
    assert_close(&format!("dq {what}"), rule, T::DTYPE, lq, &dq, &wq);
    assert_close(&format!("dk {what}"), rule, T::DTYPE, lk, &dk, &wk);
    assert_close(&format!("dv {what}"), rule, T::DTYPE, lk, &dv, &wv);
}

/// (batch, heads, n_kv_heads, tq, tk, head_dim, causal)
const SHAPES: [(usize, usize, usize, usize, usize, usize, bool); 8] = [
    // Whole buckets: interior tiles take the unmasked loop and the unchecked loads (at d64
    // the forward's 128-key tiles need Tk ≥ 256 for that: the tile after must be whole too).
    (1, 2, 1, 128, 256, 64, false),
    (1, 1, 1, 128, 128, 128, true),
    // Partial tiles and blocks, Tq ≠ Tk both ways, grouped heads.
    (2, 4, 2, 130, 70, 64, true),
    (1, 2, 2, 17, 200, 128, false),
    (1, 4, 1, 70, 33, 100, true), // Tq > Tk causal: 37 rows see no key
    // Off the buckets: zero-filled columns (8), scalar loads (7).
    (2, 2, 2, 33, 47, 8, true),
    (1, 2, 1, 40, 17, 7, false),
    (1, 1, 1, 1, 1, 64, true),
];

fn shapes<T: DeviceElement>(seed: u64) {
    let s = stream();
    let mut rng = Rng(seed);
    for (b, h, kv, tq, tk, d, causal) in SHAPES {
        check::<T>(&s, &mut rng, params(b, h, kv, tq, tk, d, causal), None);
    }
    // A negative scale (the forward negates q and takes the row max of the raw scores).
    let mut p = params(1, 1, 1, 40, 150, 64, false);
    p.scale = -p.scale;
    check::<T>(&s, &mut rng, p, None);
}

#[test]
fn matrix_core_attention_matches_the_reference_f16() {
    shapes::<f16>(0x3d_0001);
}

#[test]
fn matrix_core_attention_matches_the_reference_bf16() {
    shapes::<bf16>(0x3d_0002);
}

/// T = 70. Row 0: a sequence of length 1, an empty one, sequences crossing the 64-row blocks,
/// padding at the end. Row 1: padding at the start, two empty sequences, the last sequence to
/// the end.
const VT: usize = 70;
const CU: [i32; 10] = [0, 1, 1, 33, 66, 5, 40, 40, 40, 70];

#[test]
fn matrix_core_attention_with_cu_seqlens_and_grouped_heads() {
    let s = stream();
    let mut rng = Rng(0x3d_0003);
    for (d, causal) in [(64, true), (128, false), (40, true)] {
        let p = params(2, 4, 2, VT, VT, d, causal);
        check::<f16>(&s, &mut rng, p, Some(&CU));
        check::<bf16>(&s, &mut rng, p, Some(&CU));
    }
}

fn hview<T: DeviceElement>(data: &[T], layout: AttentionLayout) -> Strided<'_, Host, T> {
    Strided { data, layout }
}

fn dview<T: DeviceElement>(
    data: &hip_rt::DeviceBuffer<T>,
    layout: AttentionLayout,
) -> Strided<'_, OnDevice, T> {
    Strided { data, layout }
}

/// q, k, v read straight from `[B, T, 3, H, D]`, out written into `[B, T, H, D]`.
fn fused_forward<T: DeviceElement>(s: &Stream, rng: &mut Rng, p: AttentionParams) {
    let (t, h, d) = (p.tq, p.heads, p.head_dim);
    let qkv = rng.vec::<T>(p.batch * t * 3 * h * d, 1.0);
    let layout = |w| AttentionLayout::fused_qkv(w, t, h, d);
    let out_layout = AttentionLayout::bthd(t, h, d);
    let mut want = vec![T::from_f64(0.0); p.q_len().unwrap()];
    let mut want_lse = vec![0.0f32; p.lse_len().unwrap()];
    cpu::attention_forward_strided(AttentionForwardStrided::<Host, T> {
        params: p,
        q: hview(&qkv, layout(Qkv::Q)),
        k: hview(&qkv, layout(Qkv::K)),
        v: hview(&qkv, layout(Qkv::V)),
        out: &mut want,
        out_layout,
        lse: &mut want_lse,
        cu_seqlens: None,
    })
    .unwrap();
    let dqkv = upload(s, &qkv);
    let mut out = upload(s, &vec![T::from_f64(f64::NAN); want.len()]);
    let mut lse = upload(s, &vec![f32::NAN; want_lse.len()]);
    ops::attention_forward_strided_with(
        s,
        AttentionForwardStrided {
            params: p,
            q: dview(&dqkv, layout(Qkv::Q)),
            k: dview(&dqkv, layout(Qkv::K)),
            v: dview(&dqkv, layout(Qkv::V)),
            out: &mut out,
            out_layout,
            lse: &mut lse,
            cu_seqlens: None,
        },
        MC,
    )
    .unwrap();
    let len = p.tk.max(d);
    let what = format!("fused {p:?}");
    let ty = T::DTYPE;
    assert_close(
        &format!("out {what}"),
        Rule::Reduction,
        ty,
        len,
        &download(s, &out),
        &want,
    );
    assert_close(
        &format!("lse {what}"),
        Rule::Reduction,
        ty,
        len,
        &download(s, &lse),
        &want_lse,
    );

    // The backward into the fused gradient [B, T, 3, H, D] (NaN beforehand: the three views
    // cover it, every element must be written), from the reference's out and lse.
    let dout = rng.vec::<T>(want.len(), 1.0);
    let mut want_d = vec![T::from_f64(0.0); qkv.len()];
    cpu::attention_backward_strided(AttentionBackwardStrided::<Host, T> {
        params: p,
        q: hview(&qkv, layout(Qkv::Q)),
        k: hview(&qkv, layout(Qkv::K)),
        v: hview(&qkv, layout(Qkv::V)),
        out: Strided {
            data: &want,
            layout: out_layout,
        },
        dout: Strided {
            data: &dout,
            layout: out_layout,
        },
        lse: &want_lse,
        dqkv: &mut want_d,
        dq: layout(Qkv::Q),
        dk: layout(Qkv::K),
        dv: layout(Qkv::V),
        cu_seqlens: None,
    })
    .unwrap();
    let (bo, bdo, blse) = (upload(s, &want), upload(s, &dout), upload(s, &want_lse));
    let mut dqkv_grad = upload(s, &vec![T::from_f64(f64::NAN); qkv.len()]);
    ops::attention_backward_strided_with(
        s,
        AttentionBackwardStrided {
            params: p,
            q: dview(&dqkv, layout(Qkv::Q)),
            k: dview(&dqkv, layout(Qkv::K)),
            v: dview(&dqkv, layout(Qkv::V)),
            out: Strided {
                data: &bo,
                layout: out_layout,
            },
            dout: Strided {
                data: &bdo,
                layout: out_layout,
            },
            lse: &blse,
            dqkv: &mut dqkv_grad,
            dq: layout(Qkv::Q),
            dk: layout(Qkv::K),
            dv: layout(Qkv::V),
            cu_seqlens: None,
        },
        MC,
    )
    .unwrap();
    let got = download(s, &dqkv_grad);
    assert_close(
        &format!("dqkv {what}"),
        Rule::Reduction,
        ty,
        len,
        &got,
        &want_d,
    );
}

#[test]
fn matrix_core_attention_reads_and_writes_the_fused_projection() {
    let s = stream();
    let mut rng = Rng(0x3d_0004);
    for (t, d, causal) in [(130, 64, true), (70, 128, false), (33, 96, true)] {
        let p = params(2, 2, 2, t, t, d, causal);
        fused_forward::<f16>(&s, &mut rng, p);
        fused_forward::<bf16>(&s, &mut rng, p);
    }
}

/// Runs the attention golden cases on the matrix-core kernels (f16 and bf16; f32 cases are
/// skipped: no matrix-core kernel).
struct MatrixCoreBackend(Stream);

impl GoldenBackend for MatrixCoreBackend {
    type Error = OpError;

    fn name(&self) -> String {
        "device (matrix-core attention)".into()
    }

    fn run(&mut self, case: &dyn GoldenCase) -> Result<Outputs, OpError> {
        let s = &self.0;
        let any = case.as_any();
        if let Some(c) = any.downcast_ref::<AttentionForwardCase>() {
            return c.run_device_with(s, MC);
        }
        if let Some(c) = any.downcast_ref::<AttentionBackwardCase>() {
            return c.run_device_with(s, MC);
        }
        if let Some(c) = any.downcast_ref::<AttentionStridedCase>() {
            return c.run_device_with(s, MC);
        }
        case.run_device(s)
    }
}

/// The golden ops that run on the matrix-core kernels.
const GOLDEN_OPS: [&str; 4] = [
    "attention_forward",
    "attention_backward",
    "attention_forward_strided",
    "attention_backward_strided",
];

#[test]
fn golden_attention_cases_pass_on_the_matrix_core_kernels() {
    let mut backend = MatrixCoreBackend(stream());
    let (mut ran, mut failures) = (Vec::new(), Vec::new());
    for path in case_files(&committed_dir()).expect("case files") {
        let case = load_case(&path).expect("case");
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let half = name.contains("_f16") || name.contains("_bf16");
        if !GOLDEN_OPS.contains(&case.op()) || !half {
            continue;
        }
        match run_case_with(&mut backend, &case) {
            Ok(_) => ran.push((case.op(), name)),
            Err(e) => failures.push(format!("{name}: {e}")),
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    for op in GOLDEN_OPS {
        assert!(
            ran.iter().any(|(o, _)| *o == op),
            "no {op} f16/bf16 case ran: {ran:?}"
        );
    }
}

#[test]
fn the_kernel_choice_is_checked_and_auto_keeps_the_vector_kernels_on_gfx906() {
    let s = stream();
    let p = params(1, 1, 1, 3, 3, 64, false);
    let x = vec![0.5f32; p.q_len().unwrap()];
    let (dq, dk) = (upload(&s, &x), upload(&s, &x));
    let mut out = upload(&s, &x);
    let mut lse = upload(&s, &[0.0f32; 3]);
    let e = ops::attention_forward_with(
        &s,
        AttentionForward {
            params: p,
            q: &dq,
            k: &dk,
            v: &dk,
            out: &mut out,
            lse: &mut lse,
            cu_seqlens: None,
        },
        MC,
    )
    .unwrap_err();
    assert!(
        matches!(e, OpError::NoKernel { .. }) && e.to_string().contains("f16 or bf16"),
        "{e}"
    );
    // hip-emu's device is a gfx906: Auto resolves to the vector kernels, bit for bit.
    let arch = s.device().arch().to_string();
    assert!(!ops::arch_has_matrix_cores(&arch), "{arch}");
    let mut rng = Rng(0x3d_0005);
    let p = params(1, 2, 1, 40, 40, 64, true);
    let [q, k, v] = inputs::<f16>(&mut rng, &p);
    let run = |kernel| {
        let (bq, bk, bv) = (upload(&s, &q), upload(&s, &k), upload(&s, &v));
        let mut out = upload(&s, &vec![f16::from_f32(0.0); q.len()]);
        let mut lse = upload(&s, &vec![0.0f32; p.lse_len().unwrap()]);
        ops::attention_forward_with(
            &s,
            AttentionForward {
                params: p,
                q: &bq,
                k: &bk,
                v: &bv,
                out: &mut out,
                lse: &mut lse,
                cu_seqlens: None,
            },
            kernel,
        )
        .unwrap();
        (bits(&download(&s, &out)), bits(&download(&s, &lse)))
    };
    assert_eq!(run(AttentionKernel::Auto), run(AttentionKernel::Plain));
}
