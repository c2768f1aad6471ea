//! Each kernel against the CPU reference on a small built-in case, per device.
//!
//! The cases are generated here (no file needed, so they run wherever the binary runs): odd
//! sizes so vector tails and partial blocks are exercised, every storage type. The device result
//! is compared with `hip_kernels::cpu` on the same inputs, element by element, with the
//! tolerances of [`crate::tolerance`] (the ones the golden tests use).
//!
//! Never run on a GPU: without a device this module is not reached.

use half::{bf16, f16};
use hip_rt::{DeviceBuffer, Stream};

use super::report::Item;
use crate::cpu;
use crate::ops::{self, DeviceElement};
use crate::params::{
    AdamWConfig, AdamWStep, AttentionShape, DType, Element, LayerNormShape, MatmulShape, Op,
};
use crate::tolerance::tolerance;

/// Rows × columns of the layernorm case: columns not a multiple of any vector width.
const LN: LayerNormShape = LayerNormShape {
    rows: 5,
    cols: 1027,
};

/// Elements of the AdamW case: more than one 64 Ki chunk, not a multiple of it.
const ADAMW_LEN: usize = (1 << 16) + 4097;

/// One row per op, each covering f32, f16 and bf16.
pub fn items(stream: &Stream) -> Vec<Item> {
    vec![
        op_item(
            "layernorm_forward",
            stream,
            [
                layernorm_forward::<f32>,
                layernorm_forward::<f16>,
                layernorm_forward::<bf16>,
            ],
        ),
        op_item(
            "layernorm_backward",
            stream,
            [
                layernorm_backward::<f32>,
                layernorm_backward::<f16>,
                layernorm_backward::<bf16>,
            ],
        ),
        op_item("adamw", stream, [adamw::<f32>, adamw::<f16>, adamw::<bf16>]),
        op_item(
            "matmul",
            stream,
            [matmul::<f32>, matmul::<f16>, matmul::<bf16>],
        ),
        op_item(
            "attention",
            stream,
            [attention::<f32>, attention::<f16>, attention::<bf16>],
        ),
    ]
}

type CaseFn = fn(&Stream) -> Result<String, String>;

fn op_item(name: &str, stream: &Stream, cases: [CaseFn; 3]) -> Item {
    super::guard::check(name, || {
        let mut done = Vec::new();
        for case in cases {
            done.push(case(stream)?);
        }
        Ok::<_, String>(done.join("; "))
    })
}

/// Deterministic values in [-2, 2) of both signs, exact in every storage type.
fn values<T: Element>(len: usize, seed: usize) -> Vec<T> {
    (0..len)
        .map(|i| T::from_f32(((i * 131 + seed * 17) % 64) as f32 / 16.0 - 2.0))
        .collect()
}

/// The first element of `got` outside the tolerance for (`op`, `tensor`), as an error.
fn compare<T: Element>(
    op: Op,
    tensor: &str,
    input: DType,
    reduction: usize,
    got: &[T],
    want: &[T],
) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!(
            "{op} {tensor}: {} elements from the device, {} from the CPU",
            got.len(),
            want.len()
        ));
    }
    let tol = tolerance(op, tensor, T::DTYPE, input, reduction);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let (g, w) = (g.to_f64(), w.to_f64());
        if !tol.allows(g, w) {
            return Err(format!(
                "{op} {input} {tensor}[{i}] = {g} on the device, {w} on the CPU ({tol:?})"
            ));
        }
    }
    Ok(())
}

fn upload<T: hip_rt::Element>(
    stream: &Stream,
    v: &[T],
    what: &str,
) -> Result<DeviceBuffer<T>, String> {
    DeviceBuffer::from_slice(stream, v).map_err(|e| format!("uploading {what}: {e}"))
}

fn download<T: hip_rt::Element>(
    stream: &Stream,
    b: &DeviceBuffer<T>,
    what: &str,
) -> Result<Vec<T>, String> {
    b.to_vec(stream)
        .map_err(|e| format!("downloading {what}: {e}"))
}

fn zeroed<T: hip_rt::Element>(
    stream: &Stream,
    len: usize,
    what: &str,
) -> Result<DeviceBuffer<T>, String> {
    DeviceBuffer::zeroed(stream, len).map_err(|e| format!("allocating {what}: {e}"))
}

