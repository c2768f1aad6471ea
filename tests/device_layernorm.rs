//! Device tests of the layernorm kernels against the CPU reference (`--features device`; needs a
//! HIP device and kernels built for its arch). Run on hip-emu (the CPU-emulated device), never on
//! a GPU.
//!
//! - random shapes: C ∈ {1, 3, 4, 768, 1024, 1025, 4095, 4096, 4100, 5001, 6000, 8192, 20000}
//!   (4100, 6000, 8192: the wide backward; 5001: its streamed fallback), rows ∈ {1, 7, 129},
//!   every dtype; the fused residual + layernorm forward on odd, cached, wide and misaligned
//!   rows, every dtype; the backward accumulating into its outputs;
//! - C = 8190 (wide range, C % 4 != 0: the streamed backward); misaligned views (the scalar
//!   layout and the wide backward's fallback); more rows than the grid holds (grid-stride);
//!   zero rows; launchers that validate before launching;
//! - the layernorm golden cases through the library's `DeviceBackend`.

#![cfg(feature = "device")]

use hip_kernels::cpu;
use hip_kernels::ops::{
    self, DeviceElement, LayerNormBackward, LayerNormForward, LayerNormParams, OpError,
    ResidualLayerNormForward,
};
use hip_kernels::params::{bf16, f16, Host, OnDevice};
use hip_kernels::tolerance::{layernorm_dx_tolerance, Rule};
use hip_rt::Stream;

mod device_common;

use device_common::*;

// ---------------------------------------------------------------------------------------------
// Layer norm
// ---------------------------------------------------------------------------------------------

/// Forward on views `off` elements into their allocations (see [`Shifted`]).
fn ln_forward_views<T: DeviceElement>(
    s: &Stream,
    shape: &LayerNormParams,
    x: &[T],
    w: &[T],
    b: &[T],
    off: usize,
) -> LnFwd<T> {
    let (dx, dw, db) = (
        Shifted::new(s, x, off),
        Shifted::new(s, w, off),
        Shifted::new(s, b, off),
    );
    let mut y = Shifted::new(s, x, off);
    let mut mean = Shifted::new(s, &vec![0f32; shape.rows], off);
    let mut rstd = Shifted::new(s, &vec![0f32; shape.rows], off);
    ops::layernorm_forward(
        s,
        LayerNormForward::<OnDevice, T> {
            params: *shape,
            x: &dx.view(),
            weight: &dw.view(),
            bias: &db.view(),
            y: &mut y.view_mut(),
            mean: &mut mean.view_mut(),
            rstd: &mut rstd.view_mut(),
        },
    )
    .expect("forward on views");
    LnFwd {
        y: y.get(s),
        mean: mean.get(s),
        rstd: rstd.get(s),
    }
}

/// Backward on views `off` elements into their allocations.
#[allow(clippy::too_many_arguments)]
fn ln_backward_views<T: DeviceElement>(
    s: &Stream,
    shape: &LayerNormParams,
    x: &[T],
    w: &[T],
    dy: &[T],
    mean: &[f32],
    rstd: &[f32],
    off: usize,
) -> Grads<T> {
    let (dx_in, dw_in, ddy) = (
        Shifted::new(s, x, off),
        Shifted::new(s, w, off),
        Shifted::new(s, dy, off),
    );
    let (dmean, drstd) = (Shifted::new(s, mean, off), Shifted::new(s, rstd, off));
    let (mut dx, mut dw, mut db) = (
        Shifted::new(s, x, off),
        Shifted::new(s, w, off),
        Shifted::new(s, w, off),
    );
    ops::layernorm_backward(
        s,
        LayerNormBackward::<OnDevice, T> {
            params: *shape,
            x: &dx_in.view(),
            weight: &dw_in.view(),
            dy: &ddy.view(),
            mean: &dmean.view(),
            rstd: &drstd.view(),
            dx: &mut dx.view_mut(),
            dweight: &mut dw.view_mut(),
            dbias: &mut db.view_mut(),
            accumulate: false,
        },
    )
    .expect("backward on views");
    (dx.get(s), dw.get(s), db.get(s))
}

/// Forward and backward against the reference; `off` = 0 runs through the golden-case path
/// (fresh, aligned buffers), `off` > 0 on views that far into their allocations.
fn layernorm_random<T: DeviceElement>(s: &Stream, rows: usize, cols: usize, seed: u64) {
    layernorm_random_at::<T>(s, rows, cols, seed, 0)
}

