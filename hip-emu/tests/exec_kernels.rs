//! hip-emu executor: the repository's real kernels (kernels/*.hip compiled for the host) run
//! from the registry on host buffers and compared with f64 loops. Emulated on the CPU: the
//! timings printed here are not device performance figures.

mod common;

use common::{arg, available, launch, ptr, Opts};

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn assert_close(got: &[f32], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g as f64 - w).abs();
        assert!(
            err <= tol * (1.0 + w.abs()),
            "{what}[{i}]: got {g}, want {w} (error {err:e})"
        );
    }
}

fn layernorm_reference(
    x: &[f32],
    w: &[f32],
    b: &[f32],
    rows: usize,
    c: usize,
    eps: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (mut y, mut mean, mut rstd) = (vec![0.0; rows * c], vec![0.0; rows], vec![0.0; rows]);
    for r in 0..rows {
        let row = &x[r * c..(r + 1) * c];
        let m = row.iter().map(|&v| v as f64).sum::<f64>() / c as f64;
        let var = row.iter().map(|&v| (v as f64 - m).powi(2)).sum::<f64>() / c as f64;
        let s = 1.0 / (var + eps).sqrt();
        for j in 0..c {
            y[r * c + j] = (row[j] as f64 - m) * s * w[j] as f64 + b[j] as f64;
        }
        mean[r] = m;
        rstd[r] = s;
    }
    (y, mean, rstd)
}

#[test]
fn layernorm_forward_matches_f64_on_odd_and_vector_widths_in_both_modes() {
    if !available() {
        return;
    }
    // (rows, C, row_per_wave, block): odd C takes the scalar layout; 256 the cached vector one;
    // 3000 streams; wave mode and block mode; a 96-thread block in block mode.
    for &(rows, c, per_wave, block) in &[
        (7usize, 77usize, 1i32, 256u32),
        (5, 77, 0, 96),
        (9, 256, 1, 256),
        (3, 3000, 0, 256),
    ] {
        let x = values(rows * c, 1 + c as u64);
        let w = values(c, 2);
        let b = values(c, 3);
        let mut y = vec![f32::NAN; rows * c];
        let mut mean = vec![f32::NAN; rows];
        let mut rstd = vec![f32::NAN; rows];
        let eps = 1e-5f32;
        launch(
            "layernorm_fwd_f32",
            [2, 1, 1],
            [block, 1, 1],
            &[
                ptr(x.as_ptr()),
                ptr(w.as_ptr()),
                ptr(b.as_ptr()),
                ptr(y.as_mut_ptr()),
                ptr(mean.as_mut_ptr()),
                ptr(rstd.as_mut_ptr()),
                arg(rows as i64),
                arg(c as i32),
                arg(eps),
                arg(per_wave),
            ],
            Opts {
                max_flat: 1024,
                seed: Some(rows as u64),
                ..Opts::default()
            },
        )
        .unwrap();
        let (ry, rm, rs) = layernorm_reference(&x, &w, &b, rows, c, eps as f64);
        let what = format!("rows {rows} C {c} per_wave {per_wave}");
        assert_close(&y, &ry, 1e-5, &format!("y {what}"));
        assert_close(&mean, &rm, 1e-6, &format!("mean {what}"));
        assert_close(&rstd, &rs, 1e-5, &format!("rstd {what}"));
    }
}

/// kernels/adamw.hip's AdamwTensor (72 bytes: per-tensor `1 − lr·wd` and `lr / (1 − β1^t)`).
#[repr(C)]
#[derive(Clone, Copy)]
struct AdamwTensor {
    param: *mut f32,
    grad: *const f32,
    exp_avg: *mut f32,
    exp_avg_sq: *mut f32,
    max_exp_avg_sq: *mut f32,
    master: *mut f32,
    numel: i64,
    first_chunk: i64,
    decay: f32,
    step_size: f32,
}