fn layernorm_forward<T: DeviceElement>(stream: &Stream) -> Result<String, String> {
    let (n, c, eps) = (LN.rows, LN.cols, 1e-5);
    let (x, w, b) = (values::<T>(n * c, 1), values::<T>(c, 2), values::<T>(c, 3));
    let (mut y, mut mean, mut rstd) = (vec![T::from_f32(0.0); n * c], vec![0f32; n], vec![0f32; n]);
    cpu::layernorm_forward(&LN, eps, &x, &w, &b, &mut y, &mut mean, &mut rstd)
        .map_err(|e| format!("CPU reference: {e}"))?;

    let (dx, dw, db) = (
        upload(stream, &x, "x")?,
        upload(stream, &w, "weight")?,
        upload(stream, &b, "bias")?,
    );
    let mut dy = zeroed::<T>(stream, n * c, "y")?;
    let (mut dmean, mut drstd) = (
        zeroed::<f32>(stream, n, "mean")?,
        zeroed::<f32>(stream, n, "rstd")?,
    );
    ops::layernorm_forward(
        stream, &LN, eps, &dx, &dw, &db, &mut dy, &mut dmean, &mut drstd,
    )
    .map_err(|e| e.to_string())?;

    let op = Op::LayerNormForward;
    compare(op, "y", T::DTYPE, c, &download(stream, &dy, "y")?, &y)?;
    compare(
        op,
        "mean",
        T::DTYPE,
        c,
        &download(stream, &dmean, "mean")?,
        &mean,
    )?;
    compare(
        op,
        "rstd",
        T::DTYPE,
        c,
        &download(stream, &drstd, "rstd")?,
        &rstd,
    )?;
    Ok(format!("{} {n}x{c} ok", T::DTYPE))
}

fn layernorm_backward<T: DeviceElement>(stream: &Stream) -> Result<String, String> {
    let (n, c) = (LN.rows, LN.cols);
    let (x, w, b, dy) = (
        values::<T>(n * c, 4),
        values::<T>(c, 5),
        values::<T>(c, 6),
        values::<T>(n * c, 7),
    );
    let (mut y, mut mean, mut rstd) = (vec![T::from_f32(0.0); n * c], vec![0f32; n], vec![0f32; n]);
    cpu::layernorm_forward(&LN, 1e-5, &x, &w, &b, &mut y, &mut mean, &mut rstd)
        .map_err(|e| format!("CPU reference: {e}"))?;
    let zero = T::from_f32(0.0);
    let (mut dx, mut dw, mut db) = (vec![zero; n * c], vec![zero; c], vec![zero; c]);
    cpu::layernorm_backward(&LN, &x, &w, &dy, &mean, &rstd, &mut dx, &mut dw, &mut db)
        .map_err(|e| format!("CPU reference: {e}"))?;

    let (d_x, d_w, d_dy) = (
        upload(stream, &x, "x")?,
        upload(stream, &w, "weight")?,
        upload(stream, &dy, "dy")?,
    );
    let (d_mean, d_rstd) = (
        upload(stream, &mean, "mean")?,
        upload(stream, &rstd, "rstd")?,
    );
    let mut d_dx = zeroed::<T>(stream, n * c, "dx")?;
    let (mut d_dw, mut d_db) = (
        zeroed::<T>(stream, c, "dweight")?,
        zeroed::<T>(stream, c, "dbias")?,
    );
    ops::layernorm_backward(
        stream, &LN, &d_x, &d_w, &d_dy, &d_mean, &d_rstd, &mut d_dx, &mut d_dw, &mut d_db,
    )
    .map_err(|e| e.to_string())?;

    let op = Op::LayerNormBackward;
    compare(op, "dx", T::DTYPE, c, &download(stream, &d_dx, "dx")?, &dx)?;
    compare(
        op,
        "dweight",
        T::DTYPE,
        n,
        &download(stream, &d_dw, "dweight")?,
        &dw,
    )?;
    compare(
        op,
        "dbias",
        T::DTYPE,
        n,
        &download(stream, &d_db, "dbias")?,
        &db,
    )?;
    Ok(format!("{} {n}x{c} ok", T::DTYPE))
}

