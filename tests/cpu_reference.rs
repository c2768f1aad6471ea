//! The CPU reference's threaded paths agree with straightforward serial computations, and each
//! dtype rounds the same f64 result.

mod cpu_common;

use cpu_common::{cast, LayerNormData, Normal};
use half::{bf16, f16};
use hip_kernels::cpu;
use hip_kernels::ops::{
    AttentionBackward, AttentionForward, AttentionParams, LayerNormBackward, LayerNormForward,
    LayerNormParams, Matmul, MatmulParams,
};
use hip_kernels::params::{DeviceElement, Host};

/// Plain triple loop, f64, same summation order as the reference.
fn naive_matmul(s: &MatmulParams, a: &[f64], b: &[f64], c: &[f64]) -> Vec<f64> {
    let (m, n, k) = (s.m, s.n, s.k);
    let (alpha, beta) = (f64::from(s.alpha), f64::from(s.beta));
    let mut out = vec![0.0; s.batch * m * n];
    for bi in 0..s.batch {
        let (a, b) = (&a[bi * m * k..], &b[bi * k * n..]);
        for i in 0..m {
            for j in 0..n {
                let mut acc = 0.0;
                for p in 0..k {
                    let x = if s.trans_a {
                        a[p * m + i]
                    } else {
                        a[i * k + p]
                    };
                    let y = if s.trans_b {
                        b[j * k + p]
                    } else {
                        b[p * n + j]
                    };
                    acc += x * y;
                }
                let o = bi * m * n + i * n + j;
                out[o] = alpha * acc + beta * c[o];
            }
        }
    }
    out
}

fn matmul_all_dtypes<T: DeviceElement>(rng: &mut Normal) {
    for (trans_a, trans_b) in [(false, false), (true, false), (false, true), (true, true)] {
        let s = MatmulParams {
            batch: 3,
            m: 37,
            n: 41,
            k: 53,
            trans_a,
            trans_b,
            alpha: 1.5,
            beta: -0.5,
            layout: hip_kernels::ops::MatmulLayout::PACKED,
        };
        let (a, b, c) = (
            cast::<T>(&rng.vec(s.a_len().unwrap())),
            cast::<T>(&rng.vec(s.b_len().unwrap())),
            cast::<T>(&rng.vec(s.out_len().unwrap())),
        );
        let wide = |x: &[T]| x.iter().map(|v| v.to_f64()).collect::<Vec<_>>();
        let want: Vec<T> = cast(&naive_matmul(&s, &wide(&a), &wide(&b), &wide(&c)));
        let mut out = c.clone();
        cpu::matmul(Matmul::<Host, T> {
            params: s,
            a: &a,
            b: &b,
            out: &mut out,
        })
        .unwrap();
        assert_eq!(
            out,
            want,
            "{:?} trans_a={trans_a} trans_b={trans_b}",
            T::DTYPE
        );
    }
}

#[test]
fn threaded_matmul_equals_the_triple_loop() {
    let mut rng = Normal::new(1);
    matmul_all_dtypes::<f32>(&mut rng);
    matmul_all_dtypes::<f16>(&mut rng);
    matmul_all_dtypes::<bf16>(&mut rng);
}

/// `cpu::attention_forward` on f32 slices, unwrapped.
fn fwd(params: AttentionParams, q: &[f32], k: &[f32], v: &[f32], out: &mut [f32], lse: &mut [f32]) {
    cpu::attention_forward(AttentionForward::<Host, f32> {
        params,
        q,
        k,
        v,
        out,
        lse,
        cu_seqlens: None,
    })
    .unwrap();
}

