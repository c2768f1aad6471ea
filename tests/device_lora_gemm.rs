//! Device tests of the LoRA adapter's skinny GEMMs (`kernels/lora_gemm.hip`) against the CPU
//! reference: every dtype and rank class, partial row and column blocks, the backward's row
//! groups (split and not), accumulate on and off, the GEMM path, the tuner's `hipk-skinny`
//! candidate on the three product forms, the launches of one target's forward and backward
//! (hip-emu's counters), and the golden cases. Needs `--features device` and a HIP device (a
//! DCU, or hip-emu). Run on hip-emu, never on a GPU.
#![cfg(feature = "device")]

mod device_common;

use device_common::{assert_close, download, run_golden_cases, stream, upload, Rng};
use hip_kernels::cpu;
use hip_kernels::ops::lora_gemm::plan::GradwPlan;
use hip_kernels::ops::{
    self, DeviceElement, GemmTuner, GemmTuningMode, LoraBackward, LoraForward, LoraKernel,
    LoraParams, Matmul, MatmulParams, TuningConfig,
};
use hip_kernels::params::{bf16, f16, Host, OnDevice};
use hip_kernels::tolerance::Rule;
use hip_rt::{DeviceBuffer, Stream};

#[test]
fn golden_lora_cases_pass_on_the_device() {
    run_golden_cases(|op| matches!(op, "lora_forward" | "lora_backward"), "LoRA");
}

struct Target<T> {
    x: Vec<T>,
    a: Vec<T>,
    b: Vec<T>,
    y: Vec<T>,
    dy: Vec<T>,
    da: Vec<T>,
    db: Vec<T>,
    dx: Vec<T>,
}

fn target<T: DeviceElement>(p: &LoraParams, seed: u64) -> Target<T> {
    let mut rng = Rng(seed);
    let (n, i, o, r) = (p.rows, p.d_in, p.d_out, p.rank);
    Target {
        x: rng.vec(n * i, 1.0),
        a: rng.vec(r * i, 1.0),
        b: rng.vec(o * r, 1.0),
        y: rng.vec(n * p.row_stride(), 1.0),
        dy: rng.vec(n * p.row_stride(), 1.0),
        da: rng.vec(r * i, 1.0),
        db: rng.vec(o * r, 1.0),
        dx: rng.vec(n * i, 1.0),
    }
}

/// Forward and backward of one target on `kernel` against the reference.
fn lora_case<T: DeviceElement>(s: &Stream, p: LoraParams, kernel: LoraKernel, seed: u64) {
    lora_case_at::<T>(s, p, kernel, seed, 0)
}

