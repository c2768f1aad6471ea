//! Device tests of the LLaMA-family ops (RMS norm and its residual forward, rotary embedding,
//! SwiGLU) against the CPU reference: every dtype, every kernel path (wave-mode and block-mode
//! cached rows, streamed long rows, the scalar layout of odd widths and misaligned views, the
//! vector layout, partial tiles), accumulate on and off, fused and separate gate-up layouts,
//! rotary on a fused QKV projection in place (the rest of the buffer untouched), and the golden
//! cases. Needs `--features device` and a HIP device (a DCU, or hip-emu). Run on hip-emu, never
//! on a GPU.
#![cfg(feature = "device")]

mod device_common;

use device_common::{
    assert_close, assert_close_with, bits, run_golden_cases, stream, up_i32, upload, Rng, Shifted,
};
use hip_kernels::ops::{
    self, AttentionLayout, DeviceElement, GateUp, GateUpGrad, Qkv, ResidualRmsNormForward,
    RmsNormBackward, RmsNormForward, RmsNormParams, Rope, RopeParams, RopeScaling, SwigluBackward,
    SwigluForward, SwigluParams,
};
use hip_kernels::params::{bf16, f16, Host, OnDevice};
use hip_kernels::tolerance::{layernorm_dx_tolerance, Rule};
use hip_kernels::{cpu, params::DType};
use hip_rt::memory::buffer::DeviceSlice;
use hip_rt::{DeviceBuffer, Stream};

#[test]
fn golden_llama_cases_pass_on_the_device() {
    run_golden_cases(
        |op| {
            matches!(
                op,
                "rmsnorm_forward"
                    | "rmsnorm_backward"
                    | "residual_rmsnorm_forward"
                    | "rope_forward"
                    | "rope_backward"
                    | "swiglu_forward"
                    | "swiglu_backward"
            )
        },
        "LLaMA-family",
    );
}

// ---------------------------------------------------------------------------------------------
// RMS norm
// ---------------------------------------------------------------------------------------------

