//! The golden cases of the training-step ops (issue 13, `tests/golden/train/`), run on the CPU
//! reference. Written by `tools/golden/gen_train.py`; the rules are in `tools/golden/README.md`
//! ("Training-step ops").
//!
//! Kept apart from `hip_kernels::golden` (whose op list is closed) until the restructure's op
//! registry lands: then each op's `parse`/`run` below moves into its family's `golden.rs` and the
//! files move up to `tests/golden/`. Parsing is strict: a missing or unexpected tensor or
//! metadata key is an error naming the case.

use hip_kernels::cpu::{self, Element};
use hip_kernels::golden::TensorData;
use hip_kernels::params::{AttentionShape, DType, MatmulShape, Op};
use hip_kernels::tolerance::{tolerance, Tolerance};
use hip_kernels::with_dtype;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Every op with cases here.
pub const OPS: [&str; 12] = [
    "encoder_forward",
    "encoder_backward",
    "gelu_forward",
    "gelu_backward",
    "residual_add",
    "crossentropy",
    "matmul_bias",
    "bias_backward",
    "residual_layernorm_forward",
    "attention_forward_strided",
    "attention_backward_strided",
    "clip",
];

/// Values of one stored tensor.
#[derive(Debug, Clone)]
pub enum Values {
    /// A floating-point tensor in its storage type.
    Float(TensorData),
    /// Token ids or targets.
    I32(Vec<i32>),
}

/// A stored tensor.
#[derive(Debug, Clone)]
pub struct Tensor {
    /// Row-major shape.
    pub shape: Vec<usize>,
    /// Values.
    pub values: Values,
}

/// One case file.
#[derive(Debug, Clone)]
pub struct Case {
    /// File stem.
    pub name: String,
    /// `op` metadata.
    pub op: String,
    meta: HashMap<String, String>,
    tensors: HashMap<String, Tensor>,
}

/// The `*.safetensors` files of the training-step cases: `tests/golden/train/` and the `train/`
/// folder of each `HIPK_GOLDEN_DIR` entry that has one (committed ones first, each sorted).
pub fn case_files() -> Vec<PathBuf> {
    let committed = hip_kernels::golden::committed_dir().join("train");
    let extra = hip_kernels::golden::env_dirs()
        .into_iter()
        .map(|d| d.join("train"))
        .filter(|d| d.is_dir());
    let mut all = Vec::new();
    for dir in std::iter::once(committed).chain(extra) {
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("golden: cannot read {}: {e}", dir.display()))
            .map(|e| e.expect("directory entry").path())
            .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
            .collect();
        files.sort();
        all.extend(files);
    }
    all
}

fn floats<T: bytemuck::Pod + Copy>(bytes: &[u8]) -> Vec<T> {
    bytes
        .chunks_exact(std::mem::size_of::<T>())
        .map(bytemuck::pod_read_unaligned)
        .collect()
}

/// Read one case file.
pub fn load(path: &Path) -> Result<Case, String> {
    let name = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let err = |m: String| format!("golden case {name}: {m}");
    let bytes = std::fs::read(path).map_err(|e| err(e.to_string()))?;
    let (_, header) =
        safetensors::SafeTensors::read_metadata(&bytes).map_err(|e| err(e.to_string()))?;
    let mut meta = header.metadata().clone().unwrap_or_default();
    let op = meta
        .remove("op")
        .ok_or_else(|| err("metadata key `op` is missing".into()))?;
    let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| err(e.to_string()))?;
    let mut tensors = HashMap::new();
    for (n, v) in st.tensors() {
        let d = v.data();
        let values = match v.dtype() {
            safetensors::Dtype::F32 => Values::Float(TensorData::F32(floats(d))),
            safetensors::Dtype::F16 => Values::Float(TensorData::F16(floats(d))),
            safetensors::Dtype::BF16 => Values::Float(TensorData::BF16(floats(d))),
            safetensors::Dtype::I32 => Values::I32(floats(d)),
            other => return Err(err(format!("tensor `{n}` has unsupported dtype {other:?}"))),
        };
        tensors.insert(
            n,
            Tensor {
                shape: v.shape().to_vec(),
                values,
            },
        );
    }
    Ok(Case {
        name,
        op,
        meta,
        tensors,
    })
}

