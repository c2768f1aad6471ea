//! The tolerances are wide enough for a kernel and tight enough to matter.
//!
//! `F32Model` is a [`GoldenBackend`] that computes the way a device kernel does, but in the
//! least favourable order: f32 arithmetic with sequential f32 accumulation, and for 16-bit
//! attention backward the FlashAttention roundings (`P` and `dS` stored in the input dtype before
//! the second matmul). Every committed case (and every `HIPK_GOLDEN_DIR` case) must pass with it.
//! A model with one classic bug must fail.

use hip_kernels::golden::{
    case_files, committed_dir, env_dirs, load_case, run_case_with, GoldenBackend, GoldenCase,
    GoldenError, Outputs, TensorData,
};
use hip_kernels::ops::{
    visible_key_range, AdamWCase, AttentionBackwardCase, AttentionForwardCase,
    LayerNormBackwardCase, LayerNormForwardCase, MatmulCase,
};
use hip_kernels::params::{Element, ShapeError};
use hip_kernels::with_dtype;

/// A deliberate defect, to show the golden cases catch it.
#[derive(Clone, Copy, PartialEq)]
enum Bug {
    None,
    /// Unbiased (n − 1) variance in layer norm.
    UnbiasedVariance,
    /// Top-left aligned causal mask (j ≤ i) even when Tq ≠ Tk.
    TopLeftCausal,
    /// AdamW without the second-moment bias correction.
    NoBias2,
    /// Matmul ignoring beta·C.
    NoBeta,
}

struct F32Model(Bug);

fn f32s<T: Element>(t: &TensorData, name: &'static str) -> Result<Vec<f32>, ShapeError> {
    Ok(t.typed::<T>("model", name)?
        .iter()
        .map(|v| v.to_f32())
        .collect())
}

fn store<T: Element>(v: &[f32]) -> TensorData {
    TensorData::from_slice(&v.iter().map(|&x| T::from_f32(x)).collect::<Vec<T>>())
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .fold(0.0f32, |acc, (x, y)| x.mul_add(*y, acc))
}

/// The ops the model computes (their golden cases must all pass with it).
const MODELED: [&str; 6] = [
    "matmul",
    "layernorm_forward",
    "layernorm_backward",
    "attention_forward",
    "attention_backward",
    "adamw",
];

impl GoldenBackend for F32Model {
    type Error = ShapeError;

    fn name(&self) -> String {
        "f32-model".into()
    }

    fn run(&mut self, case: &dyn GoldenCase) -> Result<Outputs, ShapeError> {
        let any = case.as_any();
        if let Some(c) = any.downcast_ref::<MatmulCase>() {
            return self.matmul(c);
        }
        if let Some(c) = any.downcast_ref::<LayerNormForwardCase>() {
            return self.layernorm_forward(c);
        }
        if let Some(c) = any.downcast_ref::<LayerNormBackwardCase>() {
            return self.layernorm_backward(c);
        }
        if let Some(c) = any.downcast_ref::<AttentionForwardCase>() {
            return self.attention_forward(c);
        }
        if let Some(c) = any.downcast_ref::<AttentionBackwardCase>() {
            return self.attention_backward(c);
        }
        if let Some(c) = any.downcast_ref::<AdamWCase>() {
            return self.adamw(c);
        }
        Err(ShapeError::Invalid {
            op: case.op(),
            name: "op",
            value: case.op().to_string(),
            reason: "is not computed by the f32 model",
        })
    }
}

