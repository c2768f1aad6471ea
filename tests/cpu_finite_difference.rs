//! Finite-difference checks, in f64, of the layer norm and attention backward against the
//! reference forward: for a loss `L = Σ forward(inputs) ∘ dy`, every gradient element must match
//! the central difference `(L(x + h) − L(x − h)) / 2h`.

mod cpu_common;

use cpu_common::Normal;
use hip_kernels::cpu::exact;
use hip_kernels::ops::{
    AttentionBackward, AttentionForward, AttentionParams, LayerNormBackward, LayerNormForward,
    LayerNormParams,
};
use hip_kernels::params::Exact;

const H: f64 = 1e-5;

/// Compare `grad` with central differences of `loss` with respect to `x` (every element).
fn check(what: &str, x: &mut [f64], grad: &[f64], loss: &mut dyn FnMut(&[f64]) -> f64) {
    assert_eq!(x.len(), grad.len());
    for i in 0..x.len() {
        let x0 = x[i];
        x[i] = x0 + H;
        let up = loss(x);
        x[i] = x0 - H;
        let down = loss(x);
        x[i] = x0;
        let fd = (up - down) / (2.0 * H);
        let err = (fd - grad[i]).abs();
        assert!(
            err <= 1e-6 * (1.0 + grad[i].abs()),
            "{what}[{i}]: backward {} vs finite difference {fd} (|diff| {err:e})",
            grad[i]
        );
    }
}

fn dotp(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[test]
fn layernorm_backward_matches_finite_differences() {
    let mut rng = Normal::new(7);
    for (rows, cols) in [(1, 1), (3, 5), (4, 17), (1, 64)] {
        let s = LayerNormParams {
            rows,
            cols,
            eps: 1e-5,
        };
        let (mut x, mut w, mut b, dy) = (
            rng.vec(rows * cols),
            rng.vec(cols),
            rng.vec(cols),
            rng.vec(rows * cols),
        );
        let forward = |x: &[f64], w: &[f64], b: &[f64]| {
            let (mut y, mut m, mut r) = (vec![0.0; rows * cols], vec![0.0; rows], vec![0.0; rows]);
            exact::layernorm_forward(LayerNormForward::<Exact, f64> {
                params: s,
                x,
                weight: w,
                bias: b,
                y: &mut y,
                mean: &mut m,
                rstd: &mut r,
            })
            .unwrap();
            (y, m, r)
        };
        let (_, mean, rstd) = forward(&x, &w, &b);
        let (mut dx, mut dw, mut db) = (vec![0.0; rows * cols], vec![0.0; cols], vec![0.0; cols]);
        exact::layernorm_backward(LayerNormBackward::<Exact, f64> {
            params: s,
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
        .unwrap();
        let (w0, b0, x0) = (w.clone(), b.clone(), x.clone());
        check(
            &format!("layernorm {rows}x{cols} dx"),
            &mut x,
            &dx,
            &mut |x| dotp(&forward(x, &w0, &b0).0, &dy),
        );
        check(
            &format!("layernorm {rows}x{cols} dweight"),
            &mut w,
            &dw,
            &mut |w| dotp(&forward(&x0, w, &b0).0, &dy),
        );
        check(
            &format!("layernorm {rows}x{cols} dbias"),
            &mut b,
            &db,
            &mut |b| dotp(&forward(&x0, &w0, b).0, &dy),
        );
    }
}

#[test]
fn attention_backward_matches_finite_differences() {
    let mut rng = Normal::new(11);
    // (batch, heads, tq, tk, head_dim, causal): square causal, Tq < Tk, Tq > Tk (fully masked
    // rows), non-causal with Tq ≠ Tk.
    for (batch, heads, tq, tk, head_dim, causal) in [
        (1, 2, 4, 4, 3, true),
        (1, 1, 3, 6, 4, true),
        (2, 1, 5, 2, 3, true),
        (1, 2, 3, 5, 2, false),
    ] {
        let s = AttentionParams {
            batch,
            heads,
            n_kv_heads: heads,
            tq,
            tk,
            head_dim,
            causal,
            scale: AttentionParams::default_scale(head_dim),
        };
        let (nq, nk) = (s.q_len().unwrap(), s.kv_len().unwrap());
        let (mut q, mut k, mut v, dout) = (rng.vec(nq), rng.vec(nk), rng.vec(nk), rng.vec(nq));
        let forward = |q: &[f64], k: &[f64], v: &[f64]| {
            let (mut out, mut lse) = (vec![0.0; nq], vec![0.0; s.lse_len().unwrap()]);
            exact::attention_forward(AttentionForward::<Exact, f64> {
                params: s,
                q,
                k,
                v,
                out: &mut out,
                lse: &mut lse,
                cu_seqlens: None,
            })
            .unwrap();
            (out, lse)
        };
        let (out, lse) = forward(&q, &k, &v);
        if tq > tk && causal {
            assert_eq!(lse[0], f64::NEG_INFINITY, "first query sees no key");
            assert!(out[..head_dim].iter().all(|&o| o == 0.0));
        }
        let (mut dq, mut dk, mut dv) = (vec![0.0; nq], vec![0.0; nk], vec![0.0; nk]);
        exact::attention_backward(AttentionBackward::<Exact, f64> {
            params: s,
            q: &q,
            k: &k,
            v: &v,
            out: &out,
            dout: &dout,
            lse: &lse,
            dq: &mut dq,
            dk: &mut dk,
            dv: &mut dv,
            cu_seqlens: None,
        })
        .unwrap();
        let (q0, k0, v0) = (q.clone(), k.clone(), v.clone());
        let tag = format!("attention b{batch} h{heads} tq{tq} tk{tk} d{head_dim} causal={causal}");
        check(&format!("{tag} dq"), &mut q, &dq, &mut |q| {
            dotp(&forward(q, &k0, &v0).0, &dout)
        });
        check(&format!("{tag} dk"), &mut k, &dk, &mut |k| {
            dotp(&forward(&q0, k, &v0).0, &dout)
        });
        check(&format!("{tag} dv"), &mut v, &dv, &mut |v| {
            dotp(&forward(&q0, &k0, v).0, &dout)
        });
    }
}
