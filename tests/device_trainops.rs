//! Device tests of the training-step ops (encoder, GELU, residual add, fused cross-entropy,
//! bias epilogue and gradient, clip grad_scale) against the CPU reference, every dtype, odd
//! sizes, aligned views (the vector path) and misaligned ones (the scalar path); the device
//! error flags (first bad row, forward and backward); ignored, all-ignored and padded
//! cross-entropy rows, logits of ±1e4; bit-identical repeats of the deterministic backward
//! kernels, also under another block size and grid. Needs `--features device` and a HIP device
//! (a DCU, or hip-emu). Run on hip-emu, never on a GPU.
#![cfg(feature = "device")]

mod device_common;

use device_common::{
    assert_close, bits, download, matmul_bias_case, run_golden_cases, stream, tokens, up_i32,
    upload, Rng, Shifted,
};
use hip_kernels::ops::{
    self, BiasBackward, BiasParams, ClipGradScale, ClipParams, CrossEntropyParams, DeviceElement,
    ElementwiseParams, EncoderBackward, EncoderForward, EncoderParams, GeluBackward, GeluForward,
    MatmulBiasParams, ResidualAdd, SoftmaxCrossEntropy, IGNORE_INDEX, NO_ERROR,
};
use hip_kernels::params::{bf16, f16, DType, Host};
use hip_kernels::{cpu, tolerance::Rule};
use hip_rt::{DeviceBuffer, Stream};

fn flag(s: &Stream, b: &DeviceBuffer<u32>) -> u32 {
    b.to_vec(s).expect("download")[0]
}

/// Forward and backward against the reference, float tensors on views `off` elements into their
/// allocations (0: aligned, the vector path; 1: misaligned, the scalar path).
fn encoder_random<T: DeviceElement>(s: &Stream, p: EncoderParams, seed: u64, off: usize) {
    let mut rng = Rng(seed);
    let rows = p.batch * p.seq;
    let mut tok = tokens(&mut rng, rows, p.vocab);
    if rows > 2 {
        tok[rows - 1] = tok[0]; // a repeat
    }
    let wte: Vec<T> = rng.vec(p.vocab * p.channels, 1.0);
    let wpe: Vec<T> = rng.vec(p.positions * p.channels, 1.0);
    let mut want = vec![T::from_f64(0.0); rows * p.channels];
    cpu::encoder_forward(EncoderForward::<Host, T> {
        params: p,
        tokens: &tok,
        wte: &wte,
        wpe: &wpe,
        out: &mut want,
        error: None,
    })
    .unwrap();
    let dt = up_i32(s, &tok);
    let (dw, dp) = (Shifted::new(s, &wte, off), Shifted::new(s, &wpe, off));
    let mut out = Shifted::new(s, &vec![T::from_f64(0.0); want.len()], off);
    let mut err = DeviceBuffer::<u32>::zeroed(s, 1).unwrap();
    ops::encoder_forward(
        s,
        EncoderForward {
            params: p,
            tokens: &dt,
            wte: &dw.view(),
            wpe: &dp.view(),
            out: &mut out.view_mut(),
            error: Some(&mut err),
        },
    )
    .unwrap();
    assert_eq!(flag(s, &err), NO_ERROR);
    assert_close("out", Rule::Reduction, T::DTYPE, 2, &out.get(s), &want);

    let dout: Vec<T> = rng.vec(rows * p.channels, 1.0);
    let (dwte0, dwpe0): (Vec<T>, Vec<T>) = (rng.vec(wte.len(), 1.0), rng.vec(wpe.len(), 1.0));
    let (mut want_te, mut want_pe) = (dwte0.clone(), dwpe0.clone());
    cpu::encoder_backward(EncoderBackward::<Host, T> {
        params: p,
        tokens: &tok,
        dout: &dout,
        dwte: &mut want_te,
        dwpe: &mut want_pe,
        error: None,
    })
    .unwrap();
    let ddout = Shifted::new(s, &dout, off);
    let mut runs = Vec::new();
    for _ in 0..2 {
        let (mut te, mut pe) = (Shifted::new(s, &dwte0, off), Shifted::new(s, &dwpe0, off));
        ops::encoder_backward(
            s,
            EncoderBackward {
                params: p,
                tokens: &dt,
                dout: &ddout.view(),
                dwte: &mut te.view_mut(),
                dwpe: &mut pe.view_mut(),
                error: Some(&mut err),
            },
        )
        .unwrap();
        assert_eq!(flag(s, &err), NO_ERROR);
        runs.push((te.get(s), pe.get(s)));
    }
    let add = usize::from(p.accumulate);
    assert_close(
        "dwte",
        Rule::Reduction,
        T::DTYPE,
        rows + add,
        &runs[0].0,
        &want_te,
    );
    assert_close(
        "dwpe",
        Rule::Reduction,
        T::DTYPE,
        p.batch + add,
        &runs[0].1,
        &want_pe,
    );
    assert_eq!(
        bits(&runs[0].0),
        bits(&runs[1].0),
        "dwte bit-identical run to run"
    );
    assert_eq!(
        bits(&runs[0].1),
        bits(&runs[1].1),
        "dwpe bit-identical run to run"
    );
}

