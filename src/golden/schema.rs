//! Strict parsing of a case file into typed inputs and expected outputs.

use super::file::{read_case_file, reject_duplicate_keys};
use super::{GoldenError, Tensor, TensorData};
use crate::params::{
    AdamWConfig, AdamWStep, AttentionShape, DType, LayerNormShape, MatmulShape, Op,
};
use half::{bf16, f16};
use safetensors::{Dtype, SafeTensors};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

/// Inputs of a `matmul` case (`out` on entry holds `c` when present).
#[derive(Debug, Clone, PartialEq)]
pub struct MatmulCase {
    /// Shape and transposes.
    pub shape: MatmulShape,
    /// Scale of the product.
    pub alpha: f32,
    /// Scale of `c`.
    pub beta: f32,
    /// `a` (see [`MatmulShape`] for the layout).
    pub a: TensorData,
    /// `b`.
    pub b: TensorData,
    /// `c`, present iff `beta != 0`.
    pub c: Option<TensorData>,
}

/// Inputs of a `layernorm_forward` case.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerNormForwardCase {
    /// Rows and columns.
    pub shape: LayerNormShape,
    /// Variance epsilon.
    pub eps: f32,
    /// `[rows, cols]`.
    pub x: TensorData,
    /// `[cols]`.
    pub weight: TensorData,
    /// `[cols]`.
    pub bias: TensorData,
}

/// Inputs of a `layernorm_backward` case.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerNormBackwardCase {
    /// Rows and columns.
    pub shape: LayerNormShape,
    /// The forward's epsilon (informational: the backward uses the saved `rstd`).
    pub eps: f32,
    /// `[rows, cols]`.
    pub x: TensorData,
    /// `[cols]`.
    pub weight: TensorData,
    /// `[rows, cols]`.
    pub dy: TensorData,
    /// Saved per-row mean `[rows]`.
    pub mean: Vec<f32>,
    /// Saved per-row `1/√(var + eps)` `[rows]`.
    pub rstd: Vec<f32>,
}

/// Inputs of an `attention_forward` case.
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionForwardCase {
    /// Dimensions, mask and scale.
    pub shape: AttentionShape,
    /// `[B, H, Tq, D]`.
    pub q: TensorData,
    /// `[B, H, Tk, D]`.
    pub k: TensorData,
    /// `[B, H, Tk, D]`.
    pub v: TensorData,
}

/// Inputs of an `attention_backward` case.
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionBackwardCase {
    /// Dimensions, mask and scale.
    pub shape: AttentionShape,
    /// `[B, H, Tq, D]`.
    pub q: TensorData,
    /// `[B, H, Tk, D]`.
    pub k: TensorData,
    /// `[B, H, Tk, D]`.
    pub v: TensorData,
    /// Saved forward output `[B, H, Tq, D]`.
    pub out: TensorData,
    /// Gradient of `out`.
    pub dout: TensorData,
    /// Saved log-sum-exp `[B, H, Tq]`.
    pub lse: Vec<f32>,
}

/// Inputs of an `adamw` case.
#[derive(Debug, Clone, PartialEq)]
pub struct AdamWCase {
    /// Hyper-parameters.
    pub config: AdamWConfig,
    /// Step, grad scale and found_inf.
    pub step: AdamWStep,
    /// Parameters (any shape, flattened).
    pub param: TensorData,
    /// Gradients (param dtype).
    pub grad: TensorData,
    /// First moment.
    pub exp_avg: Vec<f32>,
    /// Second moment.
    pub exp_avg_sq: Vec<f32>,
    /// Running max of the second moment, present iff amsgrad.
    pub max_exp_avg_sq: Option<Vec<f32>>,
}

/// The typed inputs of a case, one variant per op.
#[derive(Debug, Clone, PartialEq)]
pub enum CaseInputs {
    /// `matmul`.
    Matmul(MatmulCase),
    /// `layernorm_forward`.
    LayerNormForward(LayerNormForwardCase),
    /// `layernorm_backward`.
    LayerNormBackward(LayerNormBackwardCase),
    /// `attention_forward`.
    AttentionForward(AttentionForwardCase),
    /// `attention_backward`.
    AttentionBackward(AttentionBackwardCase),
    /// `adamw`.
    AdamW(AdamWCase),
}

impl CaseInputs {
    /// The op of these inputs.
    pub fn op(&self) -> Op {
        match self {
            CaseInputs::Matmul(_) => Op::Matmul,
            CaseInputs::LayerNormForward(_) => Op::LayerNormForward,
            CaseInputs::LayerNormBackward(_) => Op::LayerNormBackward,
            CaseInputs::AttentionForward(_) => Op::AttentionForward,
            CaseInputs::AttentionBackward(_) => Op::AttentionBackward,
            CaseInputs::AdamW(_) => Op::AdamW,
        }
    }
}

