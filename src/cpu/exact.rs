//! The f64 cores of layer norm and attention: every input, intermediate and output in f64.
//!
//! The storage-typed functions in [`crate::cpu`] widen their inputs, call these and round the
//! outputs once. They are public for finite-difference checks and for callers who want the
//! unrounded values.
//!
//! Validation lives here only: the typed functions pass f64 buffers of exactly their own
//! lengths, so they get the same [`ShapeError`], and round into their outputs only after the
//! core has returned `Ok`.

use super::par_for_each;
use crate::ops::attention::varlen::{check_rows, key_range};
use crate::ops::{
    AttentionBackward, AttentionForward, AttentionParams, LayerNormBackward, LayerNormForward,
};
use crate::params::{Exact, ShapeError};

/// f64 layer norm forward: `y = (x − mean)·rstd·weight + bias` per row, biased variance,
/// `rstd = 1/√(var + eps)`.
pub fn layernorm_forward(a: LayerNormForward<'_, Exact, f64>) -> Result<(), ShapeError> {
    a.validate()?;
    let LayerNormForward {
        params: shape,
        x,
        weight,
        bias,
        y,
        mean,
        rstd,
    } = a;
    let eps = shape.eps;
    let c = shape.cols;
    let eps = f64::from(eps);
    let items: Vec<_> = y
        .chunks_mut(c)
        .zip(x.chunks(c))
        .zip(mean.iter_mut().zip(rstd.iter_mut()))
        .collect();
    par_for_each(
        items,
        shape.rows.saturating_mul(c).saturating_mul(8),
        |((y, x), (mu, rs))| {
            let m = x.iter().sum::<f64>() / c as f64;
            let var = x.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / c as f64;
            let r = 1.0 / (var + eps).sqrt();
            for (((yo, xv), w), b) in y.iter_mut().zip(x).zip(weight).zip(bias) {
                *yo = (xv - m) * r * w + b;
            }
            (*mu, *rs) = (m, r);
        },
    );
    Ok(())
}