/// Forward, residual forward and backward (overwrite and accumulate) of `rows × cols` on views
/// `off` elements into their allocations, against the reference.
fn rmsnorm_case<T: DeviceElement>(s: &Stream, rows: usize, cols: usize, off: usize, seed: u64) {
    let mut rng = Rng(seed);
    let p = RmsNormParams {
        rows,
        cols,
        eps: 1e-6,
    };
    let n = rows * cols;
    let (x, b): (Vec<T>, Vec<T>) = (rng.vec(n, 1.0), rng.vec(n, 1.0));
    let w: Vec<T> = (0..cols)
        .map(|_| T::from_f64(1.0 + 0.5 * rng.normal()))
        .collect();
    let dy: Vec<T> = rng.vec(n, 1.0);
    let what = format!("{} rows {rows} cols {cols} off {off}", T::DTYPE);
    // Forward.
    let (mut y, mut rstd) = (vec![T::from_f64(0.0); n], vec![0.0f32; rows]);
    cpu::rmsnorm_forward(RmsNormForward::<Host, T> {
        params: p,
        x: &x,
        weight: &w,
        y: &mut y,
        rstd: &mut rstd,
    })
    .unwrap();
    let (dx_in, dw_in) = (Shifted::new(s, &x, off), Shifted::new(s, &w, off));
    let mut dy_out = Shifted::new(s, &vec![T::from_f64(f64::NAN); n], off);
    let mut drstd = DeviceBuffer::<f32>::zeroed(s, rows).unwrap();
    ops::rmsnorm_forward(
        s,
        RmsNormForward {
            params: p,
            x: &dx_in.view(),
            weight: &dw_in.view(),
            y: &mut dy_out.view_mut(),
            rstd: &mut drstd,
        },
    )
    .unwrap();
    assert_close(
        &format!("y {what}"),
        Rule::Reduction,
        T::DTYPE,
        cols,
        &dy_out.get(s),
        &y,
    );
    assert_close(
        "rstd",
        Rule::Reduction,
        T::DTYPE,
        cols,
        &drstd.to_vec(s).unwrap(),
        &rstd,
    );
    // Residual forward: residual = x + b, normalised as stored.
    let (mut res, mut ry, mut rr) = (
        vec![T::from_f64(0.0); n],
        vec![T::from_f64(0.0); n],
        vec![0.0f32; rows],
    );
    cpu::residual_rmsnorm_forward(ResidualRmsNormForward::<Host, T> {
        params: p,
        a: &x,
        b: &b,
        weight: &w,
        residual: &mut res,
        y: &mut ry,
        rstd: &mut rr,
    })
    .unwrap();
    let db = Shifted::new(s, &b, off);
    let mut dres = Shifted::new(s, &vec![T::from_f64(f64::NAN); n], off);
    let mut dry = Shifted::new(s, &vec![T::from_f64(f64::NAN); n], off);
    ops::residual_rmsnorm_forward(
        s,
        ResidualRmsNormForward {
            params: p,
            a: &dx_in.view(),
            b: &db.view(),
            weight: &dw_in.view(),
            residual: &mut dres.view_mut(),
            y: &mut dry.view_mut(),
            rstd: &mut drstd,
        },
    )
    .unwrap();
    assert_close(
        &format!("residual {what}"),
        Rule::Reduction,
        T::DTYPE,
        2,
        &dres.get(s),
        &res,
    );
    assert_close(
        &format!("residual y {what}"),
        Rule::Reduction,
        T::DTYPE,
        cols,
        &dry.get(s),
        &ry,
    );
    assert_close(
        "residual rstd",
        Rule::Reduction,
        T::DTYPE,
        cols,
        &drstd.to_vec(s).unwrap(),
        &rr,
    );
    // Backward from the reference's rstd, overwrite (outputs start NaN) then accumulate.
    let rstd_dev = upload(s, &rstd);
    let ddy = Shifted::new(s, &dy, off);
    for accumulate in [false, true] {
        let init = |n: usize, v: f64| vec![T::from_f64(if accumulate { v } else { f64::NAN }); n];
        let (mut dx, mut dw) = (init(n, 0.5), init(cols, -1.0));
        let (mut ddx, mut ddw) = (Shifted::new(s, &dx, off), Shifted::new(s, &dw, off));
        cpu::rmsnorm_backward(RmsNormBackward::<Host, T> {
            params: p,
            x: &x,
            weight: &w,
            dy: &dy,
            rstd: &rstd,
            dx: &mut dx,
            dweight: &mut dw,
            accumulate,
        })
        .unwrap();
        ops::rmsnorm_backward(
            s,
            RmsNormBackward {
                params: p,
                x: &dx_in.view(),
                weight: &dw_in.view(),
                dy: &ddy.view(),
                rstd: &rstd_dev,
                dx: &mut ddx.view_mut(),
                dweight: &mut ddw.view_mut(),
                accumulate,
            },
        )
        .unwrap();
        let max_rstd = rstd.iter().fold(1.0f64, |m, &r| m.max(f64::from(r)));
        let tol = layernorm_dx_tolerance(T::DTYPE, cols, max_rstd);
        assert_close_with(
            &format!("dx {what} acc {accumulate}"),
            tol,
            &ddx.get(s),
            &dx,
        );
        assert_close(
            &format!("dweight {what} acc {accumulate}"),
            Rule::Reduction,
            T::DTYPE,
            rows,
            &ddw.get(s),
            &dw,
        );
    }
}

/// The row shapes of every path: wave-mode cached rows (C ≤ 256 backward, ≤ 1024 forward, with
/// a partial last slot at 68), block-mode cached rows (2048), rows streamed by both directions
/// (16400 > 16·1024), odd C (the scalar layout), a single row and a single column.
const RMS_SHAPES: [(usize, usize); 7] = [
    (5, 64),
    (3, 68),
    (4, 1000),
    (2, 2048),
    (2, 16400),
    (7, 33),
    (1, 1),
];