/// A parsed case: inputs and expected outputs.
#[derive(Debug, Clone, PartialEq)]
pub struct Case {
    /// File stem (or the name given to [`parse_case`]).
    pub name: String,
    /// The op's storage dtype (of `a`, `x`, `q` or `param`).
    pub dtype: DType,
    /// Typed inputs.
    pub inputs: CaseInputs,
    /// Expected outputs by name without the `expected_` prefix, in the schema's order.
    pub expected: Vec<(String, Tensor)>,
}

impl Case {
    /// The op.
    pub fn op(&self) -> Op {
        self.inputs.op()
    }

    /// Expected tensor `name` (without the `expected_` prefix).
    pub fn expected(&self, name: &str) -> Option<&Tensor> {
        self.expected
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t)
    }
}

/// Read and parse one case file: a regular file (after following links) of at most
/// [`MAX_CASE_BYTES`]; anything else is a [`GoldenError`] naming the path.
pub fn load_case(path: &Path) -> Result<Case, GoldenError> {
    let bytes = read_case_file(path)?;
    let name = path.file_stem().map_or_else(
        || path.display().to_string(),
        |s| s.to_string_lossy().into_owned(),
    );
    parse_case(&name, &bytes)
}

/// Parse a case from its bytes; `name` is used in errors and reports.
pub fn parse_case(name: &str, bytes: &[u8]) -> Result<Case, GoldenError> {
    let format = |source| GoldenError::Format {
        case: name.to_string(),
        source,
    };
    reject_duplicate_keys(name, bytes)?;
    let (_, header) = SafeTensors::read_metadata(bytes).map_err(format)?;
    let st = SafeTensors::deserialize(bytes).map_err(format)?;
    let meta = header.metadata().clone().unwrap_or_default();
    let mut tensors = BTreeMap::new();
    for (tname, view) in st.tensors() {
        let data = decode(name, &tname, view.dtype(), view.data())?;
        let shape = view.shape().to_vec();
        tensors.insert(tname, Tensor { shape, data });
    }
    let mut r = Reader {
        case: name,
        meta,
        used: RefCell::default(),
        tensors,
    };
    let op_name = r.meta_str("op")?;
    let op = Op::from_name(&op_name).ok_or_else(|| GoldenError::UnknownOp {
        case: name.to_string(),
        op: op_name.clone(),
    })?;
    let case = match op {
        Op::Matmul => r.matmul()?,
        Op::LayerNormForward | Op::LayerNormBackward => r.layernorm(op)?,
        Op::AttentionForward | Op::AttentionBackward => r.attention(op)?,
        Op::AdamW => r.adamw()?,
    };
    if let Some(extra) = r.tensors.keys().next() {
        return Err(GoldenError::UnexpectedTensor {
            case: name.to_string(),
            tensor: extra.clone(),
        });
    }
    let mut unread: Vec<&String> = r
        .meta
        .keys()
        .filter(|k| !r.used.borrow().contains(*k))
        .collect();
    unread.sort();
    if let Some(key) = unread.first() {
        return Err(GoldenError::UnknownMetadata {
            case: name.to_string(),
            key: key.to_string(),
            op: op_name,
        });
    }
    Ok(case)
}

fn decode(case: &str, tensor: &str, dtype: Dtype, bytes: &[u8]) -> Result<TensorData, GoldenError> {
    let u16s = || {
        bytes
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    Ok(match dtype {
        Dtype::F32 => TensorData::F32(
            bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        ),
        Dtype::F16 => TensorData::F16(u16s().map(f16::from_bits).collect()),
        Dtype::BF16 => TensorData::BF16(u16s().map(bf16::from_bits).collect()),
        other => {
            return Err(GoldenError::TensorDType {
                case: case.to_string(),
                tensor: tensor.to_string(),
                expected: "F32, F16 or BF16".into(),
                got: format!("{other:?}"),
            })
        }
    })
}

/// Which dtype a tensor must have.
#[derive(Clone, Copy)]
enum Want {
    /// The case's storage dtype.
    Case,
    /// Always f32 (statistics, lse, optimizer state).
    F32,
}

struct Reader<'a> {
    case: &'a str,
    meta: HashMap<String, String>,
    /// Metadata keys read so far; any other key is a [`GoldenError::UnknownMetadata`].
    used: RefCell<BTreeSet<String>>,
    tensors: BTreeMap<String, Tensor>,
}