#[test]
fn encoder_matches_the_reference_every_dtype() {
    let s = stream();
    for (i, (batch, seq, channels, vocab, positions, accumulate)) in [
        (2, 5, 7, 11, 9, false),
        (3, 100, 24, 40, 100, true),
        (4, 64, 768, 50, 128, false),
    ]
    .into_iter()
    .enumerate()
    {
        let p = EncoderParams {
            batch,
            seq,
            channels,
            vocab,
            positions,
            accumulate,
        };
        encoder_random::<f32>(&s, p, 10 + i as u64, 0);
        encoder_random::<f16>(&s, p, 20 + i as u64, 0);
        encoder_random::<bf16>(&s, p, 30 + i as u64, 0);
    }
}

#[test]
fn bad_token_ids_set_the_error_flag_and_are_never_read() {
    let s = stream();
    let p = EncoderParams {
        batch: 2,
        seq: 3,
        channels: 8,
        vocab: 5,
        positions: 3,
        accumulate: false,
    };
    let tok = up_i32(&s, &[0, 1, 2, 7, -1, 3]);
    let (wte, wpe) = (upload(&s, &[1.0f32; 40]), upload(&s, &[1.0f32; 24]));
    let mut out = DeviceBuffer::<f32>::zeroed(&s, 48).unwrap();
    let mut err = DeviceBuffer::<u32>::zeroed(&s, 1).unwrap();
    ops::encoder_forward(
        &s,
        EncoderForward {
            params: p,
            tokens: &tok,
            wte: &wte,
            wpe: &wpe,
            out: &mut out,
            error: Some(&mut err),
        },
    )
    .unwrap();
    assert_eq!(flag(&s, &err), 3, "the first bad row (b = 1, t = 0)");
    let o = download(&s, &out);
    assert!(o[24..40].iter().all(|x| x.is_nan()) && o[..24].iter().all(|&x| x == 2.0));
    // The backward reports the same first bad row and leaves bad rows out of dwte (dwpe, which
    // does not depend on the token, still gets them).
    let mut err = DeviceBuffer::<u32>::zeroed(&s, 1).unwrap();
    let dout = upload(&s, &[1.0f32; 48]);
    let (mut dwte, mut dwpe) = (upload(&s, &[9.0f32; 40]), upload(&s, &[9.0f32; 24]));
    ops::encoder_backward(
        &s,
        EncoderBackward {
            params: p,
            tokens: &tok,
            dout: &dout,
            dwte: &mut dwte,
            dwpe: &mut dwpe,
            error: Some(&mut err),
        },
    )
    .unwrap();
    assert_eq!(flag(&s, &err), 3, "the backward's first bad row");
    let (te, pe) = (download(&s, &dwte), download(&s, &dwpe));
    assert!(
        te[..32].iter().all(|&x| x == 1.0),
        "tokens 0..4 once each: {te:?}"
    );
    assert!(
        te[32..].iter().all(|&x| x == 0.0),
        "token 4 never seen: {te:?}"
    );
    assert!(
        pe.iter().all(|&x| x == 2.0),
        "two batch rows per position: {pe:?}"
    );
}