/// f64 layer norm backward from the saved `mean` and `rstd`: with `x̂ = (x − mean)·rstd` and
/// `g = dy·weight`, `dx = rstd·(g − mean(g) − x̂·mean(g·x̂))`, `dweight = Σ_rows dy·x̂`,
/// `dbias = Σ_rows dy`, added into the outputs with `accumulate`, else overwriting them.
pub fn layernorm_backward(a: LayerNormBackward<'_, Exact, f64>) -> Result<(), ShapeError> {
    a.validate()?;
    let LayerNormBackward {
        params: shape,
        x,
        weight,
        dy,
        mean,
        rstd,
        dx,
        dweight,
        dbias,
        accumulate,
    } = a;
    let c = shape.cols;
    if !accumulate {
        dweight.fill(0.0);
        dbias.fill(0.0);
    }
    for (((x, dy), m), r) in x.chunks(c).zip(dy.chunks(c)).zip(mean).zip(rstd) {
        for (((dw, db), xv), g) in dweight.iter_mut().zip(dbias.iter_mut()).zip(x).zip(dy) {
            *dw += g * (xv - m) * r;
            *db += g;
        }
    }
    let items: Vec<_> = dx
        .chunks_mut(c)
        .zip(x.chunks(c).zip(dy.chunks(c)))
        .zip(mean.iter().zip(rstd))
        .collect();
    par_for_each(
        items,
        shape.rows.saturating_mul(c).saturating_mul(8),
        |((dx, (x, dy)), (m, r))| {
            let (mut mg, mut mgx) = (0.0, 0.0);
            for ((xv, g), w) in x.iter().zip(dy).zip(weight) {
                let gw = g * w;
                mg += gw;
                mgx += gw * (xv - m) * r;
            }
            let (mg, mgx) = (mg / c as f64, mgx / c as f64);
            for (((d, xv), g), w) in dx.iter_mut().zip(x).zip(dy).zip(weight) {
                let v = r * (g * w - mg - (xv - m) * r * mgx);
                *d = if accumulate { *d + v } else { v };
            }
        },
    );
    Ok(())
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// `cu_seqlens` of the f64 core (each entry an integer, as widened from i32) checked and made
/// integers: `None` without variable-length sequences.
fn seq_starts(p: &AttentionParams, cu: Option<&[f64]>) -> Result<Option<Vec<i64>>, ShapeError> {
    let Some(cu) = cu else { return Ok(None) };
    let wide: Vec<i64> = cu
        .iter()
        .map(|&x| {
            if x.fract() == 0.0 && x.abs() < 9e15 {
                x as i64
            } else {
                -1
            }
        })
        .collect();
    check_rows(p, &wide)?;
    Ok(Some(wide))
}

/// The starts of batch `b`'s row (`None` without `cu_seqlens`).
fn row_of(cu: &Option<Vec<i64>>, per_row: usize, b: usize) -> Option<&[i64]> {
    cu.as_deref().map(|c| &c[b * per_row..(b + 1) * per_row])
}

/// f64 attention forward: `out = softmax(scale·Q·Kᵀ + mask)·V`, `lse` = natural log-sum-exp of
/// the scaled visible scores; a query with no visible key (or a padding position of
/// `cu_seqlens`) gets `out = 0`, `lse = −inf`. Query head `h` reads key/value head
/// `h / (heads / n_kv_heads)`.
pub fn attention_forward(a: AttentionForward<'_, Exact, f64>) -> Result<(), ShapeError> {
    a.validate()?;
    let AttentionForward {
        params,
        q,
        k,
        v,
        out,
        lse,
        cu_seqlens,
    } = a;
    let shape = &params;
    let cu = seq_starts(shape, cu_seqlens)?;
    let per_row = shape.validate_cu_seqlens(cu.as_ref().map(Vec::len))?;
    let (tq, tk, d) = (shape.tq, shape.tk, shape.head_dim);
    let (h, group) = (shape.heads, shape.group());
    let scale = f64::from(shape.scale);
    if shape.batch * h == 0 || tq == 0 {
        return Ok(());
    }
    let items: Vec<_> = out
        .chunks_mut(tq * d)
        .zip(lse.chunks_mut(tq))
        .enumerate()
        .collect();
    let work = (shape.batch * h)
        .saturating_mul(tq)
        .saturating_mul(tk)
        .saturating_mul(2 * d + 1);
    par_for_each(items, work, |(bh, (out, lse))| {
        let (b, kvh) = (bh / h, bh % h / group);
        let bk = b * shape.n_kv_heads + kvh;
        let row = row_of(&cu, per_row, b);
        let (q, k, v) = (
            &q[bh * tq * d..][..tq * d],
            &k[bk * tk * d..][..tk * d],
            &v[bk * tk * d..][..tk * d],
        );
        let mut s = vec![0.0f64; tk];
        for i in 0..tq {
            let o = &mut out[i * d..(i + 1) * d];
            o.fill(0.0);
            let keys = key_range(shape, row, i);
            if keys.is_empty() {
                lse[i] = f64::NEG_INFINITY;
                continue;
            }
            let qi = &q[i * d..(i + 1) * d];
            let s = &mut s[keys.clone()];
            for (j, sj) in keys.clone().zip(s.iter_mut()) {
                *sj = scale * dot(qi, &k[j * d..(j + 1) * d]);
            }
            let mx = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let l = mx + s.iter().map(|x| (x - mx).exp()).sum::<f64>().ln();
            lse[i] = l;
            for (j, sj) in keys.zip(s.iter()) {
                let p = (sj - l).exp();
                for (oo, vv) in o.iter_mut().zip(&v[j * d..(j + 1) * d]) {
                    *oo += p * vv;
                }
            }
        }
    });
    Ok(())
}

/// f64 attention backward as FlashAttention defines it, from the saved `out` and `lse`:
/// `P = exp(scale·q·kᵀ − lse)` over visible keys, `D = rowsum(dout ∘ out)`,
/// `dS = P ∘ (dout·vᵀ − D)`, `dq = scale·dS·k`, `dk = scale·dSᵀ·q`, `dv = Pᵀ·dout`; dk and dv of
/// a key/value head sum over its group's query heads. Rows with no visible key (or
/// `lse = −inf`, or padding) contribute nothing; their `dq` is 0.
pub fn attention_backward(a: AttentionBackward<'_, Exact, f64>) -> Result<(), ShapeError> {
    a.validate()?;
    let AttentionBackward {
        params,
        q,
        k,
        v,
        out,
        dout,
        lse,
        dq,
        dk,
        dv,
        cu_seqlens,
    } = a;
    let shape = &params;
    let cu = seq_starts(shape, cu_seqlens)?;
    let per_row = shape.validate_cu_seqlens(cu.as_ref().map(Vec::len))?;
    let (tq, tk, d) = (shape.tq, shape.tk, shape.head_dim);
    let (kv_heads, group) = (shape.n_kv_heads, shape.group());
    let scale = f64::from(shape.scale);
    dq.fill(0.0);
    dk.fill(0.0);
    dv.fill(0.0);
    if shape.batch * kv_heads == 0 || tq == 0 || tk == 0 {
        return Ok(());
    }
    // One item per (batch, kv head): its dk, dv and the dq of its group's query heads (which
    // are consecutive in [B, H, Tq, D]).
    let items: Vec<_> = dq
        .chunks_mut(group * tq * d)
        .zip(dk.chunks_mut(tk * d).zip(dv.chunks_mut(tk * d)))
        .enumerate()
        .collect();
    let work = (shape.batch * shape.heads)
        .saturating_mul(tq)
        .saturating_mul(tk)
        .saturating_mul(4 * d + 1);
    par_for_each(items, work, |(bk, (dq_group, (dk, dv)))| {
        let row = row_of(&cu, per_row, bk / kv_heads);
        let (k, v) = (&k[bk * tk * d..][..tk * d], &v[bk * tk * d..][..tk * d]);
        for (gi, dq) in dq_group.chunks_mut(tq * d).enumerate() {
            let bh = bk * group + gi;
            let (q, out, dout) = (
                &q[bh * tq * d..][..tq * d],
                &out[bh * tq * d..][..tq * d],
                &dout[bh * tq * d..][..tq * d],
            );
            let lse = &lse[bh * tq..][..tq];
            for (i, &lse_i) in lse.iter().enumerate() {
                let keys = key_range(shape, row, i);
                if keys.is_empty() || lse_i == f64::NEG_INFINITY {
                    continue;
                }
                let row = i * d..(i + 1) * d;
                let (qi, doi) = (&q[row.clone()], &dout[row.clone()]);
                let big_d = dot(doi, &out[row.clone()]);
                for j in keys {
                    let col = j * d..(j + 1) * d;
                    let p = (scale * dot(qi, &k[col.clone()]) - lse_i).exp();
                    let ds = p * (dot(doi, &v[col.clone()]) - big_d);
                    for (((dqv, kv), dkv), (qv, (dvv, dov))) in dq[row.clone()]
                        .iter_mut()
                        .zip(&k[col.clone()])
                        .zip(&mut dk[col.clone()])
                        .zip(qi.iter().zip(dv[col.clone()].iter_mut().zip(doi)))
                    {
                        *dqv += scale * ds * kv;
                        *dkv += scale * ds * qv;
                        *dvv += p * dov;
                    }
                }
            }
        }
    });
    Ok(())
}
