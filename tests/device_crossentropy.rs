//! Device tests of the cross-entropy divisor and totals and of the chunked
//! `linear_crossentropy` against the CPU reference (f64), every dtype: explicit divisors over
//! micro-batches, totals accumulated across calls, all-ignored rows, row chunks that divide N
//! and an edge chunk that does not, a frozen head (no dW), forward only, misaligned views of
//! `h` / `dh` (the scalar paths) and odd vocabularies (unaligned logits rows); the error flag
//! names the row in the whole call, not in its chunk; the allocator's peak of the fused path is
//! exactly its plan's scratch, against the plain path's `[N, V]` logits (`memory_stats()`,
//! exact bytes; the figures of docs/CROSSENTROPY.md). Needs `--features device` and a HIP
//! device (hip-emu). Run on hip-emu, never on a GPU.
#![cfg(feature = "device")]

mod device_common;

use device_common::{
    assert_close, assert_close_with, download, stream, tokens, up_i32, Rng, Shifted,
};
use hip_kernels::golden::{GoldenCase, TensorData};
use hip_kernels::ops::{
    self, CrossEntropyParams, DeviceElement, LinearCrossEntropy, LinearCrossEntropyCase,
    LinearCrossEntropyParams, LinearCrossEntropyPlan, Matmul, MatmulParams, SoftmaxCrossEntropy,
    IGNORE_INDEX,
};
use hip_kernels::params::{bf16, f16, Host};
use hip_kernels::{cpu, tolerance::Rule};
use hip_rt::{DeviceBuffer, Stream};
use std::sync::Mutex;

/// The memory test reads the device's allocator statistics: no other test of this binary may
/// allocate meanwhile, so every test holds this lock.
static DEVICE: Mutex<()> = Mutex::new(());

fn lock() -> std::sync::MutexGuard<'static, ()> {
    DEVICE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Which targets are ignored.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Ignored {
    /// Every third row from row 1, and the whole last row group when `rows ≥ 4`.
    Some,
    /// Every row.
    All,
}

fn targets(rng: &mut Rng, rows: usize, vocab: usize, ignored: Ignored) -> Vec<i32> {
    let mut t = tokens(rng, rows, vocab);
    for (i, x) in t.iter_mut().enumerate() {
        if ignored == Ignored::All || i % 3 == 1 {
            *x = IGNORE_INDEX;
        }
    }
    t
}

/// Two micro-batches of one step through `softmax_cross_entropy` with the step's count as the
/// divisor and one `totals`: the summed `loss` outputs, the totals and the gradients match the
/// reference.
fn divisor_over_micro_batches<T: DeviceElement>(
    s: &Stream,
    rows: usize,
    vocab: usize,
    seed: u64,
    ignored: Ignored,
) {
    let mut rng = Rng(seed);
    let logits: Vec<T> = rng.vec(2 * rows * vocab, 2.0);
    let tgt = targets(&mut rng, 2 * rows, vocab, ignored);
    let counted = tgt.iter().filter(|&&t| t != IGNORE_INDEX).count();
    let divisor = counted.max(1) as f32 + 0.5;
    let p = CrossEntropyParams {
        dloss: Some(0.75),
        divisor: Some(divisor),
        ..CrossEntropyParams::new(rows, vocab)
    };
    let (mut want_totals, mut totals) = (
        [1.0f32, 2.0],
        DeviceBuffer::from_slice(s, &[1.0f32, 2.0]).unwrap(),
    );
    for mb in 0..2 {
        let (x, t) = (
            &logits[mb * rows * vocab..][..rows * vocab],
            &tgt[mb * rows..][..rows],
        );
        let (mut want, mut want_losses, mut want_loss) = (x.to_vec(), vec![0f32; rows], [0f32]);
        cpu::softmax_cross_entropy(SoftmaxCrossEntropy::<Host, T> {
            params: p,
            logits: &mut want,
            targets: t,
            losses: &mut want_losses,
            loss: Some(&mut want_loss),
            totals: Some(&mut want_totals),
            error: None,
        })
        .unwrap();
        let mut dl = Shifted::new(s, x, mb);
        let dt = up_i32(s, t);
        let mut losses = DeviceBuffer::<f32>::zeroed(s, rows).unwrap();
        let mut loss = DeviceBuffer::<f32>::zeroed(s, 1).unwrap();
        ops::softmax_cross_entropy(
            s,
            SoftmaxCrossEntropy {
                params: p,
                logits: &mut dl.view_mut(),
                targets: &dt,
                losses: &mut losses,
                loss: Some(&mut loss),
                totals: Some(&mut totals),
                error: None,
            },
        )
        .unwrap();
        assert_close(
            "losses",
            Rule::Reduction,
            T::DTYPE,
            vocab,
            &download(s, &losses),
            &want_losses,
        );
        assert_close(
            "loss",
            Rule::Reduction,
            T::DTYPE,
            vocab * rows,
            &download(s, &loss),
            &want_loss,
        );
        let tol =
            hip_kernels::tolerance::softmax_gradient(T::DTYPE, vocab, 0.75 / f64::from(divisor));
        assert_close_with("dlogits", tol, &dl.get(s), &want);
    }
    assert_eq!(want_totals[1], 2.0 + counted as f32);
    assert_close(
        "totals",
        Rule::Reduction,
        T::DTYPE,
        2 * rows * vocab,
        &download(s, &totals),
        &want_totals,
    );
}