impl Reader<'_> {
    fn meta_str(&self, key: &str) -> Result<String, GoldenError> {
        self.used.borrow_mut().insert(key.to_string());
        self.meta
            .get(key)
            .cloned()
            .ok_or_else(|| GoldenError::MissingMetadata {
                case: self.case.to_string(),
                key: key.to_string(),
            })
    }

    fn bad(&self, key: &str, value: &str, expected: &'static str) -> GoldenError {
        GoldenError::BadMetadata {
            case: self.case.to_string(),
            key: key.to_string(),
            value: value.to_string(),
            expected,
        }
    }

    fn meta_f64(&self, key: &str) -> Result<f64, GoldenError> {
        let v = self.meta_str(key)?;
        v.trim()
            .parse()
            .map_err(|_| self.bad(key, &v, "a decimal or Python-repr float"))
    }

    /// A parameter the op takes as f32. Parsed as f64; rounding to f32 must not turn a non-zero
    /// value into zero or a finite one into infinity, since validation (`beta != 0`, `eps >= 0`,
    /// finiteness) would then judge another number than the file holds.
    fn meta_f32(&self, key: &str) -> Result<f32, GoldenError> {
        let wide = self.meta_f64(key)?;
        let narrow = wide as f32;
        if (wide != 0.0 && narrow == 0.0) || (wide.is_finite() && !narrow.is_finite()) {
            let raw = self.meta_str(key)?;
            return Err(self.bad(
                key,
                &raw,
                "a float whose f32 rounding stays non-zero and finite (this op computes in f32)",
            ));
        }
        Ok(narrow)
    }

    fn meta_u64(&self, key: &str) -> Result<u64, GoldenError> {
        let v = self.meta_str(key)?;
        v.trim()
            .parse()
            .map_err(|_| self.bad(key, &v, "a non-negative decimal integer"))
    }

    fn meta_bool(&self, key: &str) -> Result<bool, GoldenError> {
        match self.meta_str(key)?.as_str() {
            "true" => Ok(true),
            "false" => Ok(false),
            v => Err(self.bad(key, v, "`true` or `false`")),
        }
    }

    /// Take tensor `name`, checking its dtype (`Want::Case` → `dtype`) and, if given, its shape.
    fn take(
        &mut self,
        name: &str,
        want: Want,
        dtype: DType,
        shape: Option<&[usize]>,
    ) -> Result<Tensor, GoldenError> {
        let t = self
            .tensors
            .remove(name)
            .ok_or_else(|| GoldenError::MissingTensor {
                case: self.case.to_string(),
                tensor: name.to_string(),
            })?;
        let need = match want {
            Want::Case => dtype,
            Want::F32 => DType::F32,
        };
        if t.data.dtype() != need {
            return Err(GoldenError::TensorDType {
                case: self.case.to_string(),
                tensor: name.to_string(),
                expected: need.to_string(),
                got: t.data.dtype().to_string(),
            });
        }
        if let Some(s) = shape {
            if t.shape != s {
                return Err(self.shape_err(name, format!("{s:?}"), &t.shape));
            }
        }
        Ok(t)
    }

    fn take_opt(
        &mut self,
        name: &str,
        want: Want,
        dtype: DType,
        shape: Option<&[usize]>,
    ) -> Result<Option<Tensor>, GoldenError> {
        if self.tensors.contains_key(name) {
            self.take(name, want, dtype, shape).map(Some)
        } else {
            Ok(None)
        }
    }

    /// An optional tensor must be present iff `required`.
    fn presence(&self, tensor: &str, present: bool, required: bool) -> Result<(), GoldenError> {
        let case = self.case.to_string();
        match (present, required) {
            (false, true) => Err(GoldenError::MissingTensor {
                case,
                tensor: tensor.to_string(),
            }),
            (true, false) => Err(GoldenError::UnexpectedTensor {
                case,
                tensor: tensor.to_string(),
            }),
            _ => Ok(()),
        }
    }

    fn shape_err(&self, tensor: &str, expected: String, got: &[usize]) -> GoldenError {
        GoldenError::TensorShape {
            case: self.case.to_string(),
            tensor: tensor.to_string(),
            expected,
            got: got.to_vec(),
        }
    }

    /// The case dtype from a primary input (peeked, not taken).
    fn primary(&self, name: &str) -> Result<(DType, Vec<usize>), GoldenError> {
        let t = self
            .tensors
            .get(name)
            .ok_or_else(|| GoldenError::MissingTensor {
                case: self.case.to_string(),
                tensor: name.to_string(),
            })?;
        Ok((t.data.dtype(), t.shape.clone()))
    }

    fn expected(
        &mut self,
        outs: &[(&str, Want, Vec<usize>)],
        dtype: DType,
    ) -> Result<Vec<(String, Tensor)>, GoldenError> {
        outs.iter()
            .map(|(n, want, shape)| {
                Ok((
                    n.to_string(),
                    self.take(&format!("expected_{n}"), *want, dtype, Some(shape))?,
                ))
            })
            .collect()
    }

    fn finish(&self, dtype: DType, inputs: CaseInputs, expected: Vec<(String, Tensor)>) -> Case {
        Case {
            name: self.case.to_string(),
            dtype,
            inputs,
            expected,
        }
    }

    fn matmul(&mut self) -> Result<Case, GoldenError> {
        let (trans_a, trans_b) = (self.meta_bool("trans_a")?, self.meta_bool("trans_b")?);
        let (alpha, beta) = (self.meta_f32("alpha")?, self.meta_f32("beta")?);
        let (dtype, a_shape) = self.primary("a")?;
        let (_, b_shape) = self.primary("b")?;
        let split = |s: &[usize], name: &str| match *s {
            [r, c] => Ok((None, r, c)),
            [bt, r, c] => Ok((Some(bt), r, c)),
            _ => Err(self.shape_err(name, "[(batch,) rows, cols]".into(), s)),
        };
        let (batch, a0, a1) = split(&a_shape, "a")?;
        let (m, k) = if trans_a { (a1, a0) } else { (a0, a1) };
        let lead: Vec<usize> = batch.into_iter().collect();
        let (_, b0, b1) = split(&b_shape, "b")?;
        let n = if trans_b { b0 } else { b1 };
        let b_want: Vec<usize> = lead
            .iter()
            .copied()
            .chain(if trans_b { [n, k] } else { [k, n] })
            .collect();
        let out_shape: Vec<usize> = lead.iter().copied().chain([m, n]).collect();
        let a = self.take("a", Want::Case, dtype, None)?.data;
        let b = self.take("b", Want::Case, dtype, Some(&b_want))?.data;
        let c = self
            .take_opt("c", Want::Case, dtype, Some(&out_shape))?
            .map(|t| t.data);
        self.presence("c", c.is_some(), beta != 0.0)?;
        let shape = MatmulShape {
            batch: batch.unwrap_or(1),
            m,
            n,
            k,
            trans_a,
            trans_b,
        };
        let expected = self.expected(&[("out", Want::Case, out_shape)], dtype)?;
        Ok(self.finish(
            dtype,
            CaseInputs::Matmul(MatmulCase {
                shape,
                alpha,
                beta,
                a,
                b,
                c,
            }),
            expected,
        ))
    }

    fn layernorm(&mut self, op: Op) -> Result<Case, GoldenError> {
        let eps = self.meta_f32("eps")?;
        let (dtype, x_shape) = self.primary("x")?;
        let [rows, cols] = x_shape[..] else {
            return Err(self.shape_err("x", "[N, C]".into(), &x_shape));
        };
        let shape = LayerNormShape { rows, cols };
        let x = self.take("x", Want::Case, dtype, None)?.data;
        let weight = self.take("weight", Want::Case, dtype, Some(&[cols]))?.data;
        if op == Op::LayerNormForward {
            let bias = self.take("bias", Want::Case, dtype, Some(&[cols]))?.data;
            let expected = self.expected(
                &[
                    ("y", Want::Case, x_shape.clone()),
                    ("mean", Want::F32, vec![rows]),
                    ("rstd", Want::F32, vec![rows]),
                ],
                dtype,
            )?;
            return Ok(self.finish(
                dtype,
                CaseInputs::LayerNormForward(LayerNormForwardCase {
                    shape,
                    eps,
                    x,
                    weight,
                    bias,
                }),
                expected,
            ));
        }
        let dy = self.take("dy", Want::Case, dtype, Some(&x_shape))?.data;
        let mean = f32s(self.take("mean", Want::F32, dtype, Some(&[rows]))?);
        let rstd = f32s(self.take("rstd", Want::F32, dtype, Some(&[rows]))?);
        let expected = self.expected(
            &[
                ("dx", Want::Case, x_shape.clone()),
                ("dweight", Want::Case, vec![cols]),
                ("dbias", Want::Case, vec![cols]),
            ],
            dtype,
        )?;
        Ok(self.finish(
            dtype,
            CaseInputs::LayerNormBackward(LayerNormBackwardCase {
                shape,
                eps,
                x,
                weight,
                dy,
                mean,
                rstd,
            }),
            expected,
        ))
    }

    fn attention(&mut self, op: Op) -> Result<Case, GoldenError> {
        let (causal, scale) = (self.meta_bool("causal")?, self.meta_f32("scale")?);
        let (dtype, q_shape) = self.primary("q")?;
        let (_, k_shape) = self.primary("k")?;
        let [batch, heads, tq, head_dim] = q_shape[..] else {
            return Err(self.shape_err("q", "[B, H, Tq, D]".into(), &q_shape));
        };
        let tk = match k_shape[..] {
            [_, _, tk, _] => tk,
            _ => return Err(self.shape_err("k", "[B, H, Tk, D]".into(), &k_shape)),
        };
        let shape = AttentionShape {
            batch,
            heads,
            tq,
            tk,
            head_dim,
            causal,
            scale,
        };
        let kv_shape = [batch, heads, tk, head_dim];
        let lse_shape = vec![batch, heads, tq];
        let q = self.take("q", Want::Case, dtype, None)?.data;
        let k = self.take("k", Want::Case, dtype, Some(&kv_shape))?.data;
        let v = self.take("v", Want::Case, dtype, Some(&kv_shape))?.data;
        if op == Op::AttentionForward {
            let expected = self.expected(
                &[
                    ("out", Want::Case, q_shape.clone()),
                    ("lse", Want::F32, lse_shape),
                ],
                dtype,
            )?;
            return Ok(self.finish(
                dtype,
                CaseInputs::AttentionForward(AttentionForwardCase { shape, q, k, v }),
                expected,
            ));
        }
        let out = self.take("out", Want::Case, dtype, Some(&q_shape))?.data;
        let dout = self.take("dout", Want::Case, dtype, Some(&q_shape))?.data;
        let lse = f32s(self.take("lse", Want::F32, dtype, Some(&lse_shape))?);
        let kv = kv_shape.to_vec();
        let expected = self.expected(
            &[
                ("dq", Want::Case, q_shape.clone()),
                ("dk", Want::Case, kv.clone()),
                ("dv", Want::Case, kv),
            ],
            dtype,
        )?;
        Ok(self.finish(
            dtype,
            CaseInputs::AttentionBackward(AttentionBackwardCase {
                shape,
                q,
                k,
                v,
                out,
                dout,
                lse,
            }),
            expected,
        ))
    }

    fn adamw(&mut self) -> Result<Case, GoldenError> {
        let config = AdamWConfig {
            lr: self.meta_f64("lr")?,
            beta1: self.meta_f64("beta1")?,
            beta2: self.meta_f64("beta2")?,
            eps: self.meta_f64("eps")?,
            weight_decay: self.meta_f64("weight_decay")?,
            maximize: self.meta_bool("maximize")?,
            amsgrad: self.meta_bool("amsgrad")?,
        };
        let grad_scale = if self.meta.contains_key("grad_scale") {
            Some(self.meta_f32("grad_scale")?)
        } else {
            None
        };
        let step = AdamWStep {
            step: self.meta_u64("step")?,
            grad_scale,
            found_inf: self.meta_bool("found_inf")?,
        };
        let (dtype, shape) = self.primary("param")?;
        let param = self.take("param", Want::Case, dtype, None)?.data;
        let grad = self.take("grad", Want::Case, dtype, Some(&shape))?.data;
        let exp_avg = f32s(self.take("exp_avg", Want::F32, dtype, Some(&shape))?);
        let exp_avg_sq = f32s(self.take("exp_avg_sq", Want::F32, dtype, Some(&shape))?);
        let max_exp_avg_sq = self
            .take_opt("max_exp_avg_sq", Want::F32, dtype, Some(&shape))?
            .map(f32s);
        self.presence("max_exp_avg_sq", max_exp_avg_sq.is_some(), config.amsgrad)?;
        let mut outs = vec![
            ("param", Want::Case, shape.clone()),
            ("exp_avg", Want::F32, shape.clone()),
            ("exp_avg_sq", Want::F32, shape.clone()),
        ];
        if config.amsgrad {
            outs.push(("max_exp_avg_sq", Want::F32, shape));
        }
        let expected = self.expected(&outs, dtype)?;
        Ok(self.finish(
            dtype,
            CaseInputs::AdamW(AdamWCase {
                config,
                step,
                param,
                grad,
                exp_avg,
                exp_avg_sq,
                max_exp_avg_sq,
            }),
            expected,
        ))
    }
}

/// The values of a tensor already checked to be f32.
fn f32s(t: Tensor) -> Vec<f32> {
    match t.data {
        TensorData::F32(v) => v,
        _ => Vec::new(),
    }
}