fn rmsnorm_all<T: DeviceElement>() {
    let s = stream();
    for (i, &(rows, cols)) in RMS_SHAPES.iter().enumerate() {
        for off in [0, 1] {
            rmsnorm_case::<T>(&s, rows, cols, off, 11 + i as u64);
        }
    }
}

#[test]
fn rmsnorm_f32_every_path_matches_the_reference() {
    rmsnorm_all::<f32>();
}

#[test]
fn rmsnorm_f16_every_path_matches_the_reference() {
    rmsnorm_all::<f16>();
}

#[test]
fn rmsnorm_bf16_every_path_matches_the_reference() {
    rmsnorm_all::<bf16>();
}

#[test]
fn rmsnorm_backward_is_bit_identical_run_to_run() {
    let s = stream();
    let (rows, cols) = (300, 256);
    let mut rng = Rng(5);
    let p = RmsNormParams {
        rows,
        cols,
        eps: 1e-6,
    };
    let (x, dy): (Vec<f32>, Vec<f32>) = (rng.vec(rows * cols, 1.0), rng.vec(rows * cols, 1.0));
    let w: Vec<f32> = rng.vec(cols, 1.0);
    let rstd: Vec<f32> = (0..rows).map(|i| 1.0 + i as f32 / 300.0).collect();
    let (bx, bw, bdy, br) = (
        upload(&s, &x),
        upload(&s, &w),
        upload(&s, &dy),
        upload(&s, &rstd),
    );
    let run = || {
        let (mut dx, mut dw) = (
            DeviceBuffer::<f32>::zeroed(&s, rows * cols).unwrap(),
            DeviceBuffer::<f32>::zeroed(&s, cols).unwrap(),
        );
        ops::rmsnorm_backward(
            &s,
            RmsNormBackward {
                params: p,
                x: &bx,
                weight: &bw,
                dy: &bdy,
                rstd: &br,
                dx: &mut dx,
                dweight: &mut dw,
                accumulate: false,
            },
        )
        .unwrap();
        (bits(&dx.to_vec(&s).unwrap()), bits(&dw.to_vec(&s).unwrap()))
    };
    assert_eq!(run(), run());
}

// ---------------------------------------------------------------------------------------------
// SwiGLU
// ---------------------------------------------------------------------------------------------

fn host_gate_up<'a, T: DeviceElement>(
    fused: bool,
    gu: &'a [T],
    g: &'a [T],
    u: &'a [T],
) -> GateUp<'a, Host, T> {
    if fused {
        GateUp::Fused { gate_up: gu }
    } else {
        GateUp::Separate { gate: g, up: u }
    }
}

fn dev_gate_up<'a, T: DeviceElement>(
    fused: bool,
    gu: &'a DeviceSlice<'_, T>,
    g: &'a DeviceSlice<'_, T>,
    u: &'a DeviceSlice<'_, T>,
) -> GateUp<'a, OnDevice, T> {
    if fused {
        GateUp::Fused { gate_up: gu }
    } else {
        GateUp::Separate { gate: g, up: u }
    }
}