#[test]
fn a_divisor_and_totals_over_micro_batches_match_the_reference_every_dtype() {
    let _l = lock();
    let s = stream();
    for (i, (rows, vocab, ignored)) in [
        (5, 37, Ignored::Some),
        (3, 64, Ignored::All),
        (1, 1, Ignored::Some),
    ]
    .into_iter()
    .enumerate()
    {
        let seed = 10 * i as u64;
        divisor_over_micro_batches::<f32>(&s, rows, vocab, seed, ignored);
        divisor_over_micro_batches::<f16>(&s, rows, vocab, seed + 1, ignored);
        divisor_over_micro_batches::<bf16>(&s, rows, vocab, seed + 2, ignored);
    }
}

/// One configuration of [`linear_case`].
#[derive(Clone, Copy, Debug)]
struct Linear {
    rows: usize,
    dim: usize,
    vocab: usize,
    chunk_rows: Option<usize>,
    dloss: Option<f32>,
    divisor: Option<f32>,
    dweight: bool,
    ignored: Ignored,
    /// Element offset of `h` and `dh` in their allocations (1: misaligned views).
    off: usize,
}

/// `linear_crossentropy` on the device against the CPU reference, with the case tolerance.
fn linear_case<T: DeviceElement>(s: &Stream, c: Linear, seed: u64) {
    let mut rng = Rng(seed);
    let h: Vec<T> = rng.vec(c.rows * c.dim, 1.0);
    let w: Vec<T> = rng.vec(c.vocab * c.dim, 2.0 / (c.dim as f64).sqrt());
    let dw0: Vec<T> = rng.vec(c.vocab * c.dim, 1.0);
    let tgt = targets(&mut rng, c.rows, c.vocab, c.ignored);
    let p = LinearCrossEntropyParams {
        rows: c.rows,
        dim: c.dim,
        vocab: c.vocab,
        chunk_rows: c.chunk_rows,
        dloss: c.dloss,
        divisor: c.divisor,
    };
    let grad = c.dloss.is_some();
    let (mut want_dh, mut want_dw) = (vec![T::from_f64(0.0); c.rows * c.dim], dw0.clone());
    let (mut want_losses, mut want_loss, mut want_totals) = (vec![0f32; c.rows], [0f32], [0f32; 2]);
    cpu::linear_cross_entropy(LinearCrossEntropy::<Host, T> {
        params: p,
        h: &h,
        weight: &w,
        targets: &tgt,
        dh: grad.then_some(&mut want_dh[..]),
        dweight: (grad && c.dweight).then_some(&mut want_dw[..]),
        losses: &mut want_losses,
        loss: Some(&mut want_loss),
        totals: Some(&mut want_totals),
        error: None,
    })
    .unwrap();
    let dh_h = Shifted::new(s, &h, c.off);
    let dwt = device_common::upload(s, &w);
    let mut dh = Shifted::new(s, &vec![T::from_f64(7.0); c.rows * c.dim], c.off);
    let mut dw = device_common::upload(s, &dw0);
    let dt = up_i32(s, &tgt);
    let mut losses = DeviceBuffer::<f32>::zeroed(s, c.rows).unwrap();
    let mut loss = DeviceBuffer::<f32>::zeroed(s, 1).unwrap();
    let mut totals = DeviceBuffer::<f32>::zeroed(s, 2).unwrap();
    let mut err = DeviceBuffer::<u32>::zeroed(s, 1).unwrap();
    {
        let hv = dh_h.view();
        let mut dhv = dh.view_mut();
        ops::linear_cross_entropy(
            s,
            LinearCrossEntropy {
                params: p,
                h: &hv,
                weight: &dwt,
                targets: &dt,
                dh: if grad { Some(&mut dhv) } else { None },
                dweight: if grad && c.dweight {
                    Some(&mut dw)
                } else {
                    None
                },
                losses: &mut losses,
                loss: Some(&mut loss),
                totals: Some(&mut totals),
                error: Some(&mut err),
            },
        )
        .unwrap();
    }
    assert_eq!(err.to_vec(s).unwrap()[0], u32::MAX, "{c:?}");
    // The case's tolerance (the golden glue's bounds: largest logit, |h|, |W|, the scale).
    let case = LinearCrossEntropyCase {
        params: p,
        h: TensorData::from_slice(&h),
        weight: TensorData::from_slice(&w),
        targets: tgt.clone(),
        dweight: None,
        totals: None,
    };
    let tol = |what| case.tolerance(what, T::DTYPE);
    let tol32 = |what| case.tolerance(what, hip_kernels::params::DType::F32);
    let what = |n: &str| format!("{n} {c:?} {}", T::DTYPE);
    assert_close_with(
        &what("losses"),
        tol32("losses"),
        &download(s, &losses),
        &want_losses,
    );
    assert_close_with(
        &what("loss"),
        tol32("loss"),
        &download(s, &loss),
        &want_loss,
    );
    assert_close_with(
        &what("totals"),
        tol32("totals"),
        &download(s, &totals),
        &want_totals,
    );
    if grad {
        assert_close_with(&what("dh"), tol("dh"), &dh.get(s), &want_dh);
    } else {
        let untouched = dh.get(s).iter().all(|x| x.to_f64() == 7.0);
        assert!(untouched, "forward only wrote dh: {c:?}");
    }
    if grad && c.dweight {
        assert_close_with(
            &what("dweight"),
            tol("dweight"),
            &download(s, &dw),
            &want_dw,
        );
    } else {
        assert!(
            device_common::bits(&download(s, &dw)) == device_common::bits(&dw0),
            "dW written: {c:?}"
        );
    }
    if c.ignored == Ignored::All {
        assert!(want_losses.iter().all(|&l| l == 0.0));
        if grad {
            assert!(
                dh.get(s).iter().all(|x| x.to_f64() == 0.0),
                "all ignored: dh = 0"
            );
        }
    }
}

