//! Each kernel against the CPU reference on a small built-in case, per device.
//!
//! The cases are generated here (no file needed, so they run wherever the binary runs): odd
//! sizes so vector tails and partial blocks are exercised, every storage type. Each is an
//! in-memory golden case of its op, so the device run ([`GoldenCase::run_device`]) and the CPU
//! reference ([`GoldenCase::run_cpu`]) take the same inputs, and every output is compared element
//! by element with the op's tolerance ([`GoldenCase::tolerance`], the one the golden tests use).
//!
//! Never run on a GPU: without a device this module is not reached.

use hip_rt::Stream;

use super::report::Item;
use hip_kernels::golden::{GoldenCase, TensorData};
use hip_kernels::ops::{
    AdamWCase, AdamWParams, AttentionBackwardCase, AttentionForwardCase, AttentionParams,
    LayerNormBackwardCase, LayerNormForwardCase, LayerNormParams, LinearCrossEntropyCase,
    LinearCrossEntropyParams, MatmulCase, MatmulParams,
};
use hip_kernels::ops::{LoraBackwardCase, LoraForwardCase, LoraParams};
use hip_kernels::ops::{
    RmsNormBackwardCase, RmsNormForwardCase, RmsNormParams, RmsNormVariant, RopeCase, RopeParams,
    RopeScaling, SwigluBackwardCase, SwigluForwardCase, SwigluParams,
};
use hip_kernels::params::{DType, Element};
use hip_kernels::with_dtype;

/// Rows × columns of the layernorm case: columns not a multiple of any vector width.
const LN: LayerNormParams = LayerNormParams {
    rows: 5,
    cols: 1027,
    eps: 1e-5,
};

/// Elements of the AdamW case: more than one 64 Ki chunk, not a multiple of it.
const ADAMW_LEN: usize = (1 << 16) + 4097;

/// The matmul case: batched, A transposed, odd sizes, alpha and beta not 0/1.
const MM: MatmulParams = MatmulParams {
    batch: 2,
    m: 67,
    n: 45,
    k: 129,
    trans_a: true,
    trans_b: false,
    alpha: 1.5,
    beta: 0.5,
    layout: hip_kernels::ops::MatmulLayout::PACKED,
};

/// The attention case: causal with Tq < Tk (bottom-right aligned), odd lengths, D = 64.
fn attention_params() -> AttentionParams {
    AttentionParams {
        batch: 1,
        heads: 2,
        n_kv_heads: 2,
        tq: 37,
        tk: 53,
        head_dim: 64,
        causal: true,
        scale: AttentionParams::default_scale(64),
    }
}

/// One row per op, each covering f32, f16 and bf16.
pub fn items(stream: &Stream) -> Vec<Item> {
    let ops: [(&str, CaseFn); 17] = [
        ("layernorm_forward", layernorm_forward),
        ("layernorm_backward", layernorm_backward),
        ("adamw", adamw),
        ("matmul", matmul),
        ("attention_forward", attention_forward),
        ("attention_backward", attention_backward),
        (
            "attention_forward (grouped-query, packed sequences)",
            attention_forward_grouped_packed,
        ),
        ("linear_crossentropy", linear_crossentropy),
        ("rmsnorm_forward", rmsnorm_forward),
        ("residual_rmsnorm_forward", residual_rmsnorm_forward),
        ("rmsnorm_backward", rmsnorm_backward),
        ("rope_forward", rope_forward),
        ("rope_backward", rope_backward),
        ("swiglu_forward", swiglu_forward),
        ("swiglu_backward", swiglu_backward),
        ("lora_forward", lora_forward),
        ("lora_backward", lora_backward),
    ];
    ops.into_iter()
        .map(|(name, case)| {
            super::guard::check(name, || {
                let mut done = Vec::new();
                for dtype in DType::ALL {
                    let c = case(dtype).map_err(|e| format!("building the case: {e}"))?;
                    check(&*c, stream)?;
                    done.push(format!("{dtype} ok"));
                }
                Ok::<_, String>(done.join("; "))
            })
        })
        .collect()
}

/// Builds the op's case in a dtype (a CPU reference run may be needed for saved tensors).
type CaseFn = fn(DType) -> Result<Box<dyn GoldenCase>, String>;

/// Runs `case` on the device and on the CPU and compares every output.
fn check(case: &dyn GoldenCase, stream: &Stream) -> Result<(), String> {
    let want = case.run_cpu().map_err(|e| format!("CPU reference: {e}"))?;
    let got = case.run_device(stream).map_err(|e| e.to_string())?;
    for (name, w) in &want {
        let Some((_, g)) = got.iter().find(|(n, _)| n == name) else {
            return Err(format!("{}: the device returned no `{name}`", case.op()));
        };
        compare(case, name, g, w)?;
    }
    Ok(())
}

