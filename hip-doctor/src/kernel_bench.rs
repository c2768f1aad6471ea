//! `--bench` rows for this crate's kernels: GB/s for layernorm and AdamW, TFLOPS for matmul and
//! attention (compare with the BLAS rows beside them). Never run on a GPU.

use half::f16;
use hip_rt::{DeviceBuffer, Stream};

use super::bench::{bench_item, step, Work};
use super::progress::Steps;
use super::report::Item;
use hip_kernels::ops::{
    self, AdamW, AdamWParams, AdamWTensor, AttentionForward, AttentionParams, LayerNormForward,
    LayerNormParams, Matmul, MatmulParams,
};
use hip_kernels::params::OnDevice;

/// Layernorm rows × columns (C ≥ 1024, where the bandwidth target applies).
const LN: LayerNormParams = LayerNormParams {
    rows: 8192,
    cols: 1024,
    eps: 1e-5,
};
/// AdamW parameters (≥ 16 M, where the bandwidth target applies).
const ADAMW_LEN: usize = 16 << 20;
/// Square matmul size, as the BLAS rows.
const MM_N: usize = super::bench::GEMM_N;

/// Kernel benchmarks per device (rows of [`items`]).
pub const COUNT: usize = 5;

/// One row per kernel benchmark on `stream`'s device, each a step of `steps`.
pub fn items(stream: &Stream, prefix: &str, steps: &Steps) -> Vec<Item> {
    let run = |name: String, bench: &dyn Fn() -> Result<Item, String>| {
        step(steps, &name, || match bench() {
            Ok(mut item) => {
                item.name = name.clone();
                item
            }
            Err(e) => Item::fail(&name, e),
        })
    };
    vec![
        run(
            format!("{prefix} layernorm_forward f32 {}x{}", LN.rows, LN.cols),
            &|| layernorm(stream),
        ),
        run(
            format!("{prefix} adamw f32 {}M params", ADAMW_LEN >> 20),
            &|| adamw(stream),
        ),
        run(format!("{prefix} matmul f32 {MM_N}^3"), &|| {
            matmul::<f32>(stream)
        }),
        run(format!("{prefix} matmul f16 {MM_N}^3"), &|| {
            matmul::<f16>(stream)
        }),
        run(
            format!("{prefix} attention_forward f16 T 2048 D 64"),
            &|| attention(stream),
        ),
    ]
}

fn buf<T: hip_rt::Element + Default>(
    stream: &Stream,
    len: usize,
) -> Result<DeviceBuffer<T>, String> {
    DeviceBuffer::zeroed(stream, len).map_err(|e| format!("allocating {len} elements: {e}"))
}

fn layernorm(stream: &Stream) -> Result<Item, String> {
    let (n, c) = (LN.rows, LN.cols);
    let (x, w, b) = (
        buf::<f32>(stream, n * c)?,
        buf::<f32>(stream, c)?,
        buf::<f32>(stream, c)?,
    );
    let (mut y, mut mean, mut rstd) = (
        buf::<f32>(stream, n * c)?,
        buf::<f32>(stream, n)?,
        buf::<f32>(stream, n)?,
    );
    // x read once, y written once (weight, bias, mean and rstd are negligible).
    let bytes = 2.0 * (n * c * 4) as f64;
    Ok(bench_item("", Work::Bytes(bytes), || {
        let a = LayerNormForward::<OnDevice, _> {
            params: LN,
            x: &x,
            weight: &w,
            bias: &b,
            y: &mut y,
            mean: &mut mean,
            rstd: &mut rstd,
        };
        ops::layernorm_forward(stream, a).map_err(|e| e.to_string())?;
        stream.synchronize().map_err(|e| e.to_string())
    }))
}

fn adamw(stream: &Stream) -> Result<Item, String> {
    let len = ADAMW_LEN;
    let (mut p, g) = (buf::<f32>(stream, len)?, buf::<f32>(stream, len)?);
    let (mut m, mut v) = (buf::<f32>(stream, len)?, buf::<f32>(stream, len)?);
    // param, exp_avg, exp_avg_sq read and written; grad read: 7 × 4 bytes per parameter.
    let bytes = 28.0 * len as f64;
    Ok(bench_item("", Work::Bytes(bytes), || {
        let a = AdamW::<OnDevice, _> {
            params: AdamWParams::default(),
            grad_scale: None,
            found_inf: None,
            tensors: &mut [AdamWTensor {
                param: &mut p,
                grad: &g,
                exp_avg: &mut m,
                exp_avg_sq: &mut v,
                max_exp_avg_sq: None,
                master: None,
                weight_decay: None,
                lr_scale: None,
            }],
        };
        ops::adamw(stream, a).map_err(|e| e.to_string())?;
        stream.synchronize().map_err(|e| e.to_string())
    }))
}

fn matmul<T: ops::DeviceElement + Default>(stream: &Stream) -> Result<Item, String> {
    let params = MatmulParams::new(MM_N, MM_N, MM_N);
    let (a, b, mut out) = (
        buf::<T>(stream, MM_N * MM_N)?,
        buf::<T>(stream, MM_N * MM_N)?,
        buf::<T>(stream, MM_N * MM_N)?,
    );
    let flops = 2.0 * (MM_N as f64).powi(3);
    Ok(bench_item("", Work::Flops(flops), || {
        let args = Matmul::<OnDevice, _> {
            params,
            a: &a,
            b: &b,
            out: &mut out,
        };
        ops::matmul(stream, args).map_err(|e| e.to_string())?;
        stream.synchronize().map_err(|e| e.to_string())
    }))
}

fn attention(stream: &Stream) -> Result<Item, String> {
    let s = AttentionParams {
        batch: 1,
        heads: 16,
        n_kv_heads: 16,
        tq: 2048,
        tk: 2048,
        head_dim: 64,
        causal: false,
        scale: AttentionParams::default_scale(64),
    };
    let n = s.batch * s.heads * s.tq * s.head_dim;
    let (q, k, v) = (
        buf::<f16>(stream, n)?,
        buf::<f16>(stream, n)?,
        buf::<f16>(stream, n)?,
    );
    let (mut out, mut lse) = (
        buf::<f16>(stream, n)?,
        buf::<f32>(stream, s.batch * s.heads * s.tq)?,
    );
    // Q·Kᵀ and P·V: 2 × 2·T·T·D per head.
    let flops = 4.0 * (s.batch * s.heads) as f64 * (s.tq * s.tk * s.head_dim) as f64;
    Ok(bench_item("", Work::Flops(flops), || {
        let a = AttentionForward::<OnDevice, _> {
            params: s,
            q: &q,
            k: &k,
            v: &v,
            out: &mut out,
            lse: &mut lse,
            cu_seqlens: None,
        };
        ops::attention_forward(stream, a).map_err(|e| e.to_string())?;
        stream.synchronize().map_err(|e| e.to_string())
    }))
}