#[test]
fn threaded_attention_equals_per_head_calls() {
    let mut rng = Normal::new(2);
    let s = AttentionParams {
        batch: 2,
        heads: 4,
        n_kv_heads: 4,
        tq: 24,
        tk: 40,
        head_dim: 16,
        causal: true,
        scale: 0.25,
    };
    let (q, k, v, dout) = (
        cast::<f32>(&rng.vec(s.q_len().unwrap())),
        cast::<f32>(&rng.vec(s.kv_len().unwrap())),
        cast::<f32>(&rng.vec(s.kv_len().unwrap())),
        cast::<f32>(&rng.vec(s.q_len().unwrap())),
    );
    let (mut out, mut lse) = (vec![0.0f32; q.len()], vec![0.0f32; s.lse_len().unwrap()]);
    fwd(s, &q, &k, &v, &mut out, &mut lse);
    let (mut dq, mut dk, mut dv) = (
        vec![0.0f32; q.len()],
        vec![0.0f32; k.len()],
        vec![0.0f32; v.len()],
    );
    cpu::attention_backward(AttentionBackward::<Host, f32> {
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
    let one = AttentionParams {
        batch: 1,
        heads: 1,
        n_kv_heads: 1,
        ..s
    };
    let (nq, nk, d) = (s.tq * s.head_dim, s.tk * s.head_dim, s.head_dim);
    for h in 0..s.batch * s.heads {
        let (qs, ks, vs) = (&q[h * nq..][..nq], &k[h * nk..][..nk], &v[h * nk..][..nk]);
        let (mut o1, mut l1) = (vec![0.0f32; nq], vec![0.0f32; s.tq]);
        fwd(one, qs, ks, vs, &mut o1, &mut l1);
        assert_eq!(
            (&o1[..], &l1[..]),
            (&out[h * nq..][..nq], &lse[h * s.tq..][..s.tq]),
            "head {h}"
        );
        let (mut dq1, mut dk1, mut dv1) = (vec![0.0f32; nq], vec![0.0f32; nk], vec![0.0f32; nk]);
        cpu::attention_backward(AttentionBackward::<Host, f32> {
            params: one,
            q: qs,
            k: ks,
            v: vs,
            out: &o1,
            dout: &dout[h * nq..][..nq],
            lse: &l1,
            dq: &mut dq1,
            dk: &mut dk1,
            dv: &mut dv1,
            cu_seqlens: None,
        })
        .unwrap();
        assert_eq!(
            (&dq1[..], &dk1[..], &dv1[..]),
            (
                &dq[h * nq..][..nq],
                &dk[h * nk..][..nk],
                &dv[h * nk..][..nk]
            ),
            "head {h}"
        );
    }
    // Softmax rows sum to one: with v = 1 everywhere, every visible row of out is 1.
    let ones = vec![1.0f32; v.len()];
    fwd(s, &q, &k, &ones, &mut out, &mut lse);
    assert!(
        out.iter().all(|&o| (o - 1.0).abs() < 1e-6),
        "a softmax row does not sum to 1 (head_dim {d})"
    );
}

#[test]
fn threaded_layernorm_equals_per_row_calls() {
    let mut rng = Normal::new(3);
    let s = LayerNormParams {
        rows: 300,
        cols: 64,
        eps: 1e-5,
    };
    let mut d = LayerNormData::<bf16>::random(&mut rng, &s);
    d.forward(&s).unwrap();
    d.backward(&s).unwrap();
    let one = LayerNormParams { rows: 1, ..s };
    let (mut dw_sum, mut db_sum) = (vec![0.0f64; s.cols], vec![0.0f64; s.cols]);
    for r in 0..s.rows {
        let row = r * s.cols..(r + 1) * s.cols;
        let (mut y1, mut m1, mut r1) = (vec![bf16::ZERO; s.cols], [0.0f32], [0.0f32]);
        cpu::layernorm_forward(LayerNormForward::<Host, bf16> {
            params: one,
            x: &d.x[row.clone()],
            weight: &d.weight,
            bias: &d.bias,
            y: &mut y1,
            mean: &mut m1,
            rstd: &mut r1,
        })
        .unwrap();
        assert_eq!(
            (&y1[..], m1[0], r1[0]),
            (&d.y[row.clone()], d.mean[r], d.rstd[r]),
            "row {r}"
        );
        let (mut dx1, mut dw1, mut db1) = (
            vec![bf16::ZERO; s.cols],
            vec![0.0f32; s.cols],
            vec![0.0f32; s.cols],
        );
        let (x32, w32, dy32) = (
            d.x[row.clone()]
                .iter()
                .map(|v| v.to_f32())
                .collect::<Vec<_>>(),
            d.weight.iter().map(|v| v.to_f32()).collect::<Vec<_>>(),
            d.dy[row.clone()]
                .iter()
                .map(|v| v.to_f32())
                .collect::<Vec<_>>(),
        );
        let mut dx32 = vec![0.0f32; s.cols];
        cpu::layernorm_backward(LayerNormBackward::<Host, f32> {
            params: one,
            x: &x32,
            weight: &w32,
            dy: &dy32,
            mean: &m1,
            rstd: &r1,
            dx: &mut dx32,
            dweight: &mut dw1,
            dbias: &mut db1,
            accumulate: false,
        })
        .unwrap();
        cpu::layernorm_backward(LayerNormBackward::<Host, bf16> {
            params: one,
            x: &d.x[row.clone()],
            weight: &d.weight,
            dy: &d.dy[row.clone()],
            mean: &m1,
            rstd: &r1,
            dx: &mut dx1,
            dweight: &mut vec![bf16::ZERO; s.cols],
            dbias: &mut vec![bf16::ZERO; s.cols],
            accumulate: false,
        })
        .unwrap();
        assert_eq!(&dx1[..], &d.dx[row], "row {r}");
        // The f32 run of the same (exactly representable) row rounds to the same bf16 values.
        assert_eq!(
            dx32.iter().map(|v| bf16::from_f32(*v)).collect::<Vec<_>>(),
            dx1,
            "row {r}"
        );
        dw_sum
            .iter_mut()
            .zip(&dw1)
            .for_each(|(a, v)| *a += f64::from(*v));
        db_sum
            .iter_mut()
            .zip(&db1)
            .for_each(|(a, v)| *a += f64::from(*v));
    }
    for c in 0..s.cols {
        // Per-row f32 partials summed in f64 agree with the full reduction to bf16 resolution.
        assert!(
            (d.dweight[c].to_f64() - dw_sum[c]).abs() <= 1e-2 * dw_sum[c].abs() + 1e-3,
            "dweight[{c}]"
        );
        assert!(
            (d.dbias[c].to_f64() - db_sum[c]).abs() <= 1e-2 * db_sum[c].abs() + 1e-3,
            "dbias[{c}]"
        );
    }
}
