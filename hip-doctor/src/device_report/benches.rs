//! The rows of the device report: each op at the model's training shapes, timed on one stream,
//! with the hipBLAS figure of the same GEMM(s) beside the GEMM-shaped ones.

use std::time::Duration;

use half::bf16;
use hip_kernels::ops::{
    self, AdamW, AdamWParams, AdamWTensor, AttentionBackward, AttentionForward, AttentionParams,
    BiasBackward, BiasParams, CrossEntropyParams, ElementwiseParams, GeluBackward, GemmTuner,
    GemmTuningMode, LayerNormBackward, LayerNormForward, LayerNormParams, Matmul, MatmulBias,
    MatmulBiasParams, MatmulParams, SoftmaxCrossEntropy, TuningConfig,
};
use hip_kernels::params::OnDevice;
use hip_rt::{Batch, Blas, DeviceBuffer, Event, EventOptions, Gemm, Stream};

use super::{Dims, Effort, Row};

/// The mean time of one call of `once` (which queues work on `stream`): `effort.warmup`
/// untimed calls, then `effort.runs` calls back to back between two HIP events (no host sync
/// between calls, so launch gaps are what a training step sees).
pub fn time_it(
    stream: &Stream,
    effort: Effort,
    mut once: impl FnMut() -> Result<(), String>,
) -> Result<Duration, String> {
    let err = |e: hip_rt::Error| e.to_string();
    for _ in 0..effort.warmup {
        once()?;
    }
    stream.synchronize().map_err(err)?;
    let device = stream.device();
    let start = Event::new(device, EventOptions::TIMING).map_err(err)?;
    let end = Event::new(device, EventOptions::TIMING).map_err(err)?;
    let runs = effort.runs.max(1);
    start.record(stream).map_err(err)?;
    for _ in 0..runs {
        once()?;
    }
    end.record(stream).map_err(err)?;
    end.synchronize().map_err(err)?;
    let ms = start.elapsed_ms(&end).map_err(err)?;
    Ok(Duration::from_secs_f64(
        f64::from(ms.max(0.0)) / 1e3 / runs as f64,
    ))
}

fn buf<T: hip_rt::Element>(s: &Stream, len: usize, v: T) -> Result<DeviceBuffer<T>, String> {
    DeviceBuffer::from_slice(s, &vec![v; len])
        .map_err(|e| format!("allocating {len} elements: {e}"))
}

fn small(v: f32) -> bf16 {
    bf16::from_f32(v)
}

/// A plain GEMM shape of the model: its name, m, n, k and transposes, and whether the trainer
/// accumulates into the output (beta = 1).
#[derive(Debug, Clone, Copy)]
pub struct GemmShape {
    pub name: &'static str,
    pub params: MatmulParams,
}

fn mm(
    name: &'static str,
    m: usize,
    n: usize,
    k: usize,
    ta: bool,
    tb: bool,
    acc: bool,
) -> GemmShape {
    GemmShape {
        name,
        params: MatmulParams {
            trans_a: ta,
            trans_b: tb,
            beta: if acc { 1.0 } else { 0.0 },
            ..MatmulParams::new(m, n, k)
        },
    }
}

/// Every plain GEMM of one training step (`ops::matmul` in the trainer): the LM head forward
/// and backward, and each layer's weight-gradient (tn, accumulated) and input-gradient (nt)
/// GEMMs of qkv, attention projection, fc and MLP projection.
pub fn plain_gemms(d: &Dims) -> Vec<GemmShape> {
    let (n, c, f, v) = (d.rows(), d.channels, 4 * d.channels, d.vocab);
    vec![
        mm("lm_head forward (logits)", n, v, c, false, true, false),
        mm("lm_head dW", v, c, n, true, false, true),
        mm("lm_head dx", n, c, v, false, false, false),
        mm("qkv dW", c, 3 * c, n, true, false, true),
        mm("qkv dx", n, c, 3 * c, false, true, false),
        mm("attn proj dW", c, c, n, true, false, true),
        mm("attn proj dx", n, c, c, false, true, false),
        mm("fc dW", c, f, n, true, false, true),
        mm("fc dx", n, c, f, false, true, false),
        mm("mlp proj dW", f, c, n, true, false, true),
        mm("mlp proj dx", n, f, c, false, true, false),
    ]
}

