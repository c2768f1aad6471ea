//! Device tests of the layernorm and AdamW kernels against the CPU reference (`--features
//! device`; needs a HIP device and kernels built for its arch). Run on hip-emu (the CPU-emulated
//! device), never on a GPU.
//!
//! - golden cases (layernorm forward/backward, adamw) through the library's `DeviceBackend`;
//! - random shapes: C ∈ {1, 3, 4, 768, 1024, 1025, 4095, 4096, 4100, 5001, 6000, 8192, 20000}
//!   (4100, 6000, 8192: the wide backward; 5001: its streamed fallback), rows ∈ {1, 7, 129},
//!   every dtype; the fused residual + layernorm forward on odd, cached, wide and misaligned
//!   rows, every dtype; AdamW over element counts that are not multiples of a block or chunk, every
//!   option, several tensors in one launch;
//! - C = 8190 (wide range, C % 4 != 0: the streamed backward); misaligned views (the scalar
//!   layout and the wide backward's fallback); more rows than the grid holds (grid-stride);
//! - a found_inf step leaves every tensor bit-identical; amsgrad propagates a NaN in v or v̂ to
//!   the parameter (torch.maximum); results are bit-identical run to run.
#![cfg(feature = "device")]

use hip_kernels::cpu;
use hip_kernels::ops::{
    self, AdamW, AdamWParams, AdamWTensor, DeviceElement, LayerNormBackward, LayerNormForward,
    LayerNormParams, OpError, ResidualLayerNormForward,
};
use hip_kernels::params::{bf16, f16, DType, Host, OnDevice};
use hip_kernels::tolerance::{layernorm_dx_tolerance, Rule};
use hip_rt::memory::buffer::DeviceView;
use hip_rt::{DeviceBuffer, Stream};

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

// ---------------------------------------------------------------------------------------------
// AdamW
// ---------------------------------------------------------------------------------------------

struct AdamwState<T> {
    param: Vec<T>,
    grad: Vec<T>,
    m: Vec<f32>,
    v: Vec<f32>,
    vmax: Option<Vec<f32>>,
    master: Option<Vec<f32>>,
}

impl<T: DeviceElement> AdamwState<T> {
    fn random(n: usize, amsgrad: bool, master: bool, rng: &mut Rng) -> Self {
        let param: Vec<T> = rng.vec(n, 1.0);
        AdamwState {
            master: master.then(|| param.iter().map(|p| p.to_f32()).collect()),
            grad: rng.vec(n, 1e-2),
            m: rng.vec(n, 1e-3),
            v: (0..n)
                .map(|_| (rng.normal() * 1e-2).powi(2) as f32)
                .collect(),
            vmax: amsgrad.then(|| {
                (0..n)
                    .map(|_| (rng.normal() * 1e-2).powi(2) as f32)
                    .collect()
            }),
            param,
        }
    }

    fn cpu_step(&mut self, c: &AdamWParams, grad_scale: Option<f32>) {
        let scale = grad_scale.map(|g| [g]);
        cpu::adamw(AdamW::<Host, T> {
            params: *c,
            grad_scale: scale.as_ref().map(|g| &g[..]),
            found_inf: None,
            tensors: &mut [AdamWTensor {
                param: &mut self.param,
                grad: &self.grad,
                exp_avg: &mut self.m,
                exp_avg_sq: &mut self.v,
                max_exp_avg_sq: self.vmax.as_deref_mut(),
                master: self.master.as_deref_mut(),
                weight_decay: None,
                lr_scale: None,
            }],
        })
        .expect("cpu adamw");
    }
}

/// Device copies of one tensor's state.
struct DeviceState<T: DeviceElement> {
    param: DeviceBuffer<T>,
    grad: DeviceBuffer<T>,
    m: DeviceBuffer<f32>,
    v: DeviceBuffer<f32>,
    vmax: Option<DeviceBuffer<f32>>,
    master: Option<DeviceBuffer<f32>>,
}

impl<T: DeviceElement> DeviceState<T> {
    fn upload(s: &Stream, h: &AdamwState<T>) -> Self {
        DeviceState {
            param: upload(s, &h.param),
            grad: upload(s, &h.grad),
            m: upload(s, &h.m),
            v: upload(s, &h.v),
            vmax: h.vmax.as_ref().map(|v| upload(s, v)),
            master: h.master.as_ref().map(|v| upload(s, v)),
        }
    }