const LINEAR: Linear = Linear {
    rows: 7,
    dim: 9,
    vocab: 37,
    chunk_rows: Some(3),
    dloss: Some(1.0),
    divisor: None,
    dweight: true,
    ignored: Ignored::Some,
    off: 0,
};

fn linear_configs() -> Vec<Linear> {
    vec![
        // Chunks of 3 over 7 rows (an edge chunk of 1), odd V: unaligned logits rows.
        LINEAR,
        // One chunk (the default), aligned V, a divisor and dloss ≠ 1, misaligned h / dh.
        Linear {
            rows: 10,
            dim: 16,
            vocab: 64,
            chunk_rows: None,
            dloss: Some(0.5),
            divisor: Some(20.0),
            off: 1,
            ..LINEAR
        },
        // One row per chunk, frozen head (no dW).
        Linear {
            rows: 4,
            dim: 5,
            vocab: 129,
            chunk_rows: Some(1),
            dweight: false,
            ..LINEAR
        },
        // Every row ignored: loss NaN, dh 0, dW unchanged.
        Linear {
            rows: 5,
            chunk_rows: Some(2),
            ignored: Ignored::All,
            ..LINEAR
        },
        // Forward only: losses, no gradient written.
        Linear {
            dloss: None,
            dweight: false,
            off: 1,
            ..LINEAR
        },
        // More rows than fit one tile of the matmul; chunk not a multiple of 64.
        Linear {
            rows: 70,
            dim: 24,
            vocab: 200,
            chunk_rows: Some(33),
            ..LINEAR
        },
    ]
}