fn gemm_flops(p: &MatmulParams) -> f64 {
    2.0 * (p.batch * p.m * p.n) as f64 * p.k as f64
}

/// hipBLAS's time for `p` on fresh bf16 buffers (None when no BLAS handle).
fn blas_time(
    s: &Stream,
    blas: Option<&Blas>,
    p: &MatmulParams,
    effort: Effort,
) -> Result<Option<Duration>, String> {
    let Some(blas) = blas else { return Ok(None) };
    let (a, b) = (
        buf(s, p.a_len().map_err(|e| e.to_string())?, small(0.01))?,
        buf(s, p.b_len().map_err(|e| e.to_string())?, small(0.01))?,
    );
    let mut out = buf(s, p.out_len().map_err(|e| e.to_string())?, small(0.0))?;
    let (g, batch): (Gemm, Batch) = p.gemm();
    time_it(s, effort, || {
        blas.gemm_strided_batched(&g, &batch, &a, &b, &mut out)
            .map_err(|e| e.to_string())
    })
    .map(Some)
}

/// One plain GEMM: this crate's default kernel (tuning off) against hipBLAS.
pub fn gemm_row(s: &Stream, blas: Option<&Blas>, shape: &GemmShape, effort: Effort) -> Row {
    let p = shape.params;
    let label = format!("matmul {}", shape.name);
    let shape_text = format!(
        "{}{} m={} n={} k={}",
        t(p.trans_a),
        t(p.trans_b),
        p.m,
        p.n,
        p.k
    );
    let run = || -> Result<Row, String> {
        let off = GemmTuner::new(TuningConfig::new(GemmTuningMode::Off, "unused"))
            .map_err(|e| e.to_string())?;
        let (a, b) = (
            buf(s, p.a_len().map_err(|e| e.to_string())?, small(0.01))?,
            buf(s, p.b_len().map_err(|e| e.to_string())?, small(0.01))?,
        );
        let mut out = buf(s, p.out_len().map_err(|e| e.to_string())?, small(0.0))?;
        let ours = time_it(s, effort, || {
            off.matmul(
                s,
                Matmul::<OnDevice, bf16> {
                    params: p,
                    a: &a,
                    b: &b,
                    out: &mut out,
                },
            )
            .map_err(|e| e.to_string())
        })?;
        let theirs = blas_time(s, blas, &p, effort)?;
        Ok(
            Row::compute(&label, &shape_text, "bf16", ours, gemm_flops(&p))
                .with_blas(theirs, "hipBLAS GemmEx, same shape"),
        )
    };
    run().unwrap_or_else(|e| Row::failed(&label, &shape_text, "bf16", e))
}

fn t(b: bool) -> char {
    if b {
        't'
    } else {
        'n'
    }
}