    fn tensor(&mut self) -> AdamWTensor<'_, OnDevice, T> {
        AdamWTensor {
            param: &mut self.param,
            grad: &self.grad,
            exp_avg: &mut self.m,
            exp_avg_sq: &mut self.v,
            max_exp_avg_sq: self.vmax.as_mut().map(|b| b as _),
            master: self.master.as_mut().map(|b| b as _),
            weight_decay: None,
            lr_scale: None,
        }
    }

    fn download(&self, s: &Stream) -> AdamwState<T> {
        AdamwState {
            param: download(s, &self.param),
            grad: download(s, &self.grad),
            m: download(s, &self.m),
            v: download(s, &self.v),
            vmax: self.vmax.as_ref().map(|b| download(s, b)),
            master: self.master.as_ref().map(|b| download(s, b)),
        }
    }
}

fn assert_adamw_close<T: DeviceElement>(got: &AdamwState<T>, want: &AdamwState<T>) {
    let dt = T::DTYPE;
    assert_close("param", Rule::Optimizer, dt, 1, &got.param, &want.param);
    assert_close("exp_avg", Rule::Optimizer, dt, 1, &got.m, &want.m);
    assert_close("exp_avg_sq", Rule::Optimizer, dt, 1, &got.v, &want.v);
    if let (Some(g), Some(w)) = (&got.vmax, &want.vmax) {
        assert_close("max_exp_avg_sq", Rule::Optimizer, dt, 1, g, w);
    }
    if let (Some(g), Some(w)) = (&got.master, &want.master) {
        assert_close("param", Rule::Optimizer, DType::F32, 1, g, w);
    }
}

fn adamw_multi_random<T: DeviceElement>(s: &Stream, seed: u64) {
    // More tensors than one launch's table holds (ADAMW_TABLE_ROWS), so the list is split.
    let mut lens = vec![1usize, 255, 1023, 4097, 65_537, 200_003, 0];
    lens.extend((0..ops::ADAMW_TABLE_ROWS).map(|i| 3 + 97 * i));
    for (amsgrad, maximize, master, scaled) in [
        (false, false, false, false),
        (true, true, true, true),
        (true, false, false, true),
        (false, true, true, false),
    ] {
        let c = AdamWParams {
            lr: 1e-2,
            amsgrad,
            maximize,
            weight_decay: 0.1,
            step: 7,
            ..AdamWParams::default()
        };
        let mut rng = Rng(seed);
        let mut host: Vec<AdamwState<T>> = lens
            .iter()
            .map(|&n| AdamwState::random(n, amsgrad, master, &mut rng))
            .collect();
        let mut dev: Vec<DeviceState<T>> = host.iter().map(|h| DeviceState::upload(s, h)).collect();
        let scale = upload(s, &[256.0f32]);
        let mut tensors: Vec<AdamWTensor<'_, OnDevice, T>> =
            dev.iter_mut().map(|d| d.tensor()).collect();
        let a = AdamW::<OnDevice, _> {
            params: c,
            grad_scale: scaled.then_some(&scale as &dyn DeviceView<f32>),
            found_inf: None,
            tensors: &mut tensors,
        };
        ops::adamw(s, a).expect("adamw");
        drop(tensors);
        for (h, d) in host.iter_mut().zip(&dev) {
            h.cpu_step(&c, scaled.then_some(256.0));
            assert_adamw_close(&d.download(s), h);
        }
    }
}

#[test]
fn adamw_multi_matches_the_reference_every_option_every_dtype() {
    let s = stream();
    adamw_multi_random::<f32>(&s, 11);
    adamw_multi_random::<f16>(&s, 12);
    adamw_multi_random::<bf16>(&s, 13);
}