impl Case {
    fn err(&self, m: impl std::fmt::Display) -> String {
        format!("golden case {}: {m}", self.name)
    }

    fn meta(&mut self, key: &str) -> Result<String, String> {
        self.meta
            .remove(key)
            .ok_or_else(|| self.err(format!("metadata key `{key}` is missing")))
    }

    fn meta_bool(&mut self, key: &str) -> Result<bool, String> {
        match self.meta(key)?.as_str() {
            "true" => Ok(true),
            "false" => Ok(false),
            v => Err(self.err(format!("metadata `{key}` = {v:?} is not true/false"))),
        }
    }

    fn meta_f64(&mut self, key: &str) -> Result<f64, String> {
        let v = self.meta(key)?;
        v.parse()
            .map_err(|_| self.err(format!("metadata `{key}` = {v:?} is not a number")))
    }

    fn meta_opt_f64(&mut self, key: &str) -> Result<Option<f64>, String> {
        if self.meta.contains_key(key) {
            self.meta_f64(key).map(Some)
        } else {
            Ok(None)
        }
    }

    fn take(&mut self, name: &str) -> Result<Tensor, String> {
        self.tensors
            .remove(name)
            .ok_or_else(|| self.err(format!("tensor `{name}` is missing")))
    }

    fn float(&mut self, name: &str) -> Result<(Vec<usize>, TensorData), String> {
        match self.take(name)? {
            Tensor {
                shape,
                values: Values::Float(d),
            } => Ok((shape, d)),
            _ => Err(self.err(format!("tensor `{name}` must be floating point"))),
        }
    }

    fn typed<T: Element>(&mut self, name: &str) -> Result<(Vec<usize>, Vec<T>), String> {
        let (shape, d) = self.float(name)?;
        let v = d
            .as_slice::<T>()
            .ok_or_else(|| self.err(format!("tensor `{name}` is {} not {}", d.dtype(), T::DTYPE)))?
            .to_vec();
        Ok((shape, v))
    }

    fn ints(&mut self, name: &str) -> Result<(Vec<usize>, Vec<i32>), String> {
        match self.take(name)? {
            Tensor {
                shape,
                values: Values::I32(v),
            } => Ok((shape, v)),
            _ => Err(self.err(format!("tensor `{name}` must be int32"))),
        }
    }

    /// The storage dtype: that of the first floating-point input named in `inputs`.
    fn dtype(&self, input: &str) -> Result<DType, String> {
        match self.tensors.get(input).map(|t| &t.values) {
            Some(Values::Float(d)) => Ok(d.dtype()),
            _ => Err(self.err(format!("tensor `{input}` is missing or not floating point"))),
        }
    }
}

/// One output to compare with `expected_<name>`.
struct Output {
    name: &'static str,
    got: TensorData,
    tol: Tolerance,
}

fn out<T: Element>(name: &'static str, got: &[T], tol: Tolerance) -> Output {
    Output {
        name,
        got: TensorData::from_slice(got),
        tol,
    }
}

/// The tolerance of an output of storage `dtype` that is a reduction over `len` terms:
/// `src/tolerance.rs`'s general rule (torch's default plus f32 accumulation).
fn reduction(dtype: DType, len: usize) -> Tolerance {
    tolerance(Op::Matmul, "out", dtype, dtype, len)
}