/// Forward and backward of `rows × F`, fused or separate input and gradient, views `off` into
/// their allocations.
fn swiglu_case<T: DeviceElement>(
    s: &Stream,
    rows: usize,
    ffn: usize,
    fused_in: bool,
    fused_grad: bool,
    off: usize,
    seed: u64,
) {
    let mut rng = Rng(seed);
    let p = SwigluParams { rows, ffn };
    let n = rows * ffn;
    let (g, u, dh): (Vec<T>, Vec<T>, Vec<T>) = (rng.vec(n, 3.0), rng.vec(n, 1.0), rng.vec(n, 1.0));
    let gu: Vec<T> = (0..rows)
        .flat_map(|r| {
            g[r * ffn..(r + 1) * ffn]
                .iter()
                .chain(&u[r * ffn..(r + 1) * ffn])
                .copied()
        })
        .collect();
    let what = format!(
        "{} rows {rows} F {ffn} fused {fused_in}/{fused_grad} off {off}",
        T::DTYPE
    );
    let mut h = vec![T::from_f64(0.0); n];
    cpu::swiglu_forward(SwigluForward {
        params: p,
        input: host_gate_up(fused_in, &gu, &g, &u),
        h: &mut h,
    })
    .unwrap();
    let (dg_in, du_in, dgu_in) = (
        Shifted::new(s, &g, off),
        Shifted::new(s, &u, off),
        Shifted::new(s, &gu, off),
    );
    let (gv, uv, guv) = (dg_in.view(), du_in.view(), dgu_in.view());
    let mut dh_out = Shifted::new(s, &vec![T::from_f64(f64::NAN); n], off);
    {
        let mut hv = dh_out.view_mut();
        ops::swiglu_forward(
            s,
            SwigluForward {
                params: p,
                input: dev_gate_up(fused_in, &guv, &gv, &uv),
                h: &mut hv,
            },
        )
        .unwrap();
    }
    assert_close(
        &format!("h {what}"),
        Rule::Reduction,
        T::DTYPE,
        1,
        &dh_out.get(s),
        &h,
    );
    // Backward: outputs start as NaN (never read).
    let ddh = Shifted::new(s, &dh, off);
    let nan = |len: usize| vec![T::from_f64(f64::NAN); len];
    let (want_g, want_u) = {
        let (mut a, mut b, mut c) = (nan(n), nan(n), nan(2 * n));
        let grad: GateUpGrad<'_, Host, T> = if fused_grad {
            GateUpGrad::Fused { dgate_up: &mut c }
        } else {
            GateUpGrad::Separate {
                dgate: &mut a,
                dup: &mut b,
            }
        };
        cpu::swiglu_backward(SwigluBackward {
            params: p,
            input: host_gate_up(fused_in, &gu, &g, &u),
            dh: &dh,
            grad,
        })
        .unwrap();
        if fused_grad {
            let split = |k: usize| {
                (0..rows)
                    .flat_map(|r| c[r * 2 * ffn + k * ffn..r * 2 * ffn + (k + 1) * ffn].to_vec())
                    .collect::<Vec<T>>()
            };
            (split(0), split(1))
        } else {
            (a, b)
        }
    };
    let (mut da, mut db, mut dc) = (
        Shifted::new(s, &nan(n), off),
        Shifted::new(s, &nan(n), off),
        Shifted::new(s, &nan(2 * n), off),
    );
    {
        let (mut av, mut bv, mut cv) = (da.view_mut(), db.view_mut(), dc.view_mut());
        let grad: GateUpGrad<'_, OnDevice, T> = if fused_grad {
            GateUpGrad::Fused { dgate_up: &mut cv }
        } else {
            GateUpGrad::Separate {
                dgate: &mut av,
                dup: &mut bv,
            }
        };
        ops::swiglu_backward(
            s,
            SwigluBackward {
                params: p,
                input: dev_gate_up(fused_in, &guv, &gv, &uv),
                dh: &ddh.view(),
                grad,
            },
        )
        .unwrap();
    }
    let (got_g, got_u) = if fused_grad {
        let c = dc.get(s);
        let split = |k: usize| {
            (0..rows)
                .flat_map(|r| c[r * 2 * ffn + k * ffn..r * 2 * ffn + (k + 1) * ffn].to_vec())
                .collect::<Vec<T>>()
        };
        (split(0), split(1))
    } else {
        (da.get(s), db.get(s))
    };
    assert_close(
        &format!("dg {what}"),
        Rule::Reduction,
        T::DTYPE,
        1,
        &got_g,
        &want_g,
    );
    assert_close(
        &format!("du {what}"),
        Rule::Reduction,
        T::DTYPE,
        1,
        &got_u,
        &want_u,
    );
}