/// GELU forward/backward and residual add on views `off` elements into their allocations.
fn elementwise_random<T: DeviceElement>(s: &Stream, n: usize, seed: u64, off: usize) {
    let mut rng = Rng(seed);
    let (x, g, b): (Vec<T>, Vec<T>, Vec<T>) = (rng.vec(n, 3.0), rng.vec(n, 1.0), rng.vec(n, 1.0));
    let params = ElementwiseParams { len: n };
    let (dx, dg, db) = (
        Shifted::new(s, &x, off),
        Shifted::new(s, &g, off),
        Shifted::new(s, &b, off),
    );
    let mut out = Shifted::new(s, &vec![T::from_f64(0.0); n], off);
    let mut want = vec![T::from_f64(0.0); n];
    cpu::gelu_forward(GeluForward::<Host, T> {
        params,
        x: &x,
        out: &mut want,
    })
    .unwrap();
    ops::gelu_forward(
        s,
        GeluForward {
            params,
            x: &dx.view(),
            out: &mut out.view_mut(),
        },
    )
    .unwrap();
    assert_close("gelu out", Rule::Reduction, T::DTYPE, 1, &out.get(s), &want);
    cpu::gelu_backward(GeluBackward::<Host, T> {
        params,
        x: &x,
        dout: &g,
        dx: &mut want,
    })
    .unwrap();
    ops::gelu_backward(
        s,
        GeluBackward {
            params,
            x: &dx.view(),
            dout: &dg.view(),
            dx: &mut out.view_mut(),
        },
    )
    .unwrap();
    assert_close("gelu dx", Rule::Reduction, T::DTYPE, 1, &out.get(s), &want);
    cpu::residual_add(ResidualAdd::<Host, T> {
        params,
        a: &x,
        b: &b,
        out: &mut want,
    })
    .unwrap();
    ops::residual_add(
        s,
        ResidualAdd {
            params,
            a: &dx.view(),
            b: &db.view(),
            out: &mut out.view_mut(),
        },
    )
    .unwrap();
    assert_close(
        "residual_add",
        Rule::Reduction,
        T::DTYPE,
        1,
        &out.get(s),
        &want,
    );
}

#[test]
fn gelu_and_residual_add_match_the_reference_every_dtype() {
    let s = stream();
    for (i, n) in [1usize, 7, 1031, 65_537].into_iter().enumerate() {
        elementwise_random::<f32>(&s, n, 40 + i as u64, 0);
        elementwise_random::<f16>(&s, n, 50 + i as u64, 0);
        elementwise_random::<bf16>(&s, n, 60 + i as u64, 0);
    }
}

/// Which targets a cross-entropy case ignores.
#[derive(Clone, Copy, PartialEq)]
enum Ignored {
    /// Every fourth row from row 1.
    Some,
    /// Every row: no loss and no gradient anywhere.
    All,
}

