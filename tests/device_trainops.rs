//! Device tests of the training-step ops (encoder, GELU, residual add, fused cross-entropy,
//! bias epilogue and gradient, clip grad_scale) against the CPU reference, every dtype, odd
//! sizes; the device error flags; bit-identical repeats of the deterministic backward kernels.
//! Needs `--features device` and a HIP device (a DCU, or hip-emu). Run on hip-emu, never on a
//! GPU.
#![cfg(feature = "device")]

mod device_common;

use device_common::{assert_close, bits, download, run_golden_cases, stream, upload, Rng};
use hip_kernels::ops::{
    self, BiasBackward, BiasParams, ClipGradScale, ClipParams, CrossEntropyParams, DeviceElement,
    ElementwiseParams, EncoderBackward, EncoderForward, EncoderParams, GeluBackward, GeluForward,
    MatmulBias, MatmulBiasParams, ResidualAdd, SoftmaxCrossEntropy, IGNORE_INDEX, NO_ERROR,
};
use hip_kernels::params::{bf16, f16, DType, Host};
use hip_kernels::{cpu, tolerance::Rule};
use hip_rt::{DeviceBuffer, Stream};

/// Integer buffers (token ids, targets, error flags) outside the float helpers.
fn up_i32(s: &Stream, v: &[i32]) -> DeviceBuffer<i32> {
    DeviceBuffer::from_slice(s, v).expect("upload")
}

fn flag(s: &Stream, b: &DeviceBuffer<u32>) -> u32 {
    b.to_vec(s).expect("download")[0]
}

fn tokens(rng: &mut Rng, n: usize, vocab: usize) -> Vec<i32> {
    (0..n)
        .map(|_| ((rng.uniform() * vocab as f64) as i32).min(vocab as i32 - 1))
        .collect()
}

fn encoder_random<T: DeviceElement>(s: &Stream, p: EncoderParams, seed: u64) {
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
    let (dt, dw, dp) = (up_i32(s, &tok), upload(s, &wte), upload(s, &wpe));
    let mut out = DeviceBuffer::<T>::zeroed(s, want.len()).unwrap();
    let mut err = DeviceBuffer::<u32>::zeroed(s, 1).unwrap();
    ops::encoder_forward(
        s,
        EncoderForward {
            params: p,
            tokens: &dt,
            wte: &dw,
            wpe: &dp,
            out: &mut out,
            error: Some(&mut err),
        },
    )
    .unwrap();
    assert_eq!(flag(s, &err), NO_ERROR);
    assert_close(
        "out",
        Rule::Reduction,
        T::DTYPE,
        2,
        &download(s, &out),
        &want,
    );

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
    let ddout = upload(s, &dout);
    let mut runs = Vec::new();
    for _ in 0..2 {
        let (mut te, mut pe) = (upload(s, &dwte0), upload(s, &dwpe0));
        ops::encoder_backward(
            s,
            EncoderBackward {
                params: p,
                tokens: &dt,
                dout: &ddout,
                dwte: &mut te,
                dwpe: &mut pe,
                error: Some(&mut err),
            },
        )
        .unwrap();
        assert_eq!(flag(s, &err), NO_ERROR);
        runs.push((download(s, &te), download(s, &pe)));
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
        encoder_random::<f32>(&s, p, 10 + i as u64);
        encoder_random::<f16>(&s, p, 20 + i as u64);
        encoder_random::<bf16>(&s, p, 30 + i as u64);
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
}

fn elementwise_random<T: DeviceElement>(s: &Stream, n: usize, seed: u64) {
    let mut rng = Rng(seed);
    let (x, g, b): (Vec<T>, Vec<T>, Vec<T>) = (rng.vec(n, 3.0), rng.vec(n, 1.0), rng.vec(n, 1.0));
    let params = ElementwiseParams { len: n };
    let (dx, dg, db) = (upload(s, &x), upload(s, &g), upload(s, &b));
    let mut out = DeviceBuffer::<T>::zeroed(s, n).unwrap();
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
            x: &dx,
            out: &mut out,
        },
    )
    .unwrap();
    assert_close(
        "gelu out",
        Rule::Reduction,
        T::DTYPE,
        1,
        &download(s, &out),
        &want,
    );
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
            x: &dx,
            dout: &dg,
            dx: &mut out,
        },
    )
    .unwrap();
    assert_close(
        "gelu dx",
        Rule::Reduction,
        T::DTYPE,
        1,
        &download(s, &out),
        &want,
    );
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
            a: &dx,
            b: &db,
            out: &mut out,
        },
    )
    .unwrap();
    assert_close(
        "residual_add",
        Rule::Reduction,
        T::DTYPE,
        1,
        &download(s, &out),
        &want,
    );
}

#[test]
fn gelu_and_residual_add_match_the_reference_every_dtype() {
    let s = stream();
    for (i, n) in [1usize, 7, 1031, 65_537].into_iter().enumerate() {
        elementwise_random::<f32>(&s, n, 40 + i as u64);
        elementwise_random::<f16>(&s, n, 50 + i as u64);
        elementwise_random::<bf16>(&s, n, 60 + i as u64);
    }
}