/// [`lora_case`] with `y` and `dy` the column block from column `off` of `[rows, ldy]`
/// tensors (`p.ldy`): the columns outside it must come back untouched.
fn lora_case_at<T: DeviceElement>(
    s: &Stream,
    p: LoraParams,
    kernel: LoraKernel,
    seed: u64,
    off: usize,
) {
    let t = target::<T>(&p, seed);
    let what = format!("{} {p:?} {kernel:?} from column {off}", T::DTYPE);
    let (n, r) = (p.rows, p.rank);
    // Forward.
    let (mut u, mut y) = (vec![T::from_f64(0.0); n * r], t.y.clone());
    cpu::lora_forward(LoraForward::<Host, T> {
        params: p,
        x: &t.x,
        a: &t.a,
        b: &t.b,
        u: &mut u,
        y: &mut y[off..],
    })
    .unwrap();
    let (dx_, da_, db_) = (upload(s, &t.x), upload(s, &t.a), upload(s, &t.b));
    let mut du_ = DeviceBuffer::<T>::zeroed(s, n * r).unwrap();
    let mut dy_ = upload(s, &t.y);
    ops::lora_forward_with(
        s,
        LoraForward {
            params: p,
            x: &dx_,
            a: &da_,
            b: &db_,
            u: &mut du_,
            y: &mut dy_.slice_mut(off..).unwrap(),
        },
        kernel,
    )
    .unwrap();
    let dt = T::DTYPE;
    assert_close(
        &format!("u {what}"),
        Rule::Reduction,
        dt,
        p.d_in,
        &download(s, &du_),
        &u,
    );
    assert_close(
        &format!("y {what}"),
        Rule::Reduction,
        dt,
        r + 1,
        &download(s, &dy_),
        &y,
    );
    // Backward from the reference's u (so both sides start from the same rounded values).
    let mut g = (
        vec![T::from_f64(0.0); n * r],
        t.da.clone(),
        t.db.clone(),
        t.dx.clone(),
    );
    cpu::lora_backward(LoraBackward::<Host, T> {
        params: p,
        x: &t.x,
        dy: &t.dy[off..],
        a: &t.a,
        b: &t.b,
        u: &u,
        du: &mut g.0,
        da: &mut g.1,
        db: &mut g.2,
        dx: &mut g.3,
    })
    .unwrap();
    let (ddy, du_in) = (upload(s, &t.dy), upload(s, &u));
    let mut ddu = DeviceBuffer::<T>::zeroed(s, n * r).unwrap();
    let (mut dda, mut ddb, mut ddx) = (upload(s, &t.da), upload(s, &t.db), upload(s, &t.dx));
    ops::lora_backward_with(
        s,
        LoraBackward {
            params: p,
            x: &dx_,
            dy: &ddy.slice(off..).unwrap(),
            a: &da_,
            b: &db_,
            u: &du_in,
            du: &mut ddu,
            da: &mut dda,
            db: &mut ddb,
            dx: &mut ddx,
        },
        kernel,
    )
    .unwrap();
    assert_close(
        &format!("du {what}"),
        Rule::Reduction,
        dt,
        p.d_out,
        &download(s, &ddu),
        &g.0,
    );
    // da and dx sum du, itself an f32 reduction over d_out that each side rounds to T: the
    // chain's length is d_out plus their own.
    assert_close(
        &format!("da {what}"),
        Rule::Reduction,
        dt,
        p.d_out + n + 1,
        &download(s, &dda),
        &g.1,
    );
    assert_close(
        &format!("db {what}"),
        Rule::Reduction,
        dt,
        n + 1,
        &download(s, &ddb),
        &g.2,
    );
    assert_close(
        &format!("dx {what}"),
        Rule::Reduction,
        dt,
        p.d_out + r + 1,
        &download(s, &ddx),
        &g.3,
    );
}

#[test]
fn every_rank_class_and_dtype_matches_the_reference() {
    let s = stream();
    // (rows, d_in, d_out, rank): partial blocks, two column blocks, two row blocks of
    // lora_down, rank classes 8/16/32/64.
    for (k, &(n, i, o, r)) in [
        (1, 1, 1, 1),
        (37, 19, 23, 4),
        (3, 10, 300, 8),
        (257, 5, 4, 13),
        (9, 33, 17, 32),
        (5, 40, 7, 64),
    ]
    .iter()
    .enumerate()
    {
        let p = LoraParams::new(n, i, o, r, 0.5);
        let seed = 100 + k as u64;
        lora_case::<f32>(&s, p, LoraKernel::Skinny, seed);
        lora_case::<f16>(&s, p.accumulating(), LoraKernel::Skinny, seed);
        lora_case::<bf16>(&s, p, LoraKernel::Skinny, seed);
    }
}

/// A target's output block inside a wider stacked tensor (LLaMA's q/k/v, GLM's fused
/// projections): `y` written and `dy` read in place through `ldy`, on the skinny kernels (both
/// row plans) and the GEMM.
#[test]
fn strided_output_blocks_match_the_reference_in_place() {
    let s = stream();
    // (rows, d_in, d_out, rank, ldy, first column): the k block of a [N, q + k + v] tensor,
    // a block ending at the row's end, a wide block over two column blocks, long rows that
    // split the row reduction.
    for (k, &(n, i, o, r, ld, off)) in [
        (37, 19, 8, 4, 24, 8),
        (9, 33, 17, 32, 40, 23),
        (5, 40, 300, 8, 600, 150),
        (1100, 6, 5, 4, 15, 5),
    ]
    .iter()
    .enumerate()
    {
        let p = LoraParams::new(n, i, o, r, 0.5).strided(ld);
        let seed = 200 + k as u64;
        lora_case_at::<f32>(&s, p, LoraKernel::Skinny, seed, off);
        lora_case_at::<f16>(&s, p.accumulating(), LoraKernel::Skinny, seed, off);
        lora_case_at::<bf16>(&s, p, LoraKernel::Gemm, seed, off);
    }
}