/// Fused cross-entropy against the reference: logits of scale `scale` clamped to ±1e4 (with
/// scale 1e4 a ±1e4 logit in rows 1 and 2), on views `off` elements into their allocations.
fn crossentropy_random<T: DeviceElement>(
    s: &Stream,
    p: CrossEntropyParams,
    seed: u64,
    (scale, ignored, off): (f64, Ignored, usize),
) {
    let mut rng = Rng(seed);
    let mut logits: Vec<T> = rng
        .vec::<T>(p.rows * p.padded_vocab, scale)
        .into_iter()
        .map(|x| T::from_f64(x.to_f64().clamp(-1e4, 1e4)))
        .collect();
    if scale >= 1e4 && p.rows > 2 && p.vocab > 2 {
        logits[p.padded_vocab + 2] = T::from_f64(1e4);
        logits[2 * p.padded_vocab] = T::from_f64(-1e4);
    }
    let mut tgt = tokens(&mut rng, p.rows, p.vocab);
    let step = if ignored == Ignored::All { 1 } else { 4 };
    for t in tgt
        .iter_mut()
        .skip(usize::from(ignored == Ignored::Some))
        .step_by(step)
    {
        *t = IGNORE_INDEX;
    }
    let (mut want, mut want_losses, mut want_loss) =
        (logits.clone(), vec![0.0f32; p.rows], [0.0f32]);
    cpu::softmax_cross_entropy(SoftmaxCrossEntropy::<Host, T> {
        params: p,
        logits: &mut want,
        targets: &tgt,
        losses: &mut want_losses,
        loss: Some(&mut want_loss),
        totals: None,
        error: None,
    })
    .unwrap();
    let (mut dl, dt) = (Shifted::new(s, &logits, off), up_i32(s, &tgt));
    let mut losses = Shifted::new(s, &vec![0f32; p.rows], off);
    let mut loss = DeviceBuffer::<f32>::zeroed(s, 1).unwrap();
    let mut err = DeviceBuffer::<u32>::zeroed(s, 1).unwrap();
    ops::softmax_cross_entropy(
        s,
        SoftmaxCrossEntropy {
            params: p,
            logits: &mut dl.view_mut(),
            targets: &dt,
            losses: &mut losses.view_mut(),
            loss: Some(&mut loss),
            totals: None,
            error: Some(&mut err),
        },
    )
    .unwrap();
    assert_eq!(flag(s, &err), u32::MAX);
    assert_close(
        "losses",
        Rule::Reduction,
        T::DTYPE,
        p.vocab,
        &losses.get(s),
        &want_losses,
    );
    assert_close(
        "loss",
        Rule::Reduction,
        T::DTYPE,
        p.vocab,
        &download(s, &loss),
        &want_loss,
    );
    let n = tgt.iter().filter(|&&t| t != IGNORE_INDEX).count().max(1) as f64;
    let tol = hip_kernels::tolerance::softmax_gradient(T::DTYPE, p.vocab, 1.0 / n);
    let got = dl.get(s);
    if ignored == Ignored::All {
        assert!(want_losses.iter().all(|&l| l == 0.0), "{want_losses:?}");
        assert!(
            got.iter().all(|g| g.to_f64() == 0.0),
            "no gradient anywhere"
        );
    }
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            tol.allows(g.to_f64(), w.to_f64()),
            "dlogits[{i}]: {g:?} vs {w:?} ({tol:?})"
        );
    }
}

#[test]
fn crossentropy_matches_the_reference_every_dtype() {
    let s = stream();
    for (i, (rows, vocab, padded_vocab)) in [(7, 37, 37), (5, 50, 64), (3, 50257, 50304)]
        .into_iter()
        .enumerate()
    {
        let p = CrossEntropyParams {
            rows,
            vocab,
            padded_vocab,
            dloss: Some(1.0),
            divisor: None,
        };
        let case = (3.0, Ignored::Some, 0);
        crossentropy_random::<f32>(&s, p, 70 + i as u64, case);
        crossentropy_random::<f16>(&s, p, 80 + i as u64, case);
        crossentropy_random::<bf16>(&s, p, 90 + i as u64, case);
    }
}

/// Logits of ±1e4 (an overflow of exp without the max shift), and a batch whose every row is
/// ignored (loss, losses and gradients all zero), every dtype.
#[test]
fn crossentropy_extreme_logits_and_all_ignored_rows() {
    let s = stream();
    for (i, (rows, vocab, padded_vocab, case)) in [
        (4, 33, 33, (1e4, Ignored::Some, 0)),
        (3, 17, 20, (1.0, Ignored::All, 0)),
    ]
    .into_iter()
    .enumerate()
    {
        let p = CrossEntropyParams {
            rows,
            vocab,
            padded_vocab,
            dloss: Some(0.75),
            divisor: None,
        };
        crossentropy_random::<f32>(&s, p, 130 + i as u64, case);
        crossentropy_random::<f16>(&s, p, 140 + i as u64, case);
        crossentropy_random::<bf16>(&s, p, 150 + i as u64, case);
    }
}