/// Run one case on the CPU reference and compare every output; the number of compared elements.
pub fn run(mut case: Case) -> Result<usize, String> {
    let outputs = match case.op.as_str() {
        "encoder_forward" | "encoder_backward" => encoder(&mut case)?,
        "gelu_forward" | "gelu_backward" | "residual_add" => elementwise(&mut case)?,
        "crossentropy" => crossentropy(&mut case)?,
        "matmul_bias" | "bias_backward" => bias(&mut case)?,
        "residual_layernorm_forward" => residual_layernorm(&mut case)?,
        "attention_forward_strided" | "attention_backward_strided" => attention(&mut case)?,
        "clip" => clip(&mut case)?,
        other => return Err(case.err(format!("unknown op `{other}`"))),
    };
    let mut compared = 0;
    for o in outputs {
        let key = format!("expected_{}", o.name);
        let (_, want) = case.float(&key)?;
        if want.dtype() != o.got.dtype() || want.len() != o.got.len() {
            return Err(case.err(format!(
                "`{key}` is {} × {} but the output is {} × {}",
                want.dtype(),
                want.len(),
                o.got.dtype(),
                o.got.len()
            )));
        }
        let bad: Vec<usize> = (0..want.len())
            .filter(|&i| {
                !o.tol
                    .allows(o.got.get_f64(i).unwrap(), want.get_f64(i).unwrap())
            })
            .collect();
        if let Some(&i) = bad.first() {
            return Err(case.err(format!(
                "`{}`: {} of {} elements mismatch; first [{i}]: got {}, expected {} ({:?})",
                o.name,
                bad.len(),
                want.len(),
                o.got.get_f64(i).unwrap(),
                want.get_f64(i).unwrap(),
                o.tol
            )));
        }
        compared += want.len();
    }
    if let Some(k) = case.tensors.keys().next() {
        return Err(case.err(format!("unexpected tensor `{k}`")));
    }
    if let Some(k) = case.meta.keys().next() {
        return Err(case.err(format!("unexpected metadata key `{k}`")));
    }
    Ok(compared)
}

fn encoder(c: &mut Case) -> Result<Vec<Output>, String> {
    let backward = c.op == "encoder_backward";
    let accumulate = if backward {
        c.meta_bool("accumulate")?
    } else {
        false
    };
    let dt = c.dtype(if backward { "dout" } else { "wte" })?;
    let (ts, tokens) = c.ints("tokens")?;
    let (batch, seq) = (ts[0], ts[1]);
    with_dtype!(dt, T => {
        let (ws, wte_or_dwte) = c.typed::<T>(if backward { "dwte" } else { "wte" })?;
        let (ps, wpe_or_dwpe) = c.typed::<T>(if backward { "dwpe" } else { "wpe" })?;
        let params = cpu::EncoderParams { batch, seq, channels: ws[1], vocab: ws[0], positions: ps[0], accumulate };
        if backward {
            let (_, dout) = c.typed::<T>("dout")?;
            let (mut dwte, mut dwpe) = (wte_or_dwte, wpe_or_dwpe);
            cpu::encoder_backward(cpu::EncoderBackward { params, tokens: &tokens, dout: &dout, dwte: &mut dwte, dwpe: &mut dwpe, error: None })
                .map_err(|e| c.err(e))?;
            // Worst case: every position holds the same token.
            let add = usize::from(accumulate);
            Ok(vec![
                out("dwte", &dwte, reduction(dt, batch * seq + add)),
                out("dwpe", &dwpe, reduction(dt, batch + add)),
            ])
        } else {
            let mut o = vec![T::from_f64(0.0); batch * seq * ws[1]];
            cpu::encoder_forward(cpu::EncoderForward { params, tokens: &tokens, wte: &wte_or_dwte, wpe: &wpe_or_dwpe, out: &mut o, error: None })
                .map_err(|e| c.err(e))?;
            Ok(vec![out("out", &o, reduction(dt, 2))])
        }
    })
}