/// Per-tensor weight decay and lr scale (torch's param groups) in one `ops::adamw` call: equal
/// bit for bit to one call per tensor with those hyper-parameters as the call's, close to the
/// CPU reference (itself equal to its per-tensor calls), in one launch per
/// `ADAMW_TABLE_ROWS` tensors (counted on hip-emu).
fn adamw_per_tensor_hyper<T: DeviceElement>(s: &Stream, seed: u64) {
    let n_tensors = ops::ADAMW_TABLE_ROWS + 6;
    let mut lens: Vec<usize> = (0..n_tensors).map(|i| 3 + 37 * i).collect();
    lens[1] = 65_537; // more than one chunk
    let overrides: Vec<(Option<f64>, Option<f64>)> = (0..n_tensors)
        .map(|i| {
            let wd = [None, Some(0.0), Some(0.3)][i % 3];
            let scale = [None, Some(0.5), Some(0.0), Some(2.0)][i % 4];
            (wd, scale)
        })
        .collect();
    let c = AdamWParams {
        lr: 1e-2,
        weight_decay: 0.1,
        step: 5,
        ..AdamWParams::default()
    };
    // What torch's param group of tensor i would run with.
    let own = |i: usize| AdamWParams {
        lr: overrides[i].1.map_or(c.lr, |sc| c.lr * sc),
        weight_decay: overrides[i].0.unwrap_or(c.weight_decay),
        ..c
    };
    let mut rng = Rng(seed);
    let host: Vec<AdamwState<T>> = lens
        .iter()
        .map(|&n| AdamwState::random(n, false, false, &mut rng))
        .collect();

    // One call, the overrides in the table.
    let mut one: Vec<DeviceState<T>> = host.iter().map(|h| DeviceState::upload(s, h)).collect();
    let mut tensors: Vec<AdamWTensor<'_, OnDevice, T>> = one
        .iter_mut()
        .zip(&overrides)
        .map(|(d, &(wd, sc))| AdamWTensor {
            weight_decay: wd,
            lr_scale: sc,
            ..d.tensor()
        })
        .collect();
    s.synchronize().expect("sync");
    let before = hip_rt::emu::stats(hip_rt::emu::StatsScope::Thread);
    ops::adamw(
        s,
        AdamW::<OnDevice, _> {
            params: c,
            grad_scale: None,
            found_inf: None,
            tensors: &mut tensors,
        },
    )
    .expect("adamw, one call");
    if let (Some(b), Some(a)) = (before, hip_rt::emu::stats(hip_rt::emu::StatsScope::Thread)) {
        let launches = a.since(&b).launches;
        assert_eq!(
            launches as usize,
            n_tensors.div_ceil(ops::ADAMW_TABLE_ROWS),
            "launches of one adamw call over {n_tensors} tensors"
        );
    }
    drop(tensors);

    // One call per tensor, its hyper-parameters as the call's.
    let mut each: Vec<DeviceState<T>> = host.iter().map(|h| DeviceState::upload(s, h)).collect();
    for (i, d) in each.iter_mut().enumerate() {
        ops::adamw(
            s,
            AdamW::<OnDevice, _> {
                params: own(i),
                grad_scale: None,
                found_inf: None,
                tensors: &mut [d.tensor()],
            },
        )
        .expect("adamw, per tensor");
    }

    for (i, ((o, e), h)) in one.iter().zip(&each).zip(&host).enumerate() {
        let (o, e) = (o.download(s), e.download(s));
        assert_eq!(
            (bits(&o.param), bits(&o.m), bits(&o.v)),
            (bits(&e.param), bits(&e.m), bits(&e.v)),
            "tensor {i} ({:?}): one call != per-tensor call",
            overrides[i]
        );
        // The CPU reference: one call with the override equals its own per-tensor call.
        let (mut a, mut b) = (clone_state(h), clone_state(h));
        cpu::adamw(AdamW::<Host, T> {
            params: c,
            grad_scale: None,
            found_inf: None,
            tensors: &mut [AdamWTensor {
                param: &mut a.param,
                grad: &a.grad,
                exp_avg: &mut a.m,
                exp_avg_sq: &mut a.v,
                max_exp_avg_sq: None,
                master: None,
                weight_decay: overrides[i].0,
                lr_scale: overrides[i].1,
            }],
        })
        .expect("cpu adamw");
        b.cpu_step(&own(i), None);
        assert_eq!(bits(&a.param), bits(&b.param), "cpu tensor {i}");
        assert_adamw_close(&o, &a);
    }
    // The overrides mattered: lr_scale 0 left tensor 2's parameter alone (decay 1 − 0·wd = 1).
    assert_eq!(bits(&one[2].download(s).param), bits(&host[2].param));
    assert_ne!(bits(&one[1].download(s).param), bits(&host[1].param));
}

fn clone_state<T: DeviceElement>(h: &AdamwState<T>) -> AdamwState<T> {
    AdamwState {
        param: h.param.clone(),
        grad: h.grad.clone(),
        m: h.m.clone(),
        v: h.v.clone(),
        vmax: h.vmax.clone(),
        master: h.master.clone(),
    }
}

#[test]
fn adamw_per_tensor_weight_decay_and_lr_scale_in_one_call_every_dtype() {
    let s = stream();
    adamw_per_tensor_hyper::<f32>(&s, 21);
    adamw_per_tensor_hyper::<f16>(&s, 22);
    adamw_per_tensor_hyper::<bf16>(&s, 23);
}