#[test]
fn a_bad_target_sets_the_error_flag_and_a_nan_row() {
    let s = stream();
    let p = CrossEntropyParams {
        rows: 3,
        vocab: 4,
        padded_vocab: 5,
        dloss: Some(1.0),
        divisor: None,
    };
    let mut logits = upload(&s, &[0.5f32; 15]);
    let targets = up_i32(&s, &[1, IGNORE_INDEX, 4]);
    let mut losses = DeviceBuffer::<f32>::zeroed(&s, 3).unwrap();
    let mut err = DeviceBuffer::<u32>::zeroed(&s, 1).unwrap();
    ops::softmax_cross_entropy(
        &s,
        SoftmaxCrossEntropy {
            params: p,
            logits: &mut logits,
            targets: &targets,
            losses: &mut losses,
            loss: None,
            totals: None,
            error: Some(&mut err),
        },
    )
    .unwrap();
    assert_eq!(flag(&s, &err), 2, "row 2's target 4 is out of 0..4");
    let (l, g) = (download(&s, &losses), download(&s, &logits));
    assert!(
        (l[0] - 4f32.ln()).abs() < 1e-6 && l[1] == 0.0 && l[2].is_nan(),
        "{l:?}"
    );
    assert!(
        g[5..10].iter().all(|&x| x == 0.0) && g[10..].iter().all(|x| x.is_nan()),
        "{g:?}"
    );
    assert_eq!(g[4], 0.0, "padding column zeroed");
}

/// bias_backward against the reference, twice (bit-identical), on views `off` elements into
/// their allocations.
fn bias_backward_random<T: DeviceElement>(
    s: &Stream,
    (rows, cols): (usize, usize),
    seed: u64,
    off: usize,
) {
    let mut rng = Rng(seed);
    let dout: Vec<T> = rng.vec(rows * cols, 1.0);
    let db0: Vec<T> = rng.vec(cols, 1.0);
    let bp = BiasParams {
        rows,
        cols,
        accumulate: true,
    };
    let mut want_db = db0.clone();
    cpu::bias_backward(BiasBackward::<Host, T> {
        params: bp,
        dout: &dout,
        dbias: &mut want_db,
    })
    .unwrap();
    let dd = Shifted::new(s, &dout, off);
    let mut runs = Vec::new();
    for _ in 0..2 {
        let mut db = Shifted::new(s, &db0, off);
        ops::bias_backward(
            s,
            BiasBackward {
                params: bp,
                dout: &dd.view(),
                dbias: &mut db.view_mut(),
            },
        )
        .unwrap();
        runs.push(db.get(s));
    }
    assert_close(
        "dbias",
        Rule::Reduction,
        T::DTYPE,
        rows + 1,
        &runs[0],
        &want_db,
    );
    assert_eq!(
        bits(&runs[0]),
        bits(&runs[1]),
        "dbias bit-identical run to run"
    );
}

fn bias_params(
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
    ab: (bool, bool),
    gelu: bool,
) -> MatmulBiasParams {
    MatmulBiasParams {
        batch,
        m,
        n,
        k,
        trans_a: ab.0,
        trans_b: ab.1,
        gelu,
    }
}

/// Odd m, n, k, every layout, with and without GELU and pre_gelu, misaligned views, both tiles
/// (the small tile's and the big tile's unchecked interior blocks: k a multiple of the slice
/// depth, B transposed so its rows are aligned).
fn matmul_bias_every_case<T: DeviceElement>(s: &Stream, seed: u64) {
    let cases = [
        (bias_params(1, 1, 5, 3, (false, false), true), true, 0),
        (bias_params(2, 37, 19, 17, (true, false), true), false, 0),
        (bias_params(1, 130, 67, 64, (false, true), false), false, 0),
        (bias_params(3, 65, 33, 32, (true, true), true), true, 1),
        (bias_params(1, 7, 9, 5, (false, false), false), false, 1),
    ];
    for (i, (p, pre, offset)) in cases.into_iter().enumerate() {
        matmul_bias_case::<T>(s, p, pre, offset, seed + i as u64, None);
    }
    // The 128×128 tile (chosen when it gives every CU two blocks): batch 20 of 3 × 2 tiles,
    // edge tiles on both axes, whole interior tiles.
    let big = bias_params(20, 257, 130, 64, (false, true), true);
    let plan = ops::MatmulPlan::new(&big.matmul(), T::DTYPE, s.device().compute_units()).unwrap();
    assert_eq!(plan.tile, ops::MatmulTile::Big, "{plan:?}");
    matmul_bias_case::<T>(s, big, true, 0, seed + 10, None);
}