/// The first element of `got` outside the case's tolerance for `tensor`, as an error.
fn compare(
    case: &dyn GoldenCase,
    tensor: &str,
    got: &TensorData,
    want: &TensorData,
) -> Result<(), String> {
    let op = case.op();
    if got.dtype() != want.dtype() || got.len() != want.len() {
        return Err(format!(
            "{op} {tensor}: {} × {} from the device, {} × {} from the CPU",
            got.len(),
            got.dtype(),
            want.len(),
            want.dtype()
        ));
    }
    let tol = case.tolerance(tensor, want.dtype());
    for i in 0..want.len() {
        let (g, w) = (
            got.get_f64(i).unwrap_or(f64::NAN),
            want.get_f64(i).unwrap_or(f64::NAN),
        );
        if !tol.allows(g, w) {
            return Err(format!(
                "{op} {} {tensor}[{i}] = {g} on the device, {w} on the CPU ({tol:?})",
                want.dtype()
            ));
        }
    }
    Ok(())
}

/// Deterministic values in [-2, 2) of both signs, exact in every storage type.
fn values<T: Element>(len: usize, seed: usize) -> Vec<T> {
    (0..len)
        .map(|i| T::from_f32(((i * 131 + seed * 17) % 64) as f32 / 16.0 - 2.0))
        .collect()
}

/// [`values`] in `dtype`.
fn data(dtype: DType, len: usize, seed: usize) -> TensorData {
    with_dtype!(dtype, T => TensorData::from_slice(&values::<T>(len, seed)))
}

fn layernorm_forward(dtype: DType) -> Result<Box<dyn GoldenCase>, String> {
    let (n, c) = (LN.rows, LN.cols);
    Ok(Box::new(LayerNormForwardCase {
        params: LN,
        x: data(dtype, n * c, 1),
        weight: data(dtype, c, 2),
        bias: data(dtype, c, 3),
    }))
}

/// The CPU output `name` of `case` as f32 values (saved statistics).
fn saved_f32(case: &dyn GoldenCase, name: &str) -> Result<Vec<f32>, String> {
    let outs = case.run_cpu().map_err(|e| format!("CPU reference: {e}"))?;
    match outs.into_iter().find(|(n, _)| *n == name) {
        Some((_, TensorData::F32(v))) => Ok(v),
        _ => Err(format!("{} returned no f32 `{name}`", case.op())),
    }
}

fn layernorm_backward(dtype: DType) -> Result<Box<dyn GoldenCase>, String> {
    let (n, c) = (LN.rows, LN.cols);
    let fwd = LayerNormForwardCase {
        params: LN,
        x: data(dtype, n * c, 4),
        weight: data(dtype, c, 5),
        bias: data(dtype, c, 6),
    };
    Ok(Box::new(LayerNormBackwardCase {
        params: LN,
        mean: saved_f32(&fwd, "mean")?,
        rstd: saved_f32(&fwd, "rstd")?,
        x: fwd.x,
        weight: fwd.weight,
        dy: data(dtype, n * c, 7),
    }))
}

fn adamw(dtype: DType) -> Result<Box<dyn GoldenCase>, String> {
    let len = ADAMW_LEN;
    let scaled = |seed, f: fn(f32) -> f32| -> Vec<f32> {
        values::<f32>(len, seed).into_iter().map(f).collect()
    };
    let grad = scaled(9, |g| g * 1e-2);
    Ok(Box::new(AdamWCase {
        params: AdamWParams {
            lr: 1e-2,
            step: 3,
            ..AdamWParams::default()
        },
        grad_scale: None,
        found_inf: false,
        param: data(dtype, len, 8),
        grad: with_dtype!(dtype, T => TensorData::from_slice(
            &grad.iter().map(|&g| <T as Element>::from_f32(g)).collect::<Vec<T>>()
        )),
        exp_avg: scaled(10, |m| m * 1e-3),
        exp_avg_sq: scaled(11, |v| v.abs() * 1e-5),
        max_exp_avg_sq: None,
    }))
}

fn matmul(dtype: DType) -> Result<Box<dyn GoldenCase>, String> {
    let (b, m, n, k) = (MM.batch, MM.m, MM.n, MM.k);
    Ok(Box::new(MatmulCase {
        params: MM,
        a: data(dtype, b * m * k, 12),
        b: data(dtype, b * k * n, 13),
        c: Some(data(dtype, b * m * n, 14)),
    }))
}

fn attention_case(dtype: DType) -> AttentionForwardCase {
    let s = attention_params();
    let (nq, nk) = (
        s.batch * s.heads * s.tq * s.head_dim,
        s.batch * s.heads * s.tk * s.head_dim,
    );
    AttentionForwardCase {
        params: s,
        q: data(dtype, nq, 15),
        k: data(dtype, nk, 16),
        v: data(dtype, nk, 17),
        cu_seqlens: None,
    }
}