#[test]
fn linear_crossentropy_matches_the_reference_every_dtype() {
    let _l = lock();
    let s = stream();
    for (i, c) in linear_configs().into_iter().enumerate() {
        let seed = 100 + 10 * i as u64;
        linear_case::<f32>(&s, c, seed);
        linear_case::<f16>(&s, c, seed + 1);
        linear_case::<bf16>(&s, c, seed + 2);
    }
}

#[test]
fn a_bad_target_in_a_later_chunk_flags_its_row_in_the_whole_call() {
    let _l = lock();
    let s = stream();
    let p = LinearCrossEntropyParams {
        chunk_rows: Some(2),
        ..LinearCrossEntropyParams::new(5, 4, 6)
    };
    let h = device_common::upload(&s, &[0.5f32; 20]);
    let w = device_common::upload(&s, &[0.25f32; 24]);
    let t = up_i32(&s, &[0, 1, 2, 9, 6]);
    let mut dh = DeviceBuffer::<f32>::zeroed(&s, 20).unwrap();
    let mut losses = DeviceBuffer::<f32>::zeroed(&s, 5).unwrap();
    let mut err = DeviceBuffer::<u32>::zeroed(&s, 1).unwrap();
    ops::linear_cross_entropy(
        &s,
        LinearCrossEntropy {
            params: p,
            h: &h,
            weight: &w,
            targets: &t,
            dh: Some(&mut dh),
            dweight: None,
            losses: &mut losses,
            loss: None,
            totals: None,
            error: Some(&mut err),
        },
    )
    .unwrap();
    // Rows 3 (chunk 1) and 4 (chunk 2) are out of range: the first is row 3 of the call.
    assert_eq!(err.to_vec(&s).unwrap()[0], 3);
    let l = download(&s, &losses);
    assert!(
        l[3].is_nan() && l[4].is_nan() && l[..3].iter().all(|x| x.is_finite()),
        "{l:?}"
    );
}

/// Bytes the allocator was asked for at its peak while `f` ran, above what was live before
/// (`memory_stats().requested_bytes`, exact, before the allocator's rounding).
fn peak_requested(s: &Stream, f: impl FnOnce()) -> u64 {
    s.synchronize().unwrap();
    let dev = s.device();
    dev.reset_peak_memory_stats().unwrap();
    let before = dev.memory_stats().unwrap().requested_bytes.all().current;
    f();
    s.synchronize().unwrap();
    let stats = dev.memory_stats().unwrap();
    assert_eq!(
        stats.requested_bytes.all().current,
        before,
        "the op leaked scratch"
    );
    stats.requested_bytes.all().peak - before
}

/// The plain path of the same loss: matmul to `[N, V]` logits, the fused cross-entropy in place,
/// then the two backward GEMMs.
fn plain_path(s: &Stream, n: usize, c: usize, v: usize, bufs: &mut Bufs) {
    let mut logits = DeviceBuffer::<bf16>::alloc(s, n * v).unwrap();
    let mm = |params,
              a: &dyn hip_rt::DeviceView<bf16>,
              b: &dyn hip_rt::DeviceView<bf16>,
              out: &mut dyn hip_rt::DeviceViewMut<bf16>| {
        ops::matmul(s, Matmul { params, a, b, out }).unwrap()
    };
    mm(
        MatmulParams {
            trans_b: true,
            ..MatmulParams::new(n, v, c)
        },
        &bufs.h,
        &bufs.w,
        &mut logits,
    );
    ops::softmax_cross_entropy(
        s,
        SoftmaxCrossEntropy {
            params: CrossEntropyParams::new(n, v),
            logits: &mut logits,
            targets: &bufs.t,
            losses: &mut bufs.losses,
            loss: None,
            totals: None,
            error: None,
        },
    )
    .unwrap();
    mm(MatmulParams::new(n, c, v), &logits, &bufs.w, &mut bufs.dh);
    mm(
        MatmulParams {
            trans_a: true,
            beta: 1.0,
            ..MatmulParams::new(v, c, n)
        },
        &logits,
        &bufs.h,
        &mut bufs.dw,
    );
}