fn layernorm_random_at<T: DeviceElement>(
    s: &Stream,
    rows: usize,
    cols: usize,
    seed: u64,
    off: usize,
) {
    let shape = LayerNormParams {
        rows,
        cols,
        eps: 1e-5,
    };
    let n = rows * cols;
    let mut rng = Rng(seed);
    let (x, w, b, dy) = (
        rng.vec::<T>(n, 1.0),
        rng.vec::<T>(cols, 1.0),
        rng.vec::<T>(cols, 1.0),
        rng.vec::<T>(n, 1.0),
    );
    let dt = T::DTYPE;
    let got = if off == 0 {
        ln_forward_device(s, &shape, &x, &w, &b).expect("forward")
    } else {
        ln_forward_views(s, &shape, &x, &w, &b, off)
    };
    let (mut y, mut mean, mut rstd) = (x.clone(), vec![0f32; rows], vec![0f32; rows]);
    cpu::layernorm_forward(LayerNormForward::<Host, T> {
        params: shape,
        x: &x,
        weight: &w,
        bias: &b,
        y: &mut y,
        mean: &mut mean,
        rstd: &mut rstd,
    })
    .expect("cpu forward");
    assert_close("y", Rule::Reduction, dt, cols, &got.y, &y);
    assert_close("mean", Rule::Reduction, dt, cols, &got.mean, &mean);
    assert_close("rstd", Rule::Reduction, dt, cols, &got.rstd, &rstd);

    let backward = || {
        if off == 0 {
            ln_backward_device(s, &shape, &x, &w, &dy, &mean, &rstd).expect("backward")
        } else {
            ln_backward_views(s, &shape, &x, &w, &dy, &mean, &rstd, off)
        }
    };
    let got = backward();
    let (mut dx, mut dw, mut db) = (x.clone(), w.clone(), w.clone());
    cpu::layernorm_backward(LayerNormBackward::<Host, T> {
        params: shape,
        x: &x,
        weight: &w,
        dy: &dy,
        mean: &mean,
        rstd: &rstd,
        dx: &mut dx,
        dweight: &mut dw,
        dbias: &mut db,
        accumulate: false,
    })
    .expect("cpu backward");
    // dx is rstd times an f32 bracket: its tolerance grows with each row's rstd (tolerance.rs).
    for (r, &rs) in rstd.iter().enumerate() {
        let tol = layernorm_dx_tolerance(dt, cols, f64::from(rs));
        let span = r * cols..(r + 1) * cols;
        assert_close_with(&format!("dx row {r}"), tol, &got.0[span.clone()], &dx[span]);
    }
    assert_close("dweight", Rule::Reduction, dt, rows, &got.1, &dw);
    assert_close("dbias", Rule::Reduction, dt, rows, &got.2, &db);
    let again = backward();
    assert_eq!(
        (bits(&again.0), bits(&again.1), bits(&again.2)),
        (bits(&got.0), bits(&got.1), bits(&got.2)),
        "backward is not deterministic ({rows}×{cols})"
    );
}

#[test]
fn layernorm_matches_the_reference_on_random_shapes_every_dtype() {
    let s = stream();
    for (i, &cols) in [
        1usize, 3, 4, 768, 1024, 1025, 4095, 4096, 4100, 5001, 6000, 8192, 20000,
    ]
    .iter()
    .enumerate()
    {
        for (j, &rows) in [1usize, 7, 129].iter().enumerate() {
            let seed = 1 + (i * 10 + j) as u64;
            layernorm_random::<f32>(&s, rows, cols, seed);
            layernorm_random::<f16>(&s, rows, cols, seed);
            layernorm_random::<bf16>(&s, rows, cols, seed);
        }
    }
}