fn attention_forward(dtype: DType) -> Result<Box<dyn GoldenCase>, String> {
    Ok(Box::new(attention_case(dtype)))
}

/// Grouped-query heads (4 query heads on 2 key/value heads) over two packed sequences of 23 and
/// 14 positions and 3 positions of padding (the varlen kernels).
fn attention_forward_grouped_packed(dtype: DType) -> Result<Box<dyn GoldenCase>, String> {
    let s = AttentionParams {
        batch: 1,
        heads: 4,
        n_kv_heads: 2,
        tq: 40,
        tk: 40,
        head_dim: 64,
        causal: true,
        scale: AttentionParams::default_scale(64),
    };
    let (nq, nk) = (
        s.heads * s.tq * s.head_dim,
        s.n_kv_heads * s.tk * s.head_dim,
    );
    Ok(Box::new(AttentionForwardCase {
        params: s,
        q: data(dtype, nq, 21),
        k: data(dtype, nk, 22),
        v: data(dtype, nk, 23),
        cu_seqlens: Some(vec![0, 23, 37]),
    }))
}

/// CE(h·Wᵀ) in chunks of 4 rows (an edge chunk), one target ignored, W trained.
fn linear_crossentropy(dtype: DType) -> Result<Box<dyn GoldenCase>, String> {
    let (rows, dim, vocab) = (10, 16, 301);
    let targets = (0..rows as i32)
        .map(|i| {
            if i == 3 {
                -100
            } else {
                (i * 37) % vocab as i32
            }
        })
        .collect();
    Ok(Box::new(LinearCrossEntropyCase {
        params: LinearCrossEntropyParams {
            chunk_rows: Some(4),
            ..LinearCrossEntropyParams::new(rows, dim, vocab)
        },
        h: data(dtype, rows * dim, 24),
        weight: data(dtype, vocab * dim, 25),
        targets,
        dweight: Some(data(dtype, vocab * dim, 26)),
        totals: Some(vec![0.0, 0.0]),
    }))
}

/// The backward gets the reference's out and lse, so it is judged on its own.
fn attention_backward(dtype: DType) -> Result<Box<dyn GoldenCase>, String> {
    let s = attention_params();
    let nq = s.batch * s.heads * s.tq * s.head_dim;
    let fwd = attention_case(dtype);
    let outs = fwd.run_cpu().map_err(|e| format!("CPU reference: {e}"))?;
    let out = outs
        .iter()
        .find(|(n, _)| *n == "out")
        .map(|(_, t)| t.clone())
        .ok_or("the forward returned no `out`")?;
    Ok(Box::new(AttentionBackwardCase {
        params: s,
        lse: saved_f32(&fwd, "lse")?,
        q: fwd.q,
        k: fwd.k,
        v: fwd.v,
        cu_seqlens: None,
        out,
        dout: data(dtype, nq, 18),
    }))
}

// ---------------------------------------------------------------------------------------------
// LLaMA-family ops
// ---------------------------------------------------------------------------------------------

/// Rows × columns of the RMS norm cases: columns not a multiple of any vector width.
const RMS: RmsNormParams = RmsNormParams {
    rows: 5,
    cols: 1027,
    eps: 1e-6,
};

fn rmsnorm_forward(dtype: DType) -> Result<Box<dyn GoldenCase>, String> {
    let (n, c) = (RMS.rows, RMS.cols);
    Ok(Box::new(RmsNormForwardCase {
        params: RMS,
        variant: RmsNormVariant::Plain {
            x: data(dtype, n * c, 12),
        },
        weight: data(dtype, c, 13),
    }))
}

fn residual_rmsnorm_forward(dtype: DType) -> Result<Box<dyn GoldenCase>, String> {
    let (n, c) = (RMS.rows, RMS.cols);
    Ok(Box::new(RmsNormForwardCase {
        params: RMS,
        variant: RmsNormVariant::Residual {
            a: data(dtype, n * c, 14),
            b: data(dtype, n * c, 15),
        },
        weight: data(dtype, c, 16),
    }))
}

fn rmsnorm_backward(dtype: DType) -> Result<Box<dyn GoldenCase>, String> {
    let (n, c) = (RMS.rows, RMS.cols);
    let (x, weight) = (data(dtype, n * c, 17), data(dtype, c, 18));
    let fwd = RmsNormForwardCase {
        params: RMS,
        variant: RmsNormVariant::Plain { x: x.clone() },
        weight: weight.clone(),
    };
    Ok(Box::new(RmsNormBackwardCase {
        params: RMS,
        rstd: saved_f32(&fwd, "rstd")?,
        x,
        weight,
        dy: data(dtype, n * c, 19),
    }))
}