fn swiglu_all<T: DeviceElement>() {
    let s = stream();
    // F a whole number of 16-byte packs (vector), odd F (scalar), a partial column block (300
    // packs > 256 threads), one row; every mix of fused and separate layouts, aligned or not.
    for (i, &(rows, ffn)) in [(5, 64), (3, 13), (2, 2400), (1, 8)].iter().enumerate() {
        for (fi, fg) in [(false, false), (true, true), (true, false), (false, true)] {
            for off in [0, 1] {
                swiglu_case::<T>(&s, rows, ffn, fi, fg, off, 40 + i as u64);
            }
        }
    }
}

#[test]
fn swiglu_f32_every_layout_matches_the_reference() {
    swiglu_all::<f32>();
}

#[test]
fn swiglu_f16_every_layout_matches_the_reference() {
    swiglu_all::<f16>();
}

#[test]
fn swiglu_bf16_every_layout_matches_the_reference() {
    swiglu_all::<bf16>();
}

// ---------------------------------------------------------------------------------------------
// Rotary embedding
// ---------------------------------------------------------------------------------------------

/// Rotary in place on q and k inside a fused `[B, T, 3, H, D]` projection (k with `kv` of the H
/// head slots rotated, as a grouped-query k view would be), forward then backward, against the
/// reference; v and the unrotated dims must come back bit-identical. `off` shifts the whole
/// buffer (the scalar path when 1).
#[allow(clippy::too_many_arguments)]
fn rope_case<T: DeviceElement>(
    s: &Stream,
    b: usize,
    t: usize,
    h: usize,
    kv: usize,
    d: usize,
    r: usize,
    interleaved: bool,
    off: usize,
    seed: u64,
) {
    let mut rng = Rng(seed);
    let n = b * t * 3 * h * d;
    let x: Vec<T> = rng.vec(n, 1.0);
    // Packed sequences: positions restart at 0 inside each row.
    let pos: Vec<i32> = (0..b * t)
        .map(|i| ((i % t) % 5 + (i % t) / 5 * 1000) as i32)
        .collect();
    let freqs = ops::rope_frequencies(10000.0, r, RopeScaling::Default).unwrap();
    let what = format!(
        "{} b {b} t {t} h {h}/{kv} d {d} r {r} inter {interleaved} off {off}",
        T::DTYPE
    );
    let views = [(Qkv::Q, h), (Qkv::K, kv)];
    let params = |heads| RopeParams {
        batch: b,
        seq: t,
        heads,
        head_dim: d,
        rotary_dim: r,
        interleaved,
    };
    let mut want = x.clone();
    let mut dev = Shifted::new(s, &x, off);
    let (dpos, dfreqs) = (up_i32(s, &pos), upload(s, &freqs));
    for (which, heads) in views {
        let layout = AttentionLayout::fused_qkv(which, t, h, d);
        cpu::rope_forward(Rope::<Host, T> {
            params: params(heads),
            x: &mut want,
            layout,
            positions: &pos,
            freqs: &freqs,
        })
        .unwrap();
        ops::rope_forward(
            s,
            Rope {
                params: params(heads),
                x: &mut dev.view_mut(),
                layout,
                positions: &dpos,
                freqs: &dfreqs,
            },
        )
        .unwrap();
    }
    let got = dev.get(s);
    assert_close(
        &format!("rope {what}"),
        Rule::Reduction,
        T::DTYPE,
        2,
        &got,
        &want,
    );
    // Untouched: v, the k head slots past kv, and dims r.. of every row.
    for i in 0..n {
        let (dim, head, part) = (i % d, (i / d) % h, (i / (d * h)) % 3);
        let rotated = dim < r && (part == 0 || part == 1 && head < kv);
        if !rotated {
            assert_eq!(
                bits(&got[i..=i]),
                bits(&x[i..=i]),
                "{what}: element {i} was written"
            );
        }
    }
    // Backward (the rotation by −a) of the rotated values gives back the inputs.
    for (which, heads) in views {
        let layout = AttentionLayout::fused_qkv(which, t, h, d);
        cpu::rope_backward(Rope::<Host, T> {
            params: params(heads),
            x: &mut want,
            layout,
            positions: &pos,
            freqs: &freqs,
        })
        .unwrap();
        ops::rope_backward(
            s,
            Rope {
                params: params(heads),
                x: &mut dev.view_mut(),
                layout,
                positions: &dpos,
                freqs: &dfreqs,
            },
        )
        .unwrap();
    }
    assert_close(
        &format!("rope backward {what}"),
        Rule::Reduction,
        T::DTYPE,
        2,
        &dev.get(s),
        &want,
    );
    if T::DTYPE == DType::F32 {
        assert_close(
            &format!("rope round trip {what}"),
            Rule::Reduction,
            T::DTYPE,
            4,
            &dev.get(s),
            &x,
        );
    }
}