/// Two accumulating backward calls (two micro-batches' `dy` over the same saved statistics) into
/// non-zero `dx`, `dweight`, `dbias` on the device, against the CPU reference doing the same; and
/// one accumulating call into zeros equals the overwriting call.
fn layernorm_accumulate<T: DeviceElement>(s: &Stream, rows: usize, cols: usize, seed: u64) {
    let shape = LayerNormParams {
        rows,
        cols,
        eps: 1e-5,
    };
    let n = rows * cols;
    let mut rng = Rng(seed);
    let (x, w) = (rng.vec::<T>(n, 1.0), rng.vec::<T>(cols, 1.0));
    let dys = [rng.vec::<T>(n, 1.0), rng.vec::<T>(n, 1.0)];
    let (dx0, dw0, db0) = (
        rng.vec::<T>(n, 1.0),
        rng.vec::<T>(cols, 1.0),
        rng.vec::<T>(cols, 1.0),
    );
    let (mut y, mut mean, mut rstd) = (x.clone(), vec![0f32; rows], vec![0f32; rows]);
    cpu::layernorm_forward(LayerNormForward::<Host, T> {
        params: shape,
        x: &x,
        weight: &w,
        bias: &w,
        y: &mut y,
        mean: &mut mean,
        rstd: &mut rstd,
    })
    .expect("cpu forward");
    let (bx, bw, bm, br) = (
        upload(s, &x),
        upload(s, &w),
        upload(s, &mean),
        upload(s, &rstd),
    );
    let device = |dy: &[&[T]], init: (&[T], &[T], &[T]), accumulate: bool| {
        let (mut dx, mut dw, mut db) = (upload(s, init.0), upload(s, init.1), upload(s, init.2));
        for dy in dy {
            let bdy = upload(s, dy);
            ops::layernorm_backward(
                s,
                LayerNormBackward::<OnDevice, T> {
                    params: shape,
                    x: &bx,
                    weight: &bw,
                    dy: &bdy,
                    mean: &bm,
                    rstd: &br,
                    dx: &mut dx,
                    dweight: &mut dw,
                    dbias: &mut db,
                    accumulate,
                },
            )
            .expect("device backward");
        }
        (download(s, &dx), download(s, &dw), download(s, &db))
    };
    // Call by call: each accumulating call into the device's current (non-zero) outputs against
    // the reference accumulating into the same values. (Comparing only after both calls would
    // let the bf16 rounding of the first sum, taken at the magnitude of |old| + |gradient|,
    // differ by a half ulp there and exceed the tolerance of a result that cancels to less.)
    let dt = T::DTYPE;
    let mut state = (dx0.clone(), dw0.clone(), db0.clone());
    let mut dy_so_far: Vec<&[T]> = Vec::new();
    for (call, dy) in dys.iter().enumerate() {
        dy_so_far.push(dy);
        let got = device(&[dy], (&state.0, &state.1, &state.2), true);
        let (mut dx, mut dw, mut db) = state.clone();
        cpu::layernorm_backward(LayerNormBackward::<Host, T> {
            params: shape,
            x: &x,
            weight: &w,
            dy,
            mean: &mean,
            rstd: &rstd,
            dx: &mut dx,
            dweight: &mut dw,
            dbias: &mut db,
            accumulate: true,
        })
        .expect("cpu backward");
        for (r, &rs) in rstd.iter().enumerate() {
            let tol = layernorm_dx_tolerance(dt, cols, f64::from(rs));
            let span = r * cols..(r + 1) * cols;
            let what = format!("accumulated dx call {call} row {r} ({rows}×{cols}, {dt})");
            assert_close_with(&what, tol, &got.0[span.clone()], &dx[span]);
        }
        assert_close(
            "accumulated dweight",
            Rule::Reduction,
            dt,
            rows,
            &got.1,
            &dw,
        );
        assert_close("accumulated dbias", Rule::Reduction, dt, rows, &got.2, &db);
        state = got;
    }
    // Both calls on the same device buffers give what the call-by-call chain gave.
    let both = device(&dy_so_far, (&dx0, &dw0, &db0), true);
    assert_eq!(
        (bits(&both.0), bits(&both.1), bits(&both.2)),
        (bits(&state.0), bits(&state.1), bits(&state.2)),
        "two calls in a row ({rows}×{cols}, {dt})"
    );
    let got = both;
    // The old values were really added: the result moved away from one call's gradient.
    let once = device(&[&dys[0]], (&dx0, &dw0, &db0), false);
    assert_ne!(bits(&once.1), bits(&got.1), "dweight did not accumulate");
    // Accumulating into zeros is the overwrite (equal values; -0 + 0 may turn a sign).
    let zero = |len| vec![T::from_f64(0.0); len];
    let acc = device(&[&dys[0]], (&zero(n), &zero(cols), &zero(cols)), true);
    let f = |v: &[T]| v.iter().map(|e| e.to_f64()).collect::<Vec<_>>();
    assert_eq!(
        (f(&acc.0), f(&acc.1), f(&acc.2)),
        (f(&once.0), f(&once.1), f(&once.2)),
        "accumulate into zeros != overwrite ({rows}×{cols}, {dt})"
    );
}