/// The four forward GEMMs with the bias (and GELU) epilogue fused, against hipBLAS's plain
/// GEMM of the same shape (hipBLAS has no epilogue: its figure is a lower bound).
pub fn matmul_bias_rows(s: &Stream, blas: Option<&Blas>, d: &Dims, effort: Effort) -> Vec<Row> {
    let (n, c, f) = (d.rows(), d.channels, 4 * d.channels);
    let shapes = [
        ("qkv", n, 3 * c, c, false),
        ("attn proj", n, c, c, false),
        ("fc + GELU", n, f, c, true),
        ("mlp proj", n, c, f, false),
    ];
    shapes
        .into_iter()
        .map(|(name, m, nn, k, gelu)| {
            let label = format!("matmul_bias {name}");
            let shape_text = format!("nn m={m} n={nn} k={k}");
            let run = || -> Result<Row, String> {
                let params = MatmulBiasParams {
                    batch: 1,
                    m,
                    n: nn,
                    k,
                    trans_a: false,
                    trans_b: false,
                    gelu,
                };
                let (a, b, bias) = (
                    buf(s, m * k, small(0.01))?,
                    buf(s, k * nn, small(0.01))?,
                    buf(s, nn, small(0.0))?,
                );
                let (mut out, mut pre) = (
                    buf(s, m * nn, small(0.0))?,
                    buf(s, if gelu { m * nn } else { 0 }, small(0.0))?,
                );
                let ours = time_it(s, effort, || {
                    let args = MatmulBias::<OnDevice, bf16> {
                        params,
                        a: &a,
                        b: &b,
                        bias: &bias,
                        out: &mut out,
                        pre_gelu: if gelu { Some(&mut pre) } else { None },
                    };
                    ops::matmul_bias(s, args).map_err(|e| e.to_string())
                })?;
                let plain = MatmulParams::new(m, nn, k);
                let theirs = blas_time(s, blas, &plain, effort)?;
                Ok(
                    Row::compute(&label, &shape_text, "bf16", ours, gemm_flops(&plain)).with_blas(
                        theirs,
                        "hipBLAS GemmEx without the epilogue (a lower bound)",
                    ),
                )
            };
            run().unwrap_or_else(|e| Row::failed(&label, &shape_text, "bf16", e))
        })
        .collect()
}

/// The model's attention shape.
pub fn attention_params(d: &Dims) -> AttentionParams {
    let head_dim = d.channels / d.heads;
    AttentionParams {
        batch: d.batch,
        heads: d.heads,
        n_kv_heads: d.heads,
        tq: d.seq,
        tk: d.seq,
        head_dim,
        causal: true,
        scale: AttentionParams::default_scale(head_dim),
    }
}

/// Causal attention FLOPs as FlashAttention-2 counts them: forward 4·B·H·T²·D halved by the
/// mask; backward 2.5 times the forward.
pub fn attention_flops(p: &AttentionParams, backward: bool) -> f64 {
    let fwd = 4.0 * (p.batch * p.heads) as f64 * (p.tq * p.tk * p.head_dim) as f64 / 2.0;
    if backward {
        2.5 * fwd
    } else {
        fwd
    }
}

/// hipBLAS's time for S = Q·Kᵀ then O = S·V over every head (full T×T, no softmax): the
/// attention rows' baseline.
fn attention_baseline(
    s: &Stream,
    blas: Option<&Blas>,
    p: &AttentionParams,
    effort: Effort,
) -> Result<Option<Duration>, String> {
    let Some(blas) = blas else { return Ok(None) };
    let bh = p.batch * p.heads;
    let (t, dd) = (p.tq, p.head_dim);
    let (q, k, v) = (
        buf(s, bh * t * dd, small(0.01))?,
        buf(s, bh * t * dd, small(0.01))?,
        buf(s, bh * t * dd, small(0.01))?,
    );
    let (mut sc, mut o) = (
        buf(s, bh * t * t, small(0.0))?,
        buf(s, bh * t * dd, small(0.0))?,
    );
    let qk = Gemm {
        trans_b: true,
        ..Gemm::new(t, t, dd)
    };
    let sv = Gemm::new(t, dd, t);
    let (bqk, bsv) = (Batch::packed(&qk, bh), Batch::packed(&sv, bh));
    time_it(s, effort, || {
        blas.gemm_strided_batched(&qk, &bqk, &q, &k, &mut sc)
            .map_err(|e| e.to_string())?;
        blas.gemm_strided_batched(&sv, &bsv, &sc, &v, &mut o)
            .map_err(|e| e.to_string())
    })
    .map(Some)
}