impl F32Model {
    fn matmul(&mut self, c: &MatmulCase) -> Result<Outputs, ShapeError> {
        let s = c.params;
        with_dtype!(c.a.dtype(), T => {
            let (a, b) = (f32s::<T>(&c.a, "a")?, f32s::<T>(&c.b, "b")?);
            let cc = match &c.c { Some(t) => f32s::<T>(t, "c")?, None => vec![0.0; s.out_len()?] };
            let mut out = vec![0.0f32; s.out_len()?];
            for bi in 0..s.batch {
                for i in 0..s.m {
                    for j in 0..s.n {
                        let mut acc = 0.0f32;
                        for p in 0..s.k {
                            let x = if s.trans_a { a[bi * s.m * s.k + p * s.m + i] } else { a[bi * s.m * s.k + i * s.k + p] };
                            let y = if s.trans_b { b[bi * s.k * s.n + j * s.k + p] } else { b[bi * s.k * s.n + p * s.n + j] };
                            acc = x.mul_add(y, acc);
                        }
                        let o = bi * s.m * s.n + i * s.n + j;
                        let beta = if self.0 == Bug::NoBeta { 0.0 } else { s.beta };
                        out[o] = s.alpha * acc + if beta == 0.0 { 0.0 } else { beta * cc[o] };
                    }
                }
            }
            Ok(vec![("out", store::<T>(&out))])
        })
    }

    fn layernorm_forward(&mut self, c: &LayerNormForwardCase) -> Result<Outputs, ShapeError> {
        let n = c.params.cols;
        with_dtype!(c.x.dtype(), T => {
            let (x, w, b) = (f32s::<T>(&c.x, "x")?, f32s::<T>(&c.weight, "weight")?, f32s::<T>(&c.bias, "bias")?);
            let (mut y, mut mean, mut rstd) = (vec![0.0f32; x.len()], Vec::new(), Vec::new());
            for (xr, yr) in x.chunks(n).zip(y.chunks_mut(n)) {
                let m = xr.iter().sum::<f32>() / n as f32;
                let div = if self.0 == Bug::UnbiasedVariance && n > 1 { (n - 1) as f32 } else { n as f32 };
                let var = xr.iter().map(|v| (v - m) * (v - m)).sum::<f32>() / div;
                let r = 1.0 / (var + c.params.eps).sqrt();
                for (((yo, xv), wv), bv) in yr.iter_mut().zip(xr).zip(&w).zip(&b) {
                    *yo = ((xv - m) * r).mul_add(*wv, *bv);
                }
                mean.push(m);
                rstd.push(r);
            }
            Ok(vec![("y", store::<T>(&y)), ("mean", TensorData::F32(mean)), ("rstd", TensorData::F32(rstd))])
        })
    }

    fn layernorm_backward(&mut self, c: &LayerNormBackwardCase) -> Result<Outputs, ShapeError> {
        let n = c.params.cols;
        with_dtype!(c.x.dtype(), T => {
            let (x, w, dy) = (f32s::<T>(&c.x, "x")?, f32s::<T>(&c.weight, "weight")?, f32s::<T>(&c.dy, "dy")?);
            let (mut dx, mut dw, mut db) = (vec![0.0f32; x.len()], vec![0.0f32; n], vec![0.0f32; n]);
            for (r, ((xr, dyr), dxr)) in x.chunks(n).zip(dy.chunks(n)).zip(dx.chunks_mut(n)).enumerate() {
                let (m, rs) = (c.mean[r], c.rstd[r]);
                let (mut mg, mut mgx) = (0.0f32, 0.0f32);
                for i in 0..n {
                    let xh = (xr[i] - m) * rs;
                    let g = dyr[i] * w[i];
                    mg += g;
                    mgx += g * xh;
                    dw[i] += dyr[i] * xh;
                    db[i] += dyr[i];
                }
                let (mg, mgx) = (mg / n as f32, mgx / n as f32);
                for i in 0..n {
                    dxr[i] = rs * (dyr[i] * w[i] - mg - (xr[i] - m) * rs * mgx);
                }
            }
            Ok(vec![("dx", store::<T>(&dx)), ("dweight", store::<T>(&dw)), ("dbias", store::<T>(&db))])
        })
    }