fn elementwise(c: &mut Case) -> Result<Vec<Output>, String> {
    let first = if c.op == "residual_add" { "a" } else { "x" };
    let dt = c.dtype(first)?;
    with_dtype!(dt, T => {
        let (_, x) = c.typed::<T>(first)?;
        let params = cpu::ElementwiseParams { len: x.len() };
        let mut o = vec![T::from_f64(0.0); x.len()];
        let tol = reduction(dt, 1);
        match c.op.as_str() {
            "gelu_forward" => {
                cpu::gelu_forward(cpu::GeluForward { params, x: &x, out: &mut o }).map_err(|e| c.err(e))?;
                Ok(vec![out("out", &o, tol)])
            }
            "gelu_backward" => {
                let (_, dout) = c.typed::<T>("dout")?;
                cpu::gelu_backward(cpu::GeluBackward { params, x: &x, dout: &dout, dx: &mut o }).map_err(|e| c.err(e))?;
                Ok(vec![out("dx", &o, tol)])
            }
            _ => {
                let (_, b) = c.typed::<T>("b")?;
                cpu::residual_add(cpu::ResidualAdd { params, a: &x, b: &b, out: &mut o }).map_err(|e| c.err(e))?;
                Ok(vec![out("out", &o, tol)])
            }
        }
    })
}

fn crossentropy(c: &mut Case) -> Result<Vec<Output>, String> {
    let vocab = c.meta_f64("vocab")? as usize;
    let dloss = c.meta_opt_f64("dloss")?.map(|d| d as f32);
    let dt = c.dtype("logits")?;
    let (_, targets) = c.ints("targets")?;
    with_dtype!(dt, T => {
        let (ls, mut logits) = c.typed::<T>("logits")?;
        let params = cpu::CrossEntropyParams { rows: ls[0], vocab, padded_vocab: ls[1], dloss };
        let mut losses = vec![0.0f32; ls[0]];
        let mut loss = [0.0f32];
        let mean = cpu::softmax_cross_entropy(cpu::SoftmaxCrossEntropy { params, logits: &mut logits, targets: &targets, losses: &mut losses, loss: Some(&mut loss), error: None })
            .map_err(|e| c.err(e))?;
        assert_eq!(loss[0].to_bits(), (mean as f32).to_bits(), "the loss output is the returned mean, rounded");
        // lse sums `vocab` exponentials; dlogits = (p − onehot)·dloss/n inherits lse's relative
        // error, and its absolute floor scales with dloss/n.
        let counted = targets.iter().filter(|&&t| t != cpu::IGNORE_INDEX).count().max(1);
        let loss_tol = reduction(DType::F32, vocab);
        let mut outs = vec![
            out("losses", &losses, loss_tol),
            out("loss", &[mean as f32], loss_tol),
        ];
        if let Some(d) = dloss {
            let base = reduction(dt, 1);
            let s = f64::from(d).abs() / counted as f64;
            let tol = Tolerance { rtol: base.rtol + reduction(DType::F32, vocab).atol, atol: base.atol * s };
            outs.push(out("dlogits", &logits, tol));
        }
        Ok(outs)
    })
}