/// Attention forward and backward (bf16, causal), each with its static estimate and the
/// two-GEMM hipBLAS baseline.
pub fn attention_rows(s: &Stream, blas: Option<&Blas>, d: &Dims, effort: Effort) -> Vec<Row> {
    let p = attention_params(d);
    let shape_text = format!(
        "B={} H={} T={} D={} causal",
        p.batch, p.heads, p.tq, p.head_dim
    );
    let n = p.batch * p.heads * p.tq * p.head_dim;
    let rows = p.batch * p.heads * p.tq;
    let mut out = Vec::new();
    let run = || -> Result<(Row, Row), String> {
        let (q, k, v) = (
            buf(s, n, small(0.01))?,
            buf(s, n, small(0.02))?,
            buf(s, n, small(0.03))?,
        );
        let (mut o, mut lse) = (buf(s, n, small(0.0))?, buf(s, rows, 0.0f32)?);
        let fwd = time_it(s, effort, || {
            let a = AttentionForward::<OnDevice, bf16> {
                params: p,
                q: &q,
                k: &k,
                v: &v,
                out: &mut o,
                lse: &mut lse,
                cu_seqlens: None,
            };
            ops::attention_forward(s, a).map_err(|e| e.to_string())
        })?;
        let dout = buf(s, n, small(0.01))?;
        let (mut dq, mut dk, mut dv) = (
            buf(s, n, small(0.0))?,
            buf(s, n, small(0.0))?,
            buf(s, n, small(0.0))?,
        );
        let bwd = time_it(s, effort, || {
            let a = AttentionBackward::<OnDevice, bf16> {
                params: p,
                q: &q,
                k: &k,
                v: &v,
                out: &o,
                dout: &dout,
                lse: &lse,
                dq: &mut dq,
                dk: &mut dk,
                dv: &mut dv,
                cu_seqlens: None,
            };
            ops::attention_backward(s, a).map_err(|e| e.to_string())
        })?;
        let base = attention_baseline(s, blas, &p, effort)?;
        let note = "hipBLAS S = Q·Kᵀ then O = S·V, full T×T, no softmax (a lower bound)";
        Ok((
            Row::compute(
                "attention_forward",
                &shape_text,
                "bf16",
                fwd,
                attention_flops(&p, false),
            )
            .with_blas(base, note),
            Row::compute(
                "attention_backward",
                &shape_text,
                "bf16",
                bwd,
                attention_flops(&p, true),
            ),
        ))
    };
    match run() {
        Ok((f, b)) => out.extend([f, b]),
        Err(e) => out.push(Row::failed("attention", &shape_text, "bf16", e)),
    }
    out
}