#[test]
fn matmul_bias_matches_the_reference_every_dtype() {
    let s = stream();
    matmul_bias_every_case::<f32>(&s, 100);
    matmul_bias_every_case::<f16>(&s, 200);
    matmul_bias_every_case::<bf16>(&s, 300);
}

#[test]
fn bias_gradient_matches_the_reference_every_dtype() {
    let s = stream();
    for (i, (rows, cols)) in [(1, 5), (37, 19), (300, 130)].into_iter().enumerate() {
        bias_backward_random::<f32>(&s, (rows, cols), 100 + i as u64, 0);
        bias_backward_random::<f16>(&s, (rows, cols), 110 + i as u64, 0);
        bias_backward_random::<bf16>(&s, (rows, cols), 120 + i as u64, 0);
    }
}

/// Every training-step op on views one element past an aligned start (the kernels' scalar path;
/// the tests above use aligned buffers, the vector path), odd sizes, every dtype.
#[test]
fn training_ops_on_misaligned_views_match_the_reference() {
    let s = stream();
    let enc = EncoderParams {
        batch: 3,
        seq: 4,
        channels: 33,
        vocab: 6,
        positions: 4,
        accumulate: true,
    };
    let ce = CrossEntropyParams {
        rows: 5,
        vocab: 29,
        padded_vocab: 32,
        dloss: Some(1.0),
        divisor: None,
    };
    let ce_case = (3.0, Ignored::Some, 1);
    for n in [7, 1031] {
        elementwise_random::<f32>(&s, n, 160, 1);
        elementwise_random::<f16>(&s, n, 161, 1);
        elementwise_random::<bf16>(&s, n, 162, 1);
    }
    encoder_random::<f32>(&s, enc, 170, 1);
    encoder_random::<f16>(&s, enc, 171, 1);
    encoder_random::<bf16>(&s, enc, 172, 1);
    bias_backward_random::<f32>(&s, (20, 64), 180, 1);
    bias_backward_random::<f16>(&s, (20, 64), 181, 1);
    bias_backward_random::<bf16>(&s, (20, 64), 182, 1);
    crossentropy_random::<f32>(&s, ce, 190, ce_case);
    crossentropy_random::<f16>(&s, ce, 191, ce_case);
    crossentropy_random::<bf16>(&s, ce, 192, ce_case);
}

#[test]
fn clip_grad_scale_from_the_device_norm() {
    let s = stream();
    let mut rng = Rng(7);
    let g: Vec<f32> = rng.vec(1000, 1024.0);
    let norm_host = cpu::l2_norm(&[&g[..]]);
    let dg = upload(&s, &g);
    let mut norm = DeviceBuffer::<f32>::zeroed(&s, 1).unwrap();
    ops::l2_norm(&s, &[&dg], &mut norm).unwrap();
    let scale = upload(&s, &[1024.0f32]);
    let mut gs = DeviceBuffer::<f32>::zeroed(&s, 1).unwrap();
    ops::clip_grad_scale(
        &s,
        ClipGradScale {
            params: ClipParams { max_norm: 1.0 },
            norm: &norm,
            loss_scale: Some(&scale),
            grad_scale: &mut gs,
        },
    )
    .unwrap();
    let mut want = [0.0f32];
    cpu::clip_grad_scale(ClipGradScale::<Host> {
        params: ClipParams { max_norm: 1.0 },
        norm: &[norm_host as f32],
        loss_scale: Some(&[1024.0]),
        grad_scale: &mut want,
    })
    .unwrap();
    assert_close(
        "grad_scale",
        Rule::Reduction,
        DType::F32,
        1000,
        &download(&s, &gs),
        &want,
    );
}

#[test]
fn golden_training_step_cases_pass_on_the_device() {
    // The strided attention ops have no device kernel yet (OpError::NoKernel): not selected.
    run_golden_cases(
        |op| {
            matches!(
                op,
                "encoder_forward"
                    | "encoder_backward"
                    | "gelu_forward"
                    | "gelu_backward"
                    | "residual_add"
                    | "crossentropy"
                    | "matmul_bias"
                    | "bias_backward"
                    | "residual_layernorm_forward"
                    | "clip"
            )
        },
        "training-step",
    );
}
