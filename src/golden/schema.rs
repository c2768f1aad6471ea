//! Strict parsing of a case file into typed inputs and expected outputs.

use super::file::{read_case_file, reject_duplicate_keys};
use super::{GoldenCase, GoldenError, Tensor, TensorData};
use crate::params::DType;
use half::{bf16, f16};
use safetensors::{Dtype, SafeTensors};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

/// A parsed case: inputs and expected outputs.
#[derive(Debug)]
pub struct Case {
    /// File stem (or the name given to [`parse_case`]).
    pub name: String,
    /// The op's storage dtype (of `a`, `x`, `q` or `param`).
    pub dtype: DType,
    /// Typed inputs (the op's case type; see [`GoldenCase::as_any`]).
    pub inputs: Box<dyn GoldenCase>,
    /// Expected outputs by name without the `expected_` prefix, in the schema's order.
    pub expected: Vec<(String, Tensor)>,
}

impl Case {
    /// The op name.
    pub fn op(&self) -> &'static str {
        self.inputs.op()
    }

    /// Expected tensor `name` (without the `expected_` prefix).
    /// Take the `expected_<name>` tensors of `outs` (name, dtype rule, shape), in order.
    pub fn expected(&self, name: &str) -> Option<&Tensor> {
        self.expected
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t)
    }
}

/// Read and parse one case file: a regular file (after following links) of at most
/// [`MAX_CASE_BYTES`](super::MAX_CASE_BYTES); anything else is a [`GoldenError`] naming the
/// path.
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
    let mut ints = BTreeMap::new();
    for (tname, view) in st.tensors() {
        let shape = view.shape().to_vec();
        if view.dtype() == Dtype::I32 {
            // Token ids and class targets.
            let v = view
                .data()
                .chunks_exact(4)
                .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            ints.insert(tname, (shape, v));
            continue;
        }
        let data = decode(name, &tname, view.dtype(), view.data())?;
        tensors.insert(tname, Tensor { shape, data });
    }
    let mut r = CaseReader {
        case: name,
        meta,
        used: RefCell::default(),
        tensors,
        ints,
    };
    let op_name = r.meta_str("op")?;
    let op = crate::ops::golden_op(&op_name).ok_or_else(|| GoldenError::UnknownOp {
        case: name.to_string(),
        op: op_name.clone(),
    })?;
    let case = (op.parse)(&mut r)?;
    if let Some(extra) = r.tensors.keys().chain(r.ints.keys()).next() {
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
                expected: "F32, F16 or BF16 (I32 for token ids and targets)".into(),
                got: format!("{other:?}"),
            })
        }
    })
}

/// Which dtype a tensor must have.
#[derive(Clone, Copy, Debug)]
pub enum Want {
    /// The case's storage dtype.
    Case,
    /// Always f32 (statistics, lse, optimizer state).
    F32,
}

/// A case file being parsed: its metadata and the tensors not yet taken. Each op's `parse`
/// (registered in [`crate::ops`]) takes what its schema defines; a tensor left over is an error.
pub struct CaseReader<'a> {
    case: &'a str,
    meta: HashMap<String, String>,
    /// Metadata keys read so far; any other key is a [`GoldenError::UnknownMetadata`].
    used: RefCell<BTreeSet<String>>,
    tensors: BTreeMap<String, Tensor>,
    /// The int32 tensors (token ids, class targets): shape and values.
    ints: BTreeMap<String, (Vec<usize>, Vec<i32>)>,
}