    fn attention_forward(&mut self, c: &AttentionForwardCase) -> Result<Outputs, ShapeError> {
        let s = c.params;
        let (tq, tk, d) = (s.tq, s.tk, s.head_dim);
        with_dtype!(c.q.dtype(), T => {
            let (q, k, v) = (f32s::<T>(&c.q, "q")?, f32s::<T>(&c.k, "k")?, f32s::<T>(&c.v, "v")?);
            let (mut out, mut lse) = (vec![0.0f32; q.len()], vec![0.0f32; s.lse_len()?]);
            for bh in 0..s.batch * s.heads {
                // Grouped-query heads: query head h reads key/value head h / group.
                let bk = bh / s.heads * s.n_kv_heads + bh % s.heads / s.group();
                for i in 0..tq {
                    let keys = visible_key_range(&s, c.cu_seqlens.as_deref(), bh / s.heads, i);
                    let keys = if self.0 == Bug::TopLeftCausal && s.causal { 0..(i + 1).min(tk) } else { keys };
                    let (j0, n) = (keys.start, keys.len());
                    let qi = &q[(bh * tq + i) * d..][..d];
                    let sc: Vec<f32> = keys.map(|j| s.scale * dot(qi, &k[(bk * tk + j) * d..][..d])).collect();
                    let mx = sc.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let l = if n == 0 { f32::NEG_INFINITY } else { mx + sc.iter().map(|x| (x - mx).exp()).sum::<f32>().ln() };
                    lse[bh * tq + i] = l;
                    let o = &mut out[(bh * tq + i) * d..][..d];
                    for (j, sj) in sc.iter().enumerate() {
                        let p = (sj - l).exp();
                        for (oo, vv) in o.iter_mut().zip(&v[(bk * tk + j0 + j) * d..][..d]) {
                            *oo = p.mul_add(*vv, *oo);
                        }
                    }
                }
            }
            Ok(vec![("out", store::<T>(&out)), ("lse", TensorData::F32(lse))])
        })
    }

    fn attention_backward(&mut self, c: &AttentionBackwardCase) -> Result<Outputs, ShapeError> {
        let s = c.params;
        let (tq, tk, d) = (s.tq, s.tk, s.head_dim);
        with_dtype!(c.q.dtype(), T => {
            let round = |x: f32| T::from_f32(x).to_f32();
            let (q, k, v) = (f32s::<T>(&c.q, "q")?, f32s::<T>(&c.k, "k")?, f32s::<T>(&c.v, "v")?);
            let (out, dout) = (f32s::<T>(&c.out, "out")?, f32s::<T>(&c.dout, "dout")?);
            let (mut dq, mut dk, mut dv) = (vec![0.0f32; q.len()], vec![0.0f32; k.len()], vec![0.0f32; v.len()]);
            for bh in 0..s.batch * s.heads {
                let bk = bh / s.heads * s.n_kv_heads + bh % s.heads / s.group();
                for i in 0..tq {
                    let l = c.lse[bh * tq + i];
                    let keys = visible_key_range(&s, c.cu_seqlens.as_deref(), bh / s.heads, i);
                    if keys.is_empty() || l == f32::NEG_INFINITY {
                        continue;
                    }
                    let row = (bh * tq + i) * d;
                    let (qi, doi) = (&q[row..][..d], &dout[row..][..d]);
                    let big_d = dot(doi, &out[row..][..d]);
                    for j in keys {
                        let col = (bk * tk + j) * d;
                        let p = (s.scale * dot(qi, &k[col..][..d]) - l).exp();
                        let ds = round(p * (dot(doi, &v[col..][..d]) - big_d));
                        let p = round(p);
                        for t in 0..d {
                            dq[row + t] = (s.scale * ds).mul_add(k[col + t], dq[row + t]);
                            dk[col + t] = (s.scale * ds).mul_add(qi[t], dk[col + t]);
                            dv[col + t] = p.mul_add(doi[t], dv[col + t]);
                        }
                    }
                }
            }
            Ok(vec![("dq", store::<T>(&dq)), ("dk", store::<T>(&dk)), ("dv", store::<T>(&dv))])
        })
    }