fn adamw<T: DeviceElement>(stream: &Stream) -> Result<String, String> {
    let len = ADAMW_LEN;
    let config = AdamWConfig {
        lr: 1e-2,
        ..AdamWConfig::default()
    };
    let step = AdamWStep::new(3);
    let mut param = values::<T>(len, 8);
    let grad: Vec<T> = values::<f32>(len, 9)
        .into_iter()
        .map(|g| T::from_f32(g * 1e-2))
        .collect();
    let mut exp_avg: Vec<f32> = values::<f32>(len, 10)
        .into_iter()
        .map(|m| m * 1e-3)
        .collect();
    let mut exp_avg_sq: Vec<f32> = values::<f32>(len, 11)
        .into_iter()
        .map(|v| v.abs() * 1e-5)
        .collect();

    let mut d_param = upload(stream, &param, "param")?;
    let d_grad = upload(stream, &grad, "grad")?;
    let mut d_m = upload(stream, &exp_avg, "exp_avg")?;
    let mut d_v = upload(stream, &exp_avg_sq, "exp_avg_sq")?;
    cpu::adamw(
        &config,
        &step,
        &mut param,
        &grad,
        &mut exp_avg,
        &mut exp_avg_sq,
        None,
    )
    .map_err(|e| format!("CPU reference: {e}"))?;
    ops::adamw(
        stream,
        &config,
        &step,
        &mut d_param,
        &d_grad,
        &mut d_m,
        &mut d_v,
        None,
    )
    .map_err(|e| e.to_string())?;

    let op = Op::AdamW;
    compare(
        op,
        "param",
        T::DTYPE,
        1,
        &download(stream, &d_param, "param")?,
        &param,
    )?;
    compare(
        op,
        "exp_avg",
        T::DTYPE,
        1,
        &download(stream, &d_m, "exp_avg")?,
        &exp_avg,
    )?;
    compare(
        op,
        "exp_avg_sq",
        T::DTYPE,
        1,
        &download(stream, &d_v, "exp_avg_sq")?,
        &exp_avg_sq,
    )?;
    Ok(format!("{} {len} params ok", T::DTYPE))
}

/// The matmul case: batched, A transposed, odd sizes, alpha and beta not 0/1.
const MM: MatmulShape = MatmulShape {
    batch: 2,
    m: 67,
    n: 45,
    k: 129,
    trans_a: true,
    trans_b: false,
};

fn matmul<T: DeviceElement>(stream: &Stream) -> Result<String, String> {
    let (alpha, beta) = (1.5, 0.5);
    let (b, m, n, k) = (MM.batch, MM.m, MM.n, MM.k);
    let (a_h, b_h, c_h) = (
        values::<T>(b * m * k, 12),
        values::<T>(b * k * n, 13),
        values::<T>(b * m * n, 14),
    );
    let mut want = c_h.clone();
    cpu::matmul(&MM, alpha, beta, &a_h, &b_h, &mut want)
        .map_err(|e| format!("CPU reference: {e}"))?;
    let (da, db) = (upload(stream, &a_h, "a")?, upload(stream, &b_h, "b")?);
    let mut dout = upload(stream, &c_h, "out")?;
    ops::matmul(stream, &MM, alpha, beta, &da, &db, &mut dout).map_err(|e| e.to_string())?;
    compare(
        Op::Matmul,
        "out",
        T::DTYPE,
        k,
        &download(stream, &dout, "out")?,
        &want,
    )?;
    Ok(format!("{} {b}x{m}x{n}x{k} (Aᵀ) ok", T::DTYPE))
}

/// The attention case: causal with Tq < Tk (bottom-right aligned), odd lengths, D = 64.
fn attention_shape() -> AttentionShape {
    AttentionShape {
        batch: 1,
        heads: 2,
        tq: 37,
        tk: 53,
        head_dim: 64,
        causal: true,
        scale: AttentionShape::default_scale(64),
    }
}