struct Bufs {
    h: DeviceBuffer<bf16>,
    w: DeviceBuffer<bf16>,
    t: DeviceBuffer<i32>,
    dh: DeviceBuffer<bf16>,
    dw: DeviceBuffer<bf16>,
    losses: DeviceBuffer<f32>,
}

#[test]
fn the_fused_peak_is_its_plan_and_a_fraction_of_the_plain_paths() {
    let _l = lock();
    let s = stream();
    // A size hip-emu runs in seconds, chunks of 32 rows (the allocation pattern of any size).
    let (n, c, v, chunk) = (96, 32, 500, 32);
    let mut rng = Rng(7);
    let mut bufs = Bufs {
        h: device_common::upload(&s, &rng.vec::<bf16>(n * c, 1.0)),
        w: device_common::upload(&s, &rng.vec::<bf16>(v * c, 0.3)),
        t: up_i32(&s, &targets(&mut rng, n, v, Ignored::Some)),
        dh: DeviceBuffer::zeroed(&s, n * c).unwrap(),
        dw: DeviceBuffer::zeroed(&s, v * c).unwrap(),
        losses: DeviceBuffer::zeroed(&s, n).unwrap(),
    };
    let plain = peak_requested(&s, || plain_path(&s, n, c, v, &mut bufs));
    let p = LinearCrossEntropyParams {
        chunk_rows: Some(chunk),
        ..LinearCrossEntropyParams::new(n, c, v)
    };
    let fused = peak_requested(&s, || {
        ops::linear_cross_entropy(
            &s,
            LinearCrossEntropy {
                params: p,
                h: &bufs.h,
                weight: &bufs.w,
                targets: &bufs.t,
                dh: Some(&mut bufs.dh),
                dweight: Some(&mut bufs.dw),
                losses: &mut bufs.losses,
                loss: None,
                totals: None,
                error: None,
            },
        )
        .unwrap()
    });
    // Measured: the plain path holds the [N, V] logits and the 4-byte count, nothing else; the
    // fused one exactly its plan's scratch (one [chunk, V] buffer and the count).
    let plan = LinearCrossEntropyPlan::new(&p, 2).unwrap();
    assert_eq!(plain, (n * v * 2 + 4) as u64);
    assert_eq!(fused, plan.scratch_bytes as u64);
    println!("measured on hip-emu, N = {n}, C = {c}, V = {v}, bf16, chunks of {chunk} rows: plain {plain} B, fused {fused} B");
    // The size from the same (now checked) accounting: N = 4096, C = 896, V = 151936,
    // bf16, default chunks.
    let (n, v) = (4096usize, 151_936usize);
    let big = LinearCrossEntropyPlan::new(&LinearCrossEntropyParams::new(n, 896, v), 2).unwrap();
    let plain = n * v * 2 + 4;
    println!(
        "N = {n}, C = 896, V = {v}, bf16: plain {plain} B, fused {} B ({} rows per chunk), ratio {:.1}",
        big.scratch_bytes,
        big.chunk_rows,
        plain as f64 / big.scratch_bytes as f64
    );
    assert_eq!((plain, big.scratch_bytes), (1_244_659_716, 58_343_428));
    assert!(big.scratch_bytes * 8 <= plain);
}

#[test]
fn golden_linear_crossentropy_cases_pass_on_the_device() {
    let _l = lock();
    // The `crossentropy` cases (with the divisor ones) run in tests/device_trainops.rs.
    device_common::run_golden_cases(|op| op == "linear_crossentropy", "linear_crossentropy");
}