#[test]
fn layernorm_backward_accumulates_into_its_outputs_every_path_and_dtype() {
    let s = stream();
    // 3: scalar layout; 768: one wave per row, cached; 4100: the wide backward; 5001: streamed
    // scalar; 20000: streamed vector. 129 rows: more than one row per group somewhere.
    for (i, &cols) in [3usize, 768, 4100, 5001, 20000].iter().enumerate() {
        for (j, &rows) in [1usize, 129].iter().enumerate() {
            let seed = 900 + (i * 10 + j) as u64;
            layernorm_accumulate::<f32>(&s, rows, cols, seed);
            layernorm_accumulate::<bf16>(&s, rows, cols, seed);
            layernorm_accumulate::<f16>(&s, rows, cols, seed);
        }
    }
}

/// `residual_layernorm_forward` (one fused launch) against the CPU reference (add, round to T,
/// then layer norm of the stored residual); `offset` places every tensor at that element of
/// its buffer (1: misaligned for every vector width, the scalar layout).
fn residual_layernorm_random<T: DeviceElement>(
    s: &Stream,
    rows: usize,
    cols: usize,
    offset: usize,
    seed: u64,
) {
    let shape = LayerNormParams {
        rows,
        cols,
        eps: 1e-5,
    };
    let n = rows * cols;
    let mut rng = Rng(seed);
    let (a, b, w, bi) = (
        rng.vec::<T>(n, 1.0),
        rng.vec::<T>(n, 1.0),
        rng.vec::<T>(cols, 1.0),
        rng.vec::<T>(cols, 1.0),
    );
    let zero = T::from_f64(0.0);
    let (mut x, mut y, mut mean, mut rstd) = (
        vec![zero; n],
        vec![zero; n],
        vec![0f32; rows],
        vec![0f32; rows],
    );
    cpu::residual_layernorm_forward(ResidualLayerNormForward::<Host, T> {
        params: shape,
        a: &a,
        b: &b,
        weight: &w,
        bias: &bi,
        residual: &mut x,
        y: &mut y,
        mean: &mut mean,
        rstd: &mut rstd,
    })
    .expect("cpu forward");
    let at = |v: &[T]| {
        let mut h = vec![zero; offset];
        h.extend_from_slice(v);
        upload(s, &h)
    };
    let (da, db, dw, dbi) = (at(&a), at(&b), at(&w), at(&bi));
    let (mut dx, mut dy) = (at(&vec![zero; n]), at(&vec![zero; n]));
    let mut dm = upload(s, &vec![0f32; rows + offset]);
    let mut dr = upload(s, &vec![0f32; rows + offset]);
    {
        let (va, vb, vw, vbi) = (
            da.slice(offset..).unwrap(),
            db.slice(offset..).unwrap(),
            dw.slice(offset..).unwrap(),
            dbi.slice(offset..).unwrap(),
        );
        let (mut vx, mut vy) = (
            dx.slice_mut(offset..).unwrap(),
            dy.slice_mut(offset..).unwrap(),
        );
        let (mut vm, mut vr) = (
            dm.slice_mut(offset..).unwrap(),
            dr.slice_mut(offset..).unwrap(),
        );
        ops::residual_layernorm_forward(
            s,
            ResidualLayerNormForward {
                params: shape,
                a: &va,
                b: &vb,
                weight: &vw,
                bias: &vbi,
                residual: &mut vx,
                y: &mut vy,
                mean: &mut vm,
                rstd: &mut vr,
            },
        )
        .expect("device forward");
    }
    let dt = T::DTYPE;
    let what = |t: &str| format!("{t} ({rows}×{cols}, offset {offset})");
    // residual: one add rounded once on both sides.
    assert_close(
        &what("residual"),
        Rule::Reduction,
        dt,
        1,
        &download(s, &dx)[offset..],
        &x,
    );
    assert_close(
        &what("y"),
        Rule::Reduction,
        dt,
        cols,
        &download(s, &dy)[offset..],
        &y,
    );
    assert_close(
        &what("mean"),
        Rule::Reduction,
        dt,
        cols,
        &download(s, &dm)[offset..],
        &mean,
    );
    assert_close(
        &what("rstd"),
        Rule::Reduction,
        dt,
        cols,
        &download(s, &dr)[offset..],
        &rstd,
    );
}