#[test]
fn long_rows_split_into_groups_and_the_gemm_path_agrees() {
    let s = stream();
    let p = LoraParams::new(1100, 6, 5, 4, 1.25);
    let cus = s.device().compute_units();
    // Both storage sizes split these rows (the test is about the split path).
    assert!(GradwPlan::new(p.rows, 6, 4, 2, cus).groups > 1);
    assert!(GradwPlan::new(p.rows, 6, 4, 4, cus).groups > 1);
    lora_case::<f32>(&s, p, LoraKernel::Skinny, 7);
    lora_case::<f16>(&s, p.accumulating(), LoraKernel::Skinny, 8);
    lora_case::<f32>(&s, p, LoraKernel::Gemm, 9);
    lora_case::<bf16>(&s, LoraParams { rank: 80, ..p }, LoraKernel::Auto, 10);
    lora_case::<f32>(&s, LoraParams { rows: 0, ..p }, LoraKernel::Skinny, 11);
}

#[test]
fn the_split_is_bit_identical_run_to_run() {
    let s = stream();
    let p = LoraParams::new(900, 3, 7, 5, 0.5);
    let t = target::<f32>(&p, 3);
    let run = || {
        let (x, dy, a, b) = (
            upload(&s, &t.x),
            upload(&s, &t.dy),
            upload(&s, &t.a),
            upload(&s, &t.b),
        );
        let u = upload(&s, &Rng(4).vec::<f32>(p.rows * p.rank, 1.0));
        let mut du = DeviceBuffer::<f32>::zeroed(&s, p.rows * p.rank).unwrap();
        let (mut da, mut db, mut dx) = (upload(&s, &t.da), upload(&s, &t.db), upload(&s, &t.dx));
        ops::lora_backward(
            &s,
            LoraBackward {
                params: p,
                x: &x,
                dy: &dy,
                a: &a,
                b: &b,
                u: &u,
                du: &mut du,
                da: &mut da,
                db: &mut db,
                dx: &mut dx,
            },
        )
        .unwrap();
        (download(&s, &da), download(&s, &db))
    };
    let first = run();
    assert_eq!(first, run());
}