#[test]
fn adamw_matches_f64_over_two_tensors_with_tails() {
    if !available() {
        return;
    }
    let sizes = [1001usize, 37];
    let chunk = 256usize;
    let (b1, b2, eps, step) = (0.9f64, 0.999f64, 1e-8f64, 3i32);
    // Per tensor (table row): its own lr and weight decay.
    let (lrs, wds) = ([1e-2f64, 5e-3], [0.1f64, 0.0]);
    let mut p: Vec<Vec<f32>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| values(n, 10 + i as u64))
        .collect();
    let g: Vec<Vec<f32>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| values(n, 20 + i as u64))
        .collect();
    let mut m: Vec<Vec<f32>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| values(n, 30 + i as u64).iter().map(|v| v * 0.1).collect())
        .collect();
    let mut v: Vec<Vec<f32>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            values(n, 40 + i as u64)
                .iter()
                .map(|v| v.abs() * 0.01)
                .collect()
        })
        .collect();
    let (p0, m0, v0) = (p.clone(), m.clone(), v.clone());
    let bias1 = 1.0 - b1.powi(step);
    let bias2 = 1.0 - b2.powi(step);
    let mut table = Vec::new();
    let mut first = 0i64;
    for i in 0..sizes.len() {
        table.push(AdamwTensor {
            param: p[i].as_mut_ptr(),
            grad: g[i].as_ptr(),
            exp_avg: m[i].as_mut_ptr(),
            exp_avg_sq: v[i].as_mut_ptr(),
            max_exp_avg_sq: std::ptr::null_mut(),
            master: std::ptr::null_mut(),
            numel: sizes[i] as i64,
            first_chunk: first,
            decay: (1.0 - lrs[i] * wds[i]) as f32,
            step_size: (lrs[i] / bias1) as f32,
        });
        first += sizes[i].div_ceil(chunk) as i64;
    }
    // kernels/adamw.hip's AdamwTable: 24 rows by value (1728 bytes of kernel arguments).
    let mut by_value = [AdamwTensor {
        param: std::ptr::null_mut(),
        grad: std::ptr::null(),
        exp_avg: std::ptr::null_mut(),
        exp_avg_sq: std::ptr::null_mut(),
        max_exp_avg_sq: std::ptr::null_mut(),
        master: std::ptr::null_mut(),
        numel: 0,
        first_chunk: 0,
        decay: 0.0,
        step_size: 0.0,
    }; 24];
    by_value[..table.len()].copy_from_slice(&table);
    let args = [
        arg(by_value),
        arg(table.len() as i32),
        arg(first),
        arg(chunk as i64),
        arg(b1 as f32),
        arg((1.0 - b1) as f32),
        arg(b2 as f32),
        arg((1.0 - b2) as f32),
        arg(eps as f32),
        arg(bias2.sqrt() as f32),
        arg(0i32),
        arg(0i32),
        ptr(std::ptr::null::<f32>()),
        ptr(std::ptr::null::<f32>()),
    ];
    launch(
        "adamw_f32",
        [3, 1, 1],
        [256, 1, 1],
        &args,
        Opts {
            max_flat: 256,
            seed: Some(9),
            ..Opts::default()
        },
    )
    .unwrap();
    for i in 0..sizes.len() {
        let (mut wp, mut wm, mut wv) = (
            vec![0.0; sizes[i]],
            vec![0.0; sizes[i]],
            vec![0.0; sizes[i]],
        );
        for e in 0..sizes[i] {
            let gr = g[i][e] as f64;
            let mm = b1 * m0[i][e] as f64 + (1.0 - b1) * gr;
            let vv = b2 * v0[i][e] as f64 + (1.0 - b2) * gr * gr;
            let denom = vv.sqrt() / bias2.sqrt() + eps;
            wp[e] = p0[i][e] as f64 * (1.0 - lrs[i] * wds[i]) - lrs[i] / bias1 * mm / denom;
            wm[e] = mm;
            wv[e] = vv;
        }
        assert_close(&p[i], &wp, 1e-5, &format!("param {i}"));
        assert_close(&m[i], &wm, 1e-6, &format!("exp_avg {i}"));
        assert_close(&v[i], &wv, 1e-6, &format!("exp_avg_sq {i}"));
    }
}

fn matmul_reference(a: &[f32], b: &[f32], m: usize, n: usize, k: usize, alpha: f64) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let s: f64 = (0..k)
                .map(|l| a[i * k + l] as f64 * b[l * n + j] as f64)
                .sum();
            out[i * n + j] = alpha * s;
        }
    }
    out
}

fn run_matmul(
    name: &str,
    m: usize,
    n: usize,
    k: usize,
    tile: usize,
) -> (Vec<f32>, std::time::Duration) {
    let a = values(m * k, 5);
    let b = values(k * n, 6);
    let c = vec![f32::NAN; m * n]; // beta = 0: C is never read
    let mut out = vec![f32::NAN; m * n];
    let args = [
        ptr(a.as_ptr()),
        ptr(b.as_ptr()),
        ptr(c.as_ptr()),
        ptr(out.as_mut_ptr()),
        arg(m as i32),
        arg(n as i32),
        arg(k as i32),
        arg(k as i64),
        arg(n as i64),
        arg(n as i64),
        arg(n as i64),
        arg(0i64),
        arg(0i64),
        arg(0i64),
        arg(0i64),
        arg(0.5f32),
        arg(0.0f32),
    ];
    let grid = [n.div_ceil(tile) as u32, m.div_ceil(tile) as u32, 1];
    let t0 = std::time::Instant::now();
    launch(
        name,
        grid,
        [256, 1, 1],
        &args,
        Opts {
            max_flat: 256,
            ..Opts::default()
        },
    )
    .unwrap();
    let took = t0.elapsed();
    let want = matmul_reference(&a, &b, m, n, k, 0.5);
    assert_close(&out, &want, 1e-5, &format!("{name} {m}x{n}x{k}"));
    (out, took)
}