fn bias(c: &mut Case) -> Result<Vec<Output>, String> {
    if c.op == "bias_backward" {
        let accumulate = c.meta_bool("accumulate")?;
        let dt = c.dtype("dout")?;
        return with_dtype!(dt, T => {
            let (ds, dout) = c.typed::<T>("dout")?;
            let (_, mut dbias) = c.typed::<T>("dbias")?;
            let params = cpu::BiasParams { rows: ds[0], cols: ds[1], accumulate };
            cpu::bias_backward(cpu::BiasBackward { params, dout: &dout, dbias: &mut dbias }).map_err(|e| c.err(e))?;
            Ok(vec![out("dbias", &dbias, reduction(dt, ds[0] + 1))])
        });
    }
    let (trans_a, trans_b, gelu) = (
        c.meta_bool("trans_a")?,
        c.meta_bool("trans_b")?,
        c.meta_bool("gelu")?,
    );
    let dt = c.dtype("a")?;
    with_dtype!(dt, T => {
        let (sa, a) = c.typed::<T>("a")?;
        let (sb, b) = c.typed::<T>("b")?;
        let (_, bias) = c.typed::<T>("bias")?;
        let batch = if sa.len() == 3 { sa[0] } else { 1 };
        let (r, cc) = (sa[sa.len() - 2], sa[sa.len() - 1]);
        let (m, k) = if trans_a { (cc, r) } else { (r, cc) };
        let n = if trans_b { sb[sb.len() - 2] } else { sb[sb.len() - 1] };
        let params = cpu::MatmulBiasParams { gelu, ..MatmulShape { batch, m, n, k, trans_a, trans_b }.into() };
        let mut o = vec![T::from_f64(0.0); batch * m * n];
        let mut pre = gelu.then(|| o.clone());
        cpu::matmul_bias(cpu::MatmulBias { params, a: &a, b: &b, bias: &bias, out: &mut o, pre_gelu: pre.as_deref_mut() })
            .map_err(|e| c.err(e))?;
        let tol = reduction(dt, k + 1);
        let mut outs = vec![out("out", &o, tol)];
        if let Some(p) = pre {
            outs.push(out("pre_gelu", &p, tol));
        }
        Ok(outs)
    })
}

fn residual_layernorm(c: &mut Case) -> Result<Vec<Output>, String> {
    let eps = c.meta_f64("eps")? as f32;
    let dt = c.dtype("a")?;
    with_dtype!(dt, T => {
        let (s, a) = c.typed::<T>("a")?;
        let (_, b) = c.typed::<T>("b")?;
        let (_, weight) = c.typed::<T>("weight")?;
        let (_, bias) = c.typed::<T>("bias")?;
        let (rows, cols) = (s[0], s[1]);
        let (mut x, mut y) = (a.clone(), a.clone());
        let (mut mean, mut rstd) = (vec![0.0f32; rows], vec![0.0f32; rows]);
        cpu::residual_layernorm_forward(cpu::ResidualLayerNormForward {
            params: cpu::ResidualLayerNormParams { rows, cols, eps },
            a: &a, b: &b, weight: &weight, bias: &bias,
            residual: &mut x, y: &mut y, mean: &mut mean, rstd: &mut rstd,
        }).map_err(|e| c.err(e))?;
        let ln = |name, d| tolerance(Op::LayerNormForward, name, d, dt, cols);
        Ok(vec![
            out("residual", &x, reduction(dt, 2)),
            out("y", &y, ln("y", dt)),
            out("mean", &mean, ln("mean", DType::F32)),
            out("rstd", &rstd, ln("rstd", DType::F32)),
        ])
    })
}