fn attention<T: DeviceElement>(stream: &Stream) -> Result<String, String> {
    let s = attention_shape();
    let (nq, nk, rows) = (
        s.batch * s.heads * s.tq * s.head_dim,
        s.batch * s.heads * s.tk * s.head_dim,
        s.batch * s.heads * s.tq,
    );
    let (q, k, v, dout) = (
        values::<T>(nq, 15),
        values::<T>(nk, 16),
        values::<T>(nk, 17),
        values::<T>(nq, 18),
    );
    let zero = T::from_f32(0.0);
    let (mut out, mut lse) = (vec![zero; nq], vec![0f32; rows]);
    cpu::attention_forward(&s, &q, &k, &v, &mut out, &mut lse)
        .map_err(|e| format!("CPU reference: {e}"))?;
    let (mut dq, mut dk, mut dv) = (vec![zero; nq], vec![zero; nk], vec![zero; nk]);
    cpu::attention_backward(&s, &q, &k, &v, &out, &dout, &lse, &mut dq, &mut dk, &mut dv)
        .map_err(|e| format!("CPU reference: {e}"))?;

    let (d_q, d_k, d_v) = (
        upload(stream, &q, "q")?,
        upload(stream, &k, "k")?,
        upload(stream, &v, "v")?,
    );
    let (mut d_out, mut d_lse) = (
        zeroed::<T>(stream, nq, "out")?,
        zeroed::<f32>(stream, rows, "lse")?,
    );
    ops::attention_forward(stream, &s, &d_q, &d_k, &d_v, &mut d_out, &mut d_lse)
        .map_err(|e| e.to_string())?;
    let (lq, lk) = (s.tk.max(s.head_dim), s.tq.max(s.head_dim));
    compare(
        Op::AttentionForward,
        "out",
        T::DTYPE,
        lq,
        &download(stream, &d_out, "out")?,
        &out,
    )?;
    compare(
        Op::AttentionForward,
        "lse",
        T::DTYPE,
        lq,
        &download(stream, &d_lse, "lse")?,
        &lse,
    )?;

    // The backward gets the reference's out and lse, so it is judged on its own.
    let (c_out, c_lse, d_dout) = (
        upload(stream, &out, "out")?,
        upload(stream, &lse, "lse")?,
        upload(stream, &dout, "dout")?,
    );
    let (mut g_q, mut g_k, mut g_v) = (
        zeroed::<T>(stream, nq, "dq")?,
        zeroed::<T>(stream, nk, "dk")?,
        zeroed::<T>(stream, nk, "dv")?,
    );
    ops::attention_backward(
        stream, &s, &d_q, &d_k, &d_v, &c_out, &d_dout, &c_lse, &mut g_q, &mut g_k, &mut g_v,
    )
    .map_err(|e| e.to_string())?;
    let op = Op::AttentionBackward;
    compare(op, "dq", T::DTYPE, lq, &download(stream, &g_q, "dq")?, &dq)?;
    compare(op, "dk", T::DTYPE, lk, &download(stream, &g_k, "dk")?, &dk)?;
    compare(op, "dv", T::DTYPE, lk, &download(stream, &g_v, "dv")?, &dv)?;
    Ok(format!(
        "{} causal Tq {} Tk {} D {} fwd+bwd ok",
        T::DTYPE,
        s.tq,
        s.tk,
        s.head_dim
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_reports_the_first_bad_element() {
        let want = [1.0f32, 2.0, 3.0];
        assert!(compare(Op::AdamW, "exp_avg", DType::F32, 1, &want, &want).is_ok());
        let err = compare(
            Op::AdamW,
            "exp_avg",
            DType::F32,
            1,
            &[1.0f32, 2.5, 3.0],
            &want,
        )
        .err()
        .unwrap_or_default();
        assert!(
            err.contains("exp_avg[1] = 2.5 on the device, 2 on the CPU"),
            "{err}"
        );
        let err = compare(Op::AdamW, "exp_avg", DType::F32, 1, &[1.0f32], &want)
            .err()
            .unwrap_or_default();
        assert!(
            err.contains("1 elements from the device, 3 from the CPU"),
            "{err}"
        );
    }

    #[test]
    fn values_are_exact_in_every_type() {
        let a = values::<f32>(100, 3);
        let b: Vec<f32> = values::<bf16>(100, 3)
            .into_iter()
            .map(|v| v.to_f32())
            .collect();
        let c: Vec<f32> = values::<f16>(100, 3)
            .into_iter()
            .map(|v| v.to_f32())
            .collect();
        assert_eq!(a, b);
        assert_eq!(a, c);
        assert!(a.iter().any(|v| *v < 0.0) && a.iter().any(|v| *v > 0.0));
    }
}