#[test]
fn matmul_edge_tiles_match_f64_and_report_emulated_time() {
    if !available() {
        return;
    }
    run_matmul("matmul_small_nn_f32", 70, 130, 33, 64);
    let (_, took) = run_matmul("matmul_nn_f32", 256, 256, 256, 128);
    // Emulated on the CPU: not a performance figure.
    eprintln!(
        "hip-emu (emulated, not a performance figure): matmul_nn_f32 256x256x256 in {took:?}"
    );
}

/// Forward attention in f64: out [bh][tq][d] and lse [bh][tq] (natural log; -inf for a row that
/// sees no key).
#[allow(clippy::too_many_arguments)]
fn attention_reference(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    bh: usize,
    tq: usize,
    tk: usize,
    d: usize,
    scale: f64,
    causal: bool,
) -> (Vec<f64>, Vec<f64>) {
    let mut out = vec![0.0; bh * tq * d];
    let mut lse = vec![f64::NEG_INFINITY; bh * tq];
    for b in 0..bh {
        for i in 0..tq {
            let last = if causal {
                (i + tk) as i64 - tq as i64
            } else {
                tk as i64 - 1
            }
            .min(tk as i64 - 1);
            if last < 0 {
                continue;
            }
            let qi = &q[(b * tq + i) * d..(b * tq + i + 1) * d];
            let s: Vec<f64> = (0..=last as usize)
                .map(|j| {
                    let kj = &k[(b * tk + j) * d..(b * tk + j + 1) * d];
                    scale
                        * qi.iter()
                            .zip(kj)
                            .map(|(&x, &y)| x as f64 * y as f64)
                            .sum::<f64>()
                })
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let l: f64 = s.iter().map(|x| (x - m).exp()).sum();
            lse[b * tq + i] = m + l.ln();
            for (j, sj) in s.iter().enumerate() {
                let p = (sj - m).exp() / l;
                for c in 0..d {
                    out[(b * tq + i) * d + c] += p * v[(b * tk + j) * d + c] as f64;
                }
            }
        }
    }
    (out, lse)
}

#[test]
fn attention_forward_matches_f64_causal_with_tq_below_tk_and_an_odd_head_dim() {
    if !available() {
        return;
    }
    // D = 50 runs in the d64 bucket (scalar tails); Tq < Tk; 70 queries span two row tiles.
    let (bh, tq, tk, d) = (2usize, 70usize, 93usize, 50usize);
    let q = values(bh * tq * d, 11);
    let k = values(bh * tk * d, 12);
    let v = values(bh * tk * d, 13);
    let scale = 1.0 / (d as f32).sqrt();
    for causal in [0i32, 1] {
        let mut out = vec![f32::NAN; bh * tq * d];
        let mut lse = vec![f32::NAN; bh * tq];
        // Packed [1, bh, t, d] as the kernels' Strides { batch, head, seq } (i64 elements; the
        // batch of extent 1 gets 0) and lse's RowStrides { batch, head }; grid (tiles, H, B).
        let (q_strides, kv_strides) = (
            [0i64, (tq * d) as i64, d as i64],
            [0i64, (tk * d) as i64, d as i64],
        );
        let args = [
            ptr(q.as_ptr()),
            arg(q_strides),
            ptr(k.as_ptr()),
            arg(kv_strides),
            ptr(v.as_ptr()),
            arg(kv_strides),
            ptr(out.as_mut_ptr()),
            arg(q_strides),
            ptr(lse.as_mut_ptr()),
            arg([0i64, tq as i64]),
            arg(tq as i32),
            arg(tk as i32),
            arg(d as i32),
            arg(scale),
            arg(causal),
            // group (query heads per key/value head), cu_seqlens (none), its length.
            arg(1i32),
            ptr(std::ptr::null::<i32>()),
            arg(0i32),
        ];
        let t0 = std::time::Instant::now();
        launch(
            "attention_fwd_d64_f32",
            [tq.div_ceil(64) as u32, bh as u32, 1],
            [256, 1, 1],
            &args,
            Opts {
                max_flat: 256,
                ..Opts::default()
            },
        )
        .unwrap();
        let took = t0.elapsed();
        let (want, want_lse) =
            attention_reference(&q, &k, &v, bh, tq, tk, d, scale as f64, causal != 0);
        assert_close(&out, &want, 1e-5, &format!("out causal {causal}"));
        assert_close(&lse, &want_lse, 1e-5, &format!("lse causal {causal}"));
        eprintln!("hip-emu (emulated, not a performance figure): attention_fwd_d64_f32 bh {bh} tq {tq} tk {tk} causal {causal} in {took:?}");
    }
}