/// The bandwidth-bound ops: bytes each moves at least, against the device's peak.
pub fn bandwidth_rows(s: &Stream, d: &Dims, effort: Effort) -> Vec<Row> {
    let (n, c, f) = (d.rows(), d.channels, 4 * d.channels);
    let es = 2.0; // bf16 bytes
    let mut rows = Vec::new();
    let mut push =
        |name: &str, shape: String, dtype: &str, bytes: f64, r: Result<Duration, String>| {
            rows.push(match r {
                Ok(t) => Row::bandwidth(name, &shape, dtype, t, bytes),
                Err(e) => Row::failed(name, &shape, dtype, e),
            })
        };
    let ln = LayerNormParams {
        rows: n,
        cols: c,
        eps: 1e-5,
    };
    let r = (|| {
        let (x, w, b) = (
            buf(s, n * c, small(0.5))?,
            buf(s, c, small(1.0))?,
            buf(s, c, small(0.0))?,
        );
        let (mut y, mut mean, mut rstd) = (
            buf(s, n * c, small(0.0))?,
            buf(s, n, 0f32)?,
            buf(s, n, 0f32)?,
        );
        time_it(s, effort, || {
            let a = LayerNormForward::<OnDevice, bf16> {
                params: ln,
                x: &x,
                weight: &w,
                bias: &b,
                y: &mut y,
                mean: &mut mean,
                rstd: &mut rstd,
            };
            ops::layernorm_forward(s, a).map_err(|e| e.to_string())
        })
    })();
    push(
        "layernorm_forward",
        format!("[{n}, {c}]"),
        "bf16",
        2.0 * es * (n * c) as f64,
        r,
    );
    let r = (|| {
        let (x, w, dy) = (
            buf(s, n * c, small(0.5))?,
            buf(s, c, small(1.0))?,
            buf(s, n * c, small(0.01))?,
        );
        let (mean, rstd) = (buf(s, n, 0f32)?, buf(s, n, 1f32)?);
        let (mut dx, mut dw, mut db) = (
            buf(s, n * c, small(0.0))?,
            buf(s, c, small(0.0))?,
            buf(s, c, small(0.0))?,
        );
        time_it(s, effort, || {
            let a = LayerNormBackward::<OnDevice, bf16> {
                params: ln,
                x: &x,
                weight: &w,
                dy: &dy,
                mean: &mean,
                rstd: &rstd,
                dx: &mut dx,
                dweight: &mut dw,
                dbias: &mut db,
                accumulate: true,
            };
            ops::layernorm_backward(s, a).map_err(|e| e.to_string())
        })
    })();
    push(
        "layernorm_backward",
        format!("[{n}, {c}]"),
        "bf16",
        3.0 * es * (n * c) as f64,
        r,
    );
    let len = n * f;
    let r = (|| {
        let (x, dout) = (buf(s, len, small(0.5))?, buf(s, len, small(0.01))?);
        let mut dx = buf(s, len, small(0.0))?;
        time_it(s, effort, || {
            let a = GeluBackward::<OnDevice, bf16> {
                params: ElementwiseParams { len },
                x: &x,
                dout: &dout,
                dx: &mut dx,
            };
            ops::gelu_backward(s, a).map_err(|e| e.to_string())
        })
    })();
    push(
        "gelu_backward",
        format!("[{n}, {f}]"),
        "bf16",
        3.0 * es * len as f64,
        r,
    );
    let r = (|| {
        let dout = buf(s, n * f, small(0.01))?;
        let mut db = buf(s, f, small(0.0))?;
        time_it(s, effort, || {
            let a = BiasBackward::<OnDevice, bf16> {
                params: BiasParams {
                    rows: n,
                    cols: f,
                    accumulate: true,
                },
                dout: &dout,
                dbias: &mut db,
            };
            ops::bias_backward(s, a).map_err(|e| e.to_string())
        })
    })();
    push(
        "bias_backward",
        format!("[{n}, {f}]"),
        "bf16",
        es * (n * f) as f64,
        r,
    );
    let (v, vp) = (d.vocab, d.padded_vocab);
    let r = (|| {
        let mut logits = buf(s, n * vp, small(0.0))?;
        let targets =
            DeviceBuffer::from_slice(s, &(0..n).map(|i| (i % v) as i32).collect::<Vec<_>>())
                .map_err(|e| e.to_string())?;
        let mut losses = buf(s, n, 0f32)?;
        let params = CrossEntropyParams {
            rows: n,
            vocab: v,
            padded_vocab: vp,
            dloss: Some(1.0),
            divisor: None,
        };
        time_it(s, effort, || {
            let a = SoftmaxCrossEntropy::<OnDevice, bf16> {
                params,
                logits: &mut logits,
                targets: &targets,
                losses: &mut losses,
                loss: None,
                totals: None,
                error: None,
            };
            ops::softmax_cross_entropy(s, a).map_err(|e| e.to_string())
        })
    })();
    push(
        "softmax_cross_entropy (fused backward)",
        format!("[{n}, {v}] padded {vp}"),
        "bf16",
        2.0 * es * (n * v) as f64,
        r,
    );
    let params = d.parameters;
    let r = (|| {
        let (mut p, g) = (buf(s, params, 0.1f32)?, buf(s, params, 0.001f32)?);
        let (mut m, mut vv) = (buf(s, params, 0f32)?, buf(s, params, 0f32)?);
        time_it(s, effort, || {
            let a = AdamW::<OnDevice, f32> {
                params: AdamWParams::default(),
                grad_scale: None,
                found_inf: None,
                tensors: &mut [AdamWTensor {
                    param: &mut p,
                    grad: &g,
                    exp_avg: &mut m,
                    exp_avg_sq: &mut vv,
                    max_exp_avg_sq: None,
                    master: None,
                    weight_decay: None,
                    lr_scale: None,
                }],
            };
            ops::adamw(s, a).map_err(|e| e.to_string())
        })
    })();
    push(
        "adamw",
        format!("{params} parameters"),
        "f32",
        28.0 * params as f64,
        r,
    );
    rows
}