    fn adamw(&mut self, c: &AdamWCase) -> Result<Outputs, ShapeError> {
        let cfg = c.params;
        let (lr, b1, b2, eps, wd) = (
            cfg.lr as f32,
            cfg.beta1 as f32,
            cfg.beta2 as f32,
            cfg.eps as f32,
            cfg.weight_decay as f32,
        );
        with_dtype!(c.param.dtype(), T => {
            let (mut p, g) = (f32s::<T>(&c.param, "param")?, f32s::<T>(&c.grad, "grad")?);
            let (mut m, mut v, mut vmax) = (c.exp_avg.clone(), c.exp_avg_sq.clone(), c.max_exp_avg_sq.clone());
            if !c.found_inf {
                let step = cfg.step as i32;
                let bc1 = 1.0 - b1.powi(step);
                let bc2_sqrt = if self.0 == Bug::NoBias2 { 1.0 } else { (1.0 - b2.powi(step)).sqrt() };
                for i in 0..p.len() {
                    let mut gi = g[i] / c.grad_scale.unwrap_or(1.0);
                    if cfg.maximize {
                        gi = -gi;
                    }
                    p[i] -= lr * wd * p[i];
                    m[i] = b1 * m[i] + (1.0 - b1) * gi;
                    v[i] = b2 * v[i] + (1.0 - b2) * gi * gi;
                    let vu = match vmax.as_mut() {
                        Some(mx) => {
                            mx[i] = mx[i].max(v[i]);
                            mx[i]
                        }
                        None => v[i],
                    };
                    p[i] -= lr / bc1 * m[i] / (vu.sqrt() / bc2_sqrt + eps);
                }
            }
            let mut outs = vec![("param", store::<T>(&p)), ("exp_avg", TensorData::F32(m)), ("exp_avg_sq", TensorData::F32(v))];
            outs.extend(vmax.map(|x| ("max_exp_avg_sq", TensorData::F32(x))));
            Ok(outs)
        })
    }
}

/// Every case (committed and `HIPK_GOLDEN_DIR`) of a modeled op.
fn all_cases() -> Vec<std::path::PathBuf> {
    let mut files = case_files(&committed_dir()).unwrap();
    for dir in env_dirs() {
        files.extend(case_files(&dir).unwrap());
    }
    files.retain(|p| MODELED.contains(&load_case(p).unwrap().op()));
    files
}

#[test]
fn an_f32_kernel_model_passes_every_case() {
    let files = all_cases();
    for op in MODELED {
        assert!(
            files.iter().any(|p| load_case(p).unwrap().op() == op),
            "no {op} case"
        );
    }
    let failures: Vec<String> = files
        .iter()
        .filter_map(|p| {
            run_case_with(&mut F32Model(Bug::None), &load_case(p).unwrap())
                .err()
                .map(|e| e.to_string())
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} cases fail for the f32 model:\n{}",
        failures.len(),
        files.len(),
        failures.join("\n")
    );
}

#[test]
fn classic_bugs_are_caught() {
    let files = all_cases();
    for (bug, prefix) in [
        (Bug::UnbiasedVariance, "layernorm_forward"),
        (Bug::TopLeftCausal, "attention_forward"),
        (Bug::NoBias2, "adamw"),
        (Bug::NoBeta, "matmul"),
    ] {
        let mut caught = 0;
        for p in files.iter().filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
        }) {
            match run_case_with(&mut F32Model(bug), &load_case(p).unwrap()) {
                Err(GoldenError::Mismatch(_)) => caught += 1,
                Err(e) => panic!("{e}"),
                Ok(_) => {}
            }
        }
        assert!(caught >= 3, "bug in {prefix} caught by only {caught} cases");
    }
}