impl CaseReader<'_> {
    /// Whether metadata `key` is present (a key looked at counts as read).
    pub fn has_meta(&self, key: &str) -> bool {
        self.used.borrow_mut().insert(key.to_string());
        self.meta.contains_key(key)
    }

    /// Metadata `key` as a string.
    pub fn meta_str(&self, key: &str) -> Result<String, GoldenError> {
        self.used.borrow_mut().insert(key.to_string());
        self.meta
            .get(key)
            .cloned()
            .ok_or_else(|| GoldenError::MissingMetadata {
                case: self.case.to_string(),
                key: key.to_string(),
            })
    }

    pub(crate) fn bad(&self, key: &str, value: &str, expected: &'static str) -> GoldenError {
        GoldenError::BadMetadata {
            case: self.case.to_string(),
            key: key.to_string(),
            value: value.to_string(),
            expected,
        }
    }

    /// Metadata `key` as a float (decimal or Python `repr`).
    pub fn meta_f64(&self, key: &str) -> Result<f64, GoldenError> {
        let v = self.meta_str(key)?;
        v.trim()
            .parse()
            .map_err(|_| self.bad(key, &v, "a decimal or Python-repr float"))
    }

    /// A parameter the op takes as f32. Parsed as f64; rounding to f32 must not turn a non-zero
    /// value into zero or a finite one into infinity, since validation (`beta != 0`, `eps >= 0`,
    /// finiteness) would then judge another number than the file holds.
    pub fn meta_f32(&self, key: &str) -> Result<f32, GoldenError> {
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

    /// Metadata `key` as a non-negative integer.
    pub fn meta_u64(&self, key: &str) -> Result<u64, GoldenError> {
        let v = self.meta_str(key)?;
        v.trim()
            .parse()
            .map_err(|_| self.bad(key, &v, "a non-negative decimal integer"))
    }

    /// Metadata `key` as `true` / `false`.
    pub fn meta_bool(&self, key: &str) -> Result<bool, GoldenError> {
        match self.meta_str(key)?.as_str() {
            "true" => Ok(true),
            "false" => Ok(false),
            v => Err(self.bad(key, v, "`true` or `false`")),
        }
    }

    /// Take tensor `name`, checking its dtype (`Want::Case` → `dtype`) and, if given, its shape.
    pub fn take(
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

    /// Take the int32 tensor `name` (token ids, targets), checking its shape if given.
    pub fn take_i32(
        &mut self,
        name: &str,
        shape: Option<&[usize]>,
    ) -> Result<(Vec<usize>, Vec<i32>), GoldenError> {
        let Some((s, v)) = self.ints.remove(name) else {
            return Err(if self.tensors.contains_key(name) {
                GoldenError::TensorDType {
                    case: self.case.to_string(),
                    tensor: name.to_string(),
                    expected: "I32".into(),
                    got: "a float type".into(),
                }
            } else {
                GoldenError::MissingTensor {
                    case: self.case.to_string(),
                    tensor: name.to_string(),
                }
            });
        };
        if let Some(want) = shape {
            if s != want {
                return Err(self.shape_err(name, format!("{want:?}"), &s));
            }
        }
        Ok((s, v))
    }

    /// [`CaseReader::take`] if the tensor is present.
    pub fn take_opt(
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
    pub fn presence(&self, tensor: &str, present: bool, required: bool) -> Result<(), GoldenError> {
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

    /// A [`GoldenError::TensorShape`] for `tensor`.
    pub fn shape_err(&self, tensor: &str, expected: String, got: &[usize]) -> GoldenError {
        GoldenError::TensorShape {
            case: self.case.to_string(),
            tensor: tensor.to_string(),
            expected,
            got: got.to_vec(),
        }
    }

    /// The case dtype from a primary input (peeked, not taken).
    pub fn primary(&self, name: &str) -> Result<(DType, Vec<usize>), GoldenError> {
        let t = self
            .tensors
            .get(name)
            .ok_or_else(|| GoldenError::MissingTensor {
                case: self.case.to_string(),
                tensor: name.to_string(),
            })?;
        Ok((t.data.dtype(), t.shape.clone()))
    }

    /// Take the `expected_<name>` tensors of `outs` (name, dtype rule, shape), in order.
    pub fn expected(
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

    /// The parsed case: `inputs` with the expected outputs taken by [`CaseReader::expected`].
    pub fn finish(
        &self,
        dtype: DType,
        inputs: Box<dyn GoldenCase>,
        expected: Vec<(String, Tensor)>,
    ) -> Case {
        Case {
            name: self.case.to_string(),
            dtype,
            inputs,
            expected,
        }
    }
}

/// The values of a tensor already checked to be f32.
pub fn f32s(t: Tensor) -> Vec<f32> {
    match t.data {
        TensorData::F32(v) => v,
        _ => Vec::new(),
    }
}