#[test]
fn one_target_takes_2_launches_forward_and_at_most_4_backward() {
    let s = stream();
    let Some(_) = hip_rt::emu::stats(hip_rt::emu::StatsScope::Thread) else {
        eprintln!("not hip-emu: no launch counters, skipped");
        return;
    };
    for (rows, expect_bwd) in [(64, 3), (2048, 4)] {
        let p = LoraParams::new(rows, 48, 40, 8, 2.0);
        let cus = s.device().compute_units();
        let split = GradwPlan::new(rows, 48, 8, 4, cus).groups > 1;
        assert_eq!(
            split,
            expect_bwd == 4,
            "rows {rows}: the plan this case is about"
        );
        let t = target::<f32>(&p, 5);
        let (x, a, b, dy) = (
            upload(&s, &t.x),
            upload(&s, &t.a),
            upload(&s, &t.b),
            upload(&s, &t.dy),
        );
        let mut u = DeviceBuffer::<f32>::zeroed(&s, rows * 8).unwrap();
        let mut du = DeviceBuffer::<f32>::zeroed(&s, rows * 8).unwrap();
        let (mut y, mut da, mut db, mut dx) = (
            upload(&s, &t.y),
            upload(&s, &t.da),
            upload(&s, &t.db),
            upload(&s, &t.dx),
        );
        let count = |f: &mut dyn FnMut()| {
            let before = hip_rt::emu::stats(hip_rt::emu::StatsScope::Thread).unwrap();
            f();
            let after = hip_rt::emu::stats(hip_rt::emu::StatsScope::Thread).unwrap();
            after.since(&before).launches
        };
        let fwd = count(&mut || {
            ops::lora_forward(
                &s,
                LoraForward {
                    params: p,
                    x: &x,
                    a: &a,
                    b: &b,
                    u: &mut u,
                    y: &mut y,
                },
            )
            .unwrap()
        });
        let bwd = count(&mut || {
            ops::lora_backward(
                &s,
                LoraBackward {
                    params: p,
                    x: &x,
                    dy: &dy,
                    a: &a,
                    b: &b,
                    u: &u,
                    du: &mut du,
                    da: &mut da,
                    db: &mut db,
                    dx: &mut dx,
                },
            )
            .unwrap()
        });
        eprintln!("rows {rows}: forward {fwd} launches, backward {bwd} (counted by hip-emu)");
        assert_eq!((fwd, bwd), (2, expect_bwd), "rows {rows}");
        // The GEMM path (what the trainer ran before it took these ops): one launch per
        // product at these shapes.
        let gemm = count(&mut || {
            ops::lora_forward_with(
                &s,
                LoraForward {
                    params: p,
                    x: &x,
                    a: &a,
                    b: &b,
                    u: &mut u,
                    y: &mut y,
                },
                LoraKernel::Gemm,
            )
            .unwrap()
        });
        let gemm_bwd = count(&mut || {
            ops::lora_backward_with(
                &s,
                LoraBackward {
                    params: p,
                    x: &x,
                    dy: &dy,
                    a: &a,
                    b: &b,
                    u: &u,
                    du: &mut du,
                    da: &mut da,
                    db: &mut db,
                    dx: &mut dx,
                },
                LoraKernel::Gemm,
            )
            .unwrap()
        });
        eprintln!("rows {rows}: GEMM path forward {gemm} launches, backward {gemm_bwd}");
        assert!(gemm >= 2 && gemm_bwd >= 4, "{gemm} {gemm_bwd}");
    }
}

/// The three product forms through the tuner, with `hipk-skinny` among the candidates: each
/// result matches the reference whichever candidate wins.
#[test]
fn the_tuner_runs_the_skinny_candidate_on_the_three_forms() {
    let s = stream();
    let dir = std::env::temp_dir().join(format!("hipk-lora-tune-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("tuning.txt");
    let tuner = GemmTuner::new(TuningConfig::new(GemmTuningMode::Tune, &file)).unwrap();
    let mm = |m, n, k, ta, tb, beta| MatmulParams {
        trans_a: ta,
        trans_b: tb,
        beta,
        alpha: 0.75,
        ..MatmulParams::new(m, n, k)
    };
    for (k, shape) in [
        mm(70, 8, 33, false, true, 0.0),  // u = x·Aᵀ
        mm(70, 40, 8, false, true, 1.0),  // y += s·u·Bᵀ
        mm(40, 8, 700, true, false, 1.0), // dB += s·dyᵀ·u
        mm(8, 33, 700, true, false, 0.0), // dA = duᵀ·x
    ]
    .into_iter()
    .enumerate()
    {
        let mut rng = Rng(40 + k as u64);
        let a = rng.vec::<f32>(shape.a_len().unwrap(), 1.0);
        let b = rng.vec::<f32>(shape.b_len().unwrap(), 1.0);
        let c = rng.vec::<f32>(shape.out_len().unwrap(), 1.0);
        let mut want = c.clone();
        cpu::matmul(Matmul::<Host, f32> {
            params: shape,
            a: &a,
            b: &b,
            out: &mut want,
        })
        .unwrap();
        let (da, db, mut dc) = (upload(&s, &a), upload(&s, &b), upload(&s, &c));
        let args = Matmul::<OnDevice, f32> {
            params: shape,
            a: &da,
            b: &db,
            out: &mut dc,
        };
        tuner.matmul(&s, args).unwrap();
        assert_close(
            "out",
            Rule::Reduction,
            hip_kernels::params::DType::F32,
            shape.k,
            &download(&s, &dc),
            &want,
        );
    }
    let text = std::fs::read_to_string(&file).unwrap();
    assert_eq!(text.matches("hipk-skinny=").count(), 4, "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}