fn attention(c: &mut Case) -> Result<Vec<Output>, String> {
    use cpu::{AttentionLayout as L, Qkv, Strided};
    let backward = c.op == "attention_backward_strided";
    let causal = c.meta_bool("causal")?;
    let scale = c.meta_f64("scale")? as f32;
    let layout = c.meta("layout")?;
    let dt = c.dtype("qkv")?;
    let (qs, fused) = match layout.as_str() {
        "bt3hd" => (c.tensors["qkv"].shape.clone(), true),
        "packed" => (c.tensors["qkv"].shape.clone(), false),
        other => return Err(c.err(format!("metadata `layout` = {other:?} is not bt3hd/packed"))),
    };
    // [B, T, 3, H, D] or [3, B, H, T, D].
    let (b, t, h, d) = if fused {
        (qs[0], qs[1], qs[3], qs[4])
    } else {
        (qs[1], qs[3], qs[2], qs[4])
    };
    let shape = AttentionShape {
        batch: b,
        heads: h,
        tq: t,
        tk: t,
        head_dim: d,
        causal,
        scale,
    };
    let n = b * h * t * d;
    let qkv_layout = |w: Qkv| {
        if fused {
            L::fused_qkv(w, t, h, d)
        } else {
            L {
                offset: w as usize * n,
                ..L::packed(h, t, d)
            }
        }
    };
    let out_layout = if fused {
        L::bthd(t, h, d)
    } else {
        L::packed(h, t, d)
    };
    with_dtype!(dt, T => {
        let (_, qkv) = c.typed::<T>("qkv")?;
        let view = |w| Strided { data: &qkv[..], layout: qkv_layout(w) };
        if backward {
            let (_, o) = c.typed::<T>("out")?;
            let (_, dout) = c.typed::<T>("dout")?;
            let (_, lse) = c.typed::<f32>("lse")?;
            let mut dqkv = vec![T::from_f64(0.0); qkv.len()];
            cpu::attention_backward_strided(cpu::AttentionBackwardStrided {
                params: shape,
                q: view(Qkv::Q), k: view(Qkv::K), v: view(Qkv::V),
                out: Strided { data: &o, layout: out_layout },
                dout: Strided { data: &dout, layout: out_layout },
                lse: &lse,
                dqkv: &mut dqkv,
                dq: qkv_layout(Qkv::Q), dk: qkv_layout(Qkv::K), dv: qkv_layout(Qkv::V),
            }).map_err(|e| c.err(e))?;
            Ok(vec![out("dqkv", &dqkv, tolerance(Op::AttentionBackward, "dq", dt, dt, t.max(d)))])
        } else {
            let mut o = vec![T::from_f64(0.0); n];
            let mut lse = vec![0.0f32; b * h * t];
            cpu::attention_forward_strided(cpu::AttentionForwardStrided {
                params: shape,
                q: view(Qkv::Q), k: view(Qkv::K), v: view(Qkv::V),
                out: &mut o, out_layout, lse: &mut lse,
            }).map_err(|e| c.err(e))?;
            Ok(vec![
                out("out", &o, tolerance(Op::AttentionForward, "out", dt, dt, t)),
                out("lse", &lse, tolerance(Op::AttentionForward, "lse", DType::F32, dt, d.max(t))),
            ])
        }
    })
}

fn clip(c: &mut Case) -> Result<Vec<Output>, String> {
    let max_norm = c.meta_f64("max_norm")?;
    let loss_scale = c.meta_f64("loss_scale")?;
    let (_, norm) = c.typed::<f32>("norm")?;
    let norm = f64::from(norm[0]);
    let coef = cpu::clip_coefficient(norm / loss_scale, max_norm).map_err(|e| c.err(e))?;
    let mut scale = [0.0f32];
    let s = [loss_scale as f32];
    cpu::clip_grad_scale(cpu::ClipGradScale {
        params: cpu::ClipParams {
            max_norm: max_norm as f32,
        },
        norm: &[norm as f32],
        loss_scale: (loss_scale != 1.0).then_some(&s[..]),
        grad_scale: &mut scale,
    })
    .map_err(|e| c.err(e))?;
    let tol = reduction(DType::F32, 1);
    let rel = Tolerance {
        rtol: tol.rtol,
        atol: 0.0,
    };
    Ok(vec![
        out("coefficient", &[coef as f32], tol),
        out("grad_scale", &scale, rel),
    ])
}

impl Case {
    /// Move one element of a floating-point tensor by a few tolerances (for tests of the runner).
    pub fn perturb(&mut self, tensor: &str, index: usize) {
        let bump = |x: f64| x + 0.05 * x.abs() + 0.01;
        let t = self.tensors.get_mut(tensor).expect("tensor exists");
        match &mut t.values {
            Values::Float(TensorData::F32(v)) => v[index] = bump(f64::from(v[index])) as f32,
            Values::Float(TensorData::F16(v)) => {
                v[index] = half::f16::from_f64(bump(v[index].to_f64()))
            }
            Values::Float(TensorData::BF16(v)) => {
                v[index] = half::bf16::from_f64(bump(v[index].to_f64()))
            }
            Values::I32(_) => panic!("`{tensor}` is not floating point"),
        }
    }
}