fn rope_all<T: DeviceElement>() {
    let s = stream();
    // (B, T, H, KV, D, R): LLaMA (full rotary), grouped k, ChatGLM-style half rotary, an odd
    // number of pairs (the scalar path), D = 256, more tokens than one block's pairs.
    let shapes = [
        (2, 6, 4, 2, 64, 64),
        (1, 7, 2, 1, 32, 16),
        (1, 3, 2, 2, 10, 6),
        (1, 2, 1, 1, 256, 256),
        (1, 40, 2, 1, 16, 16),
    ];
    for (i, &(b, t, h, kv, d, r)) in shapes.iter().enumerate() {
        for interleaved in [false, true] {
            for off in [0, 1] {
                rope_case::<T>(&s, b, t, h, kv, d, r, interleaved, off, 70 + i as u64);
            }
        }
    }
}

#[test]
fn rope_f32_every_layout_matches_the_reference() {
    rope_all::<f32>();
}

#[test]
fn rope_f16_every_layout_matches_the_reference() {
    rope_all::<f16>();
}

#[test]
fn rope_bf16_every_layout_matches_the_reference() {
    rope_all::<bf16>();
}

/// Far positions (the f32 angle pos·f is formed exactly): position 131071 against the f64
/// reference at f32 tolerance, llama3 frequencies.
#[test]
fn rope_far_positions_keep_f32_accuracy() {
    let s = stream();
    let (t, h, d) = (4, 1, 128);
    let scaling = RopeScaling::Llama3 {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 8192.0,
    };
    let freqs = ops::rope_frequencies(500000.0, d, scaling).unwrap();
    let pos = [0, 8191, 65537, 131071];
    let x: Vec<f32> = Rng(3).vec(t * h * d, 1.0);
    let p = RopeParams {
        batch: 1,
        seq: t,
        heads: h,
        head_dim: d,
        rotary_dim: d,
        interleaved: false,
    };
    let layout = AttentionLayout::bthd(t, h, d);
    let mut want = x.clone();
    cpu::rope_forward(Rope::<Host, f32> {
        params: p,
        x: &mut want,
        layout,
        positions: &pos,
        freqs: &freqs,
    })
    .unwrap();
    let mut dx = upload(&s, &x);
    ops::rope_forward(
        &s,
        Rope {
            params: p,
            x: &mut dx,
            layout,
            positions: &up_i32(&s, &pos),
            freqs: &upload(&s, &freqs),
        },
    )
    .unwrap();
    assert_close(
        "far rope",
        Rule::Reduction,
        DType::F32,
        2,
        &dx.to_vec(&s).unwrap(),
        &want,
    );
}