fn crossentropy_random<T: DeviceElement>(s: &Stream, p: CrossEntropyParams, seed: u64) {
    let mut rng = Rng(seed);
    let logits: Vec<T> = rng.vec(p.rows * p.padded_vocab, 3.0);
    let mut tgt = tokens(&mut rng, p.rows, p.vocab);
    for t in tgt.iter_mut().skip(1).step_by(4) {
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
        error: None,
    })
    .unwrap();
    let (mut dl, dt) = (upload(s, &logits), up_i32(s, &tgt));
    let mut losses = DeviceBuffer::<f32>::zeroed(s, p.rows).unwrap();
    let mut loss = DeviceBuffer::<f32>::zeroed(s, 1).unwrap();
    let mut err = DeviceBuffer::<u32>::zeroed(s, 1).unwrap();
    ops::softmax_cross_entropy(
        s,
        SoftmaxCrossEntropy {
            params: p,
            logits: &mut dl,
            targets: &dt,
            losses: &mut losses,
            loss: Some(&mut loss),
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
        &download(s, &losses),
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
    let got = download(s, &dl);
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
        };
        crossentropy_random::<f32>(&s, p, 70 + i as u64);
        crossentropy_random::<f16>(&s, p, 80 + i as u64);
        crossentropy_random::<bf16>(&s, p, 90 + i as u64);
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

/// Uploads `v` at element `offset` of a fresh buffer (offset 1: a view misaligned for every
/// vector width).
fn upload_at<T: DeviceElement>(s: &Stream, v: &[T], offset: usize) -> DeviceBuffer<T> {
    let mut h = vec![T::from_f64(0.0); offset];
    h.extend_from_slice(v);
    upload(s, &h)
}

/// `matmul_bias` (one launch, the fused epilogue) against the CPU reference: `pre` asks for
/// `pre_gelu` (with `p.gelu`); `offset` places every tensor at that element of its buffer.
fn matmul_bias_case<T: DeviceElement>(
    s: &Stream,
    p: MatmulBiasParams,
    pre: bool,
    offset: usize,
    seed: u64,
) {
    let mut rng = Rng(seed);
    let m = p.matmul();
    let len = m.out_len().unwrap();
    let (a, b, bias): (Vec<T>, Vec<T>, Vec<T>) = (
        rng.vec(m.a_len().unwrap(), 1.0),
        rng.vec(m.b_len().unwrap(), 1.0),
        rng.vec(p.n, 1.0),
    );
    let (mut want, mut want_pre) = (vec![T::from_f64(0.0); len], vec![T::from_f64(0.0); len]);
    cpu::matmul_bias(MatmulBias::<Host, T> {
        params: p,
        a: &a,
        b: &b,
        bias: &bias,
        out: &mut want,
        pre_gelu: pre.then_some(&mut want_pre[..]),
    })
    .unwrap();
    let (da, dbm, dbias) = (
        upload_at(s, &a, offset),
        upload_at(s, &b, offset),
        upload_at(s, &bias, offset),
    );
    // NaN where nothing may be read: the kernel must overwrite every element of out.
    let nan = vec![T::from_f64(f64::NAN); len + offset];
    let (mut out, mut pre_buf) = (upload(s, &nan), upload(s, &nan));
    {
        let (va, vb, vbias) = (
            da.slice(offset..).unwrap(),
            dbm.slice(offset..).unwrap(),
            dbias.slice(offset..).unwrap(),
        );
        let mut vo = out.slice_mut(offset..).unwrap();
        let mut vp = pre_buf.slice_mut(offset..).unwrap();
        ops::matmul_bias(
            s,
            MatmulBias {
                params: p,
                a: &va,
                b: &vb,
                bias: &vbias,
                out: &mut vo,
                pre_gelu: if pre { Some(&mut vp as _) } else { None },
            },
        )
        .unwrap();
    }
    let what = format!("{p:?} pre {pre} offset {offset}");
    // One rounding of (f32 accumulator + bias), GELU in f32: the reduction rule of k + 1 terms.
    assert_close(
        &format!("out {what}"),
        Rule::Reduction,
        T::DTYPE,
        p.k + 1,
        &download(s, &out)[offset..],
        &want,
    );
    let got_pre = download(s, &pre_buf);
    if pre {
        assert_close(
            &format!("pre_gelu {what}"),
            Rule::Reduction,
            T::DTYPE,
            p.k + 1,
            &got_pre[offset..],
            &want_pre,
        );
    } else {
        assert!(
            got_pre.iter().all(|x| x.to_f64().is_nan()),
            "pre_gelu not asked for, not written: {what}"
        );
    }
}

fn bias_backward_random<T: DeviceElement>(s: &Stream, rows: usize, cols: usize, seed: u64) {
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
    let dd = upload(s, &dout);
    let mut runs = Vec::new();
    for _ in 0..2 {
        let mut db = upload(s, &db0);
        ops::bias_backward(
            s,
            BiasBackward {
                params: bp,
                dout: &dd,
                dbias: &mut db,
            },
        )
        .unwrap();
        runs.push(download(s, &db));
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
        matmul_bias_case::<T>(s, p, pre, offset, seed + i as u64);
    }
    // The 128×128 tile (chosen when it gives every CU two blocks): batch 20 of 3 × 2 tiles,
    // edge tiles on both axes, whole interior tiles.
    let big = bias_params(20, 257, 130, 64, (false, true), true);
    let plan = ops::MatmulPlan::new(&big.matmul(), T::DTYPE, s.device().compute_units()).unwrap();
    assert_eq!(plan.tile, ops::MatmulTile::Big, "{plan:?}");
    matmul_bias_case::<T>(s, big, true, 0, seed + 10);
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
        bias_backward_random::<f32>(&s, rows, cols, 100 + i as u64);
        bias_backward_random::<f16>(&s, rows, cols, 110 + i as u64);
        bias_backward_random::<bf16>(&s, rows, cols, 120 + i as u64);
    }
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