/// Odd C (scalar layout), C a multiple of 4 in wave mode and block mode (rows in registers),
/// a wide C (streamed vector layout past what registers hold), misaligned views; few rows
/// (hip-emu runs one fibre per thread).
#[test]
fn residual_layernorm_matches_the_reference_every_dtype() {
    let s = stream();
    let cases = [
        (3, 1, 0),
        (5, 7, 0),
        (4, 768, 0),
        (3, 768, 1),
        (2, 1032, 0),
        (2, 5001, 0),
        (2, 20000, 0),
        (1, 4100, 1),
    ];
    for (i, (rows, cols, offset)) in cases.into_iter().enumerate() {
        let seed = 500 + i as u64;
        residual_layernorm_random::<f32>(&s, rows, cols, offset, seed);
        residual_layernorm_random::<f16>(&s, rows, cols, offset, seed);
        residual_layernorm_random::<bf16>(&s, rows, cols, offset, seed);
    }
}

/// 8190 = 2 mod 4 in the wide range: the streamed backward instead of the wide one.
#[test]
fn layernorm_wide_rows_not_a_multiple_of_four() {
    let s = stream();
    layernorm_random::<f32>(&s, 3, 8190, 200);
    layernorm_random::<f16>(&s, 3, 8190, 201);
    layernorm_random::<bf16>(&s, 3, 8190, 202);
}

/// Misaligned views (one element past an aligned start): the scalar layout in the forward and
/// backward, and the wide backward's fallback (C = 4100, 6000, 8192 take the wide kernel only
/// when every tensor is aligned).
#[test]
fn layernorm_on_misaligned_views_takes_the_scalar_fallback() {
    let s = stream();
    for (i, cols) in [3usize, 64, 257, 4100, 6000, 8192].into_iter().enumerate() {
        layernorm_random_at::<f32>(&s, 3, cols, 300 + i as u64, 1);
        layernorm_random_at::<bf16>(&s, 3, cols, 310 + i as u64, 1);
    }
    layernorm_random_at::<f16>(&s, 5, 1025, 320, 1);
}

/// More rows than the launch plan's grid holds, so each wave (short rows) walks several rows
/// grid-stride: the backward's wave mode caps at 960 row groups on 60 CUs, the forward's at
/// 7680 (the launcher's own plan, no forced grid).
#[test]
fn layernorm_rows_beyond_the_grid_walk_grid_stride() {
    let s = stream();
    let d = s.device();
    let (wave, cus, max) = (
        d.wavefront_size(),
        d.compute_units(),
        d.max_threads_per_block(),
    );
    let shape = |rows, cols| LayerNormParams {
        rows,
        cols,
        eps: 1e-5,
    };
    let bwd = ops::RowPlan::backward(&shape(1000, 64), wave, cus, max).unwrap();
    let fwd = ops::RowPlan::forward(&shape(7700, 3), wave, cus, max).unwrap();
    assert!(bwd.row_per_wave && bwd.groups < 1000, "{cus} CUs: {bwd:?}");
    assert!(fwd.row_per_wave && fwd.groups < 7700, "{cus} CUs: {fwd:?}");
    layernorm_random::<f32>(&s, 1000, 64, 400);
    layernorm_random::<f16>(&s, 1000, 64, 401);
    layernorm_random::<bf16>(&s, 1000, 64, 402);
    layernorm_random::<f32>(&s, 7700, 3, 403);
}

#[test]
fn layernorm_with_zero_rows_zeroes_the_weight_gradients() {
    let s = stream();
    let shape = LayerNormParams {
        rows: 0,
        cols: 5,
        eps: 1e-5,
    };
    let w = vec![1.0f32; 5];
    let got = ln_backward_device(&s, &shape, &[], &w, &[], &[], &[]).expect("backward");
    assert_eq!((got.1, got.2), (vec![0.0; 5], vec![0.0; 5]));
}

#[test]
fn launchers_validate_before_launching() {
    let s = stream();
    let shape = LayerNormParams {
        rows: 2,
        cols: 3,
        eps: 1e-5,
    };
    let x = upload(&s, &[0f32; 5]);
    let w = upload(&s, &[0f32; 3]);
    let (mut y, mut m, mut r) = (
        upload(&s, &[0f32; 6]),
        upload(&s, &[0f32; 2]),
        upload(&s, &[0f32; 2]),
    );
    let e = ops::layernorm_forward(
        &s,
        LayerNormForward {
            params: shape,
            x: &x,
            weight: &w,
            bias: &w,
            y: &mut y,
            mean: &mut m,
            rstd: &mut r,
        },
    )
    .unwrap_err();
    assert!(matches!(e, OpError::Shape(_)), "{e}");
}

#[test]
fn golden_layernorm_cases_pass_on_the_device() {
    run_golden_cases(
        |op| matches!(op, "layernorm_forward" | "layernorm_backward"),
        "layernorm",
    );
}