#[test]
fn a_found_inf_step_changes_no_bit() {
    let s = stream();
    let c = AdamWParams {
        amsgrad: true,
        step: 3,
        ..AdamWParams::default()
    };
    let mut rng = Rng(5);
    let host = AdamwState::<bf16>::random(70_001, true, true, &mut rng);
    let mut dev = DeviceState::upload(&s, &host);
    let found = upload(&s, &[1.0f32]);
    let a = AdamW::<OnDevice, _> {
        params: c,
        grad_scale: None,
        found_inf: Some(&found),
        tensors: &mut [dev.tensor()],
    };
    ops::adamw(&s, a).expect("adamw");
    let got = dev.download(&s);
    assert_eq!(bits(&got.param), bits(&host.param));
    assert_eq!((bits(&got.m), bits(&got.v)), (bits(&host.m), bits(&host.v)));
    assert_eq!(
        got.vmax.as_deref().map(bits),
        host.vmax.as_deref().map(bits)
    );
    assert_eq!(
        got.master.as_deref().map(bits),
        host.master.as_deref().map(bits)
    );
}

/// amsgrad with a NaN already in max_exp_avg_sq (element 0) or in exp_avg_sq (element 1): both
/// stay NaN in v̂ and reach the parameter, as torch.maximum propagates NaN; element 2 is finite.
fn adamw_amsgrad_nan<T: DeviceElement>(s: &Stream) {
    let c = AdamWParams {
        lr: 1e-2,
        amsgrad: true,
        step: 1,
        ..AdamWParams::default()
    };
    let mut host = AdamwState::<T> {
        param: vec![T::from_f64(1.0); 3],
        grad: vec![T::from_f64(0.1); 3],
        m: vec![0.0; 3],
        v: vec![0.25, f32::NAN, 0.25],
        vmax: Some(vec![f32::NAN, 0.5, 0.5]),
        master: None,
    };
    let mut dev = DeviceState::upload(s, &host);
    ops::adamw(
        s,
        AdamW::<OnDevice, _> {
            params: c,
            grad_scale: None,
            found_inf: None,
            tensors: &mut [dev.tensor()],
        },
    )
    .expect("adamw");
    let got = dev.download(s);
    host.cpu_step(&c, None);
    assert_adamw_close(&got, &host);
    let vmax = got.vmax.as_deref().unwrap();
    let p: Vec<f64> = got.param.iter().map(|x| x.to_f64()).collect();
    assert!(
        vmax[0].is_nan() && vmax[1].is_nan() && vmax[2] == 0.5,
        "{vmax:?}"
    );
    assert!(p[0].is_nan() && p[1].is_nan() && p[2].is_finite(), "{p:?}");
}

#[test]
fn adamw_amsgrad_propagates_nan_like_torch_maximum() {
    let s = stream();
    adamw_amsgrad_nan::<f32>(&s);
    adamw_amsgrad_nan::<f16>(&s);
    adamw_amsgrad_nan::<bf16>(&s);
}

fn non_finite_and_l2_norm<T: DeviceElement>(s: &Stream, seed: u64) {
    let mut rng = Rng(seed);
    let a: Vec<T> = rng.vec(100_000, 1.0);
    let mut b: Vec<T> = rng.vec(3, 1.0);
    let (da, db) = (upload(s, &a), upload(s, &b));
    let mut flag = upload(s, &[7.0f32]);
    let mut norm = upload(s, &[0.0f32]);
    ops::non_finite(s, &[&da, &db], &mut flag).expect("non_finite");
    assert_eq!(download(s, &flag), [0.0]);
    ops::l2_norm(s, &[&da, &db], &mut norm).expect("l2_norm");
    let want = cpu::l2_norm(&[&a[..], &b[..]]);
    let got = download(s, &norm)[0];
    assert!(
        (f64::from(got) - want).abs() <= 1e-5 * want,
        "l2 norm {got} vs {want}"
    );
    ops::l2_norm(s, &[&da, &db], &mut norm).expect("l2_norm again");
    assert_eq!(
        download(s, &norm)[0].to_bits(),
        got.to_bits(),
        "l2 norm is deterministic"
    );
    // No tensors (a ZeRO rank that owns none): the norm is 0, written, not left as it was.
    ops::l2_norm::<T>(s, &[], &mut norm).expect("l2_norm of no tensors");
    assert_eq!(download(s, &norm), [0.0], "l2 norm of no tensors");
    b[2] = T::from_f64(f64::INFINITY);
    let db = upload(s, &b);
    ops::non_finite(s, &[&da, &db], &mut flag).expect("non_finite");
    assert_eq!(download(s, &flag), [1.0]);
}

#[test]
fn non_finite_and_l2_norm_match_the_reference_every_dtype() {
    let s = stream();
    non_finite_and_l2_norm::<f32>(&s, 8);
    non_finite_and_l2_norm::<f16>(&s, 9);
    non_finite_and_l2_norm::<bf16>(&s, 10);
}

#[test]
fn golden_layernorm_and_adamw_cases_pass_on_the_device() {
    run_golden_cases(
        |op| matches!(op, "layernorm_forward" | "layernorm_backward" | "adamw"),
        "layernorm/adamw",
    );
}