/// Rotary on `[2, 7, 3, 64]`, positions restarting inside each row: the forward with HF's
/// rotate_half over all 64 dims, the backward interleaved over the first 32 (GLM's layout).
fn rope_case(dtype: DType, backward: bool) -> Result<Box<dyn GoldenCase>, String> {
    let params = RopeParams {
        batch: 2,
        seq: 7,
        heads: 3,
        head_dim: 64,
        rotary_dim: if backward { 32 } else { 64 },
        interleaved: backward,
    };
    Ok(Box::new(RopeCase {
        backward,
        params,
        theta: 10000.0,
        scaling: RopeScaling::Default,
        x: data(dtype, 2 * 7 * 3 * 64, 20),
        positions: (0..14).map(|i| (i % 5) * 3).collect(),
    }))
}

fn rope_forward(dtype: DType) -> Result<Box<dyn GoldenCase>, String> {
    rope_case(dtype, false)
}

fn rope_backward(dtype: DType) -> Result<Box<dyn GoldenCase>, String> {
    rope_case(dtype, true)
}

/// SwiGLU over 5 × 1027: the forward on a fused gate-up buffer, the backward on separate ones.
const SWIGLU: SwigluParams = SwigluParams { rows: 5, ffn: 1027 };

fn swiglu_forward(dtype: DType) -> Result<Box<dyn GoldenCase>, String> {
    Ok(Box::new(SwigluForwardCase {
        params: SWIGLU,
        input: vec![data(dtype, SWIGLU.rows * 2 * SWIGLU.ffn, 21)],
    }))
}

fn swiglu_backward(dtype: DType) -> Result<Box<dyn GoldenCase>, String> {
    let n = SWIGLU.rows * SWIGLU.ffn;
    Ok(Box::new(SwigluBackwardCase {
        params: SWIGLU,
        input: vec![data(dtype, n, 22), data(dtype, n, 23)],
        dh: data(dtype, n, 24),
    }))
}

/// A LoRA target of 300 rows, 70 → 260 features at rank 12 (rank class 16; two column blocks;
/// two row blocks of `lora_down`), accumulating gradients.
const LORA: LoraParams = LoraParams {
    rows: 300,
    d_in: 70,
    d_out: 260,
    rank: 12,
    scale: 0.5,
    accumulate: true,
    ldy: None,
};

fn lora_forward(dtype: DType) -> Result<Box<dyn GoldenCase>, String> {
    let p = LORA;
    Ok(Box::new(LoraForwardCase {
        params: p,
        x: data(dtype, p.rows * p.d_in, 25),
        a: data(dtype, p.rank * p.d_in, 26),
        b: data(dtype, p.d_out * p.rank, 27),
        y: data(dtype, p.rows * p.d_out, 28),
    }))
}

fn lora_backward(dtype: DType) -> Result<Box<dyn GoldenCase>, String> {
    let p = LORA;
    Ok(Box::new(LoraBackwardCase {
        params: p,
        x: data(dtype, p.rows * p.d_in, 29),
        dy: data(dtype, p.rows * p.d_out, 30),
        a: data(dtype, p.rank * p.d_in, 31),
        b: data(dtype, p.d_out * p.rank, 32),
        u: data(dtype, p.rows * p.rank, 33),
        da: data(dtype, p.rank * p.d_in, 34),
        db: data(dtype, p.d_out * p.rank, 35),
        dx: data(dtype, p.rows * p.d_in, 36),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    #[test]
    fn compare_reports_the_first_bad_element() {
        let case = adamw(DType::F32).expect("case");
        let want = TensorData::F32(vec![1.0, 2.0, 3.0]);
        assert!(compare(&*case, "exp_avg", &want, &want).is_ok());
        let bad = TensorData::F32(vec![1.0, 2.5, 3.0]);
        let err = compare(&*case, "exp_avg", &bad, &want)
            .err()
            .unwrap_or_default();
        assert!(
            err.contains("exp_avg[1] = 2.5 on the device, 2 on the CPU"),
            "{err}"
        );
        let short = TensorData::F32(vec![1.0]);
        let err = compare(&*case, "exp_avg", &short, &want)
            .err()
            .unwrap_or_default();
        assert!(
            err.contains("1 × f32 from the device, 3 × f32 from the CPU"),
            "{err}"
        );
    }

    #[test]
    fn every_case_runs_on_the_cpu() {
        let cases: [CaseFn; 8] = [
            layernorm_forward,
            layernorm_backward,
            adamw,
            matmul,
            attention_forward,
            attention_backward,
            lora_forward,
            lora_backward,
        ];
        for dtype in DType::ALL {
            for case in cases {
                let c = case(dtype).expect("case");
                let outs = c.run_cpu().expect("cpu");
                assert!(!outs.is_empty(), "{}", c.op());
            }
        }
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
