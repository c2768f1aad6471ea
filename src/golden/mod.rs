//! Golden cases: reading the PyTorch-generated case files and checking an implementation
//! against them.
//!
//! A case is one `.safetensors` file in the schema of issue 3 (see `docs/GOLDEN-CASES.md` and
//! `tools/golden/README.md`): `__metadata__` holds `op` and its parameters, inputs are plain
//! names, expected outputs are `expected_<name>`. [`load_case`] parses a file strictly (an
//! unknown op, a missing or unexpected tensor, a wrong dtype or shape is a [`GoldenError`] naming
//! the case and the key). [`run_case_with`] runs any [`GoldenBackend`] on it and compares every
//! output with the tolerances of [`crate::tolerance`]; [`run_case`] does so with the CPU
//! reference ([`CpuBackend`]).

mod backend;
mod compare;
mod file;
mod schema;
mod space;

pub use backend::{
    download, download_f32, upload, CpuBackend, DeviceBackend, GoldenBackend, GoldenCase, Outputs,
};
pub use compare::{compare, run_case, run_case_with, CaseReport, Mismatch, TensorReport};
pub use schema::{f32s, load_case, parse_case, Case, CaseReader, Want};
pub use space::GoldenSpace;

/// A golden op: its name (the `op` metadata) and the parser of its case files. Each op family
/// lists its own in `GOLDEN` (`src/ops/<family>/golden.rs`); [`crate::ops::registry`] collects
/// them.
#[derive(Clone, Copy)]
pub struct GoldenOp {
    /// The `op` metadata value (`layernorm_forward`).
    pub name: &'static str,
    /// Reads the op's metadata and tensors strictly and returns the case
    /// ([`CaseReader::finish`]).
    pub parse: fn(&mut CaseReader<'_>) -> Result<Case, GoldenError>,
}

impl std::fmt::Debug for GoldenOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GoldenOp")
            .field("name", &self.name)
            .finish()
    }
}

use crate::params::{DType, Element, ShapeError};
use half::{bf16, f16};
use std::path::{Path, PathBuf};

/// Dense tensor values of one storage type.
#[derive(Debug, Clone, PartialEq)]
pub enum TensorData {
    /// f32 values.
    F32(Vec<f32>),
    /// f16 values.
    F16(Vec<f16>),
    /// bf16 values.
    BF16(Vec<bf16>),
}

impl TensorData {
    /// The storage type.
    pub fn dtype(&self) -> DType {
        match self {
            TensorData::F32(_) => DType::F32,
            TensorData::F16(_) => DType::F16,
            TensorData::BF16(_) => DType::BF16,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            TensorData::F32(v) => v.len(),
            TensorData::F16(v) => v.len(),
            TensorData::BF16(v) => v.len(),
        }
    }

    /// True when there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` widened to f64 (None when out of range).
    pub fn get_f64(&self, i: usize) -> Option<f64> {
        match self {
            TensorData::F32(v) => v.get(i).map(|x| x.to_f64()),
            TensorData::F16(v) => v.get(i).map(|x| Element::to_f64(*x)),
            TensorData::BF16(v) => v.get(i).map(|x| Element::to_f64(*x)),
        }
    }

    /// The values as a typed slice, if `T` is the storage type.
    pub fn as_slice<T: Element>(&self) -> Option<&[T]> {
        match self {
            TensorData::F32(v) => bytemuck::try_cast_slice(v).ok(),
            TensorData::F16(v) => bytemuck::try_cast_slice(v).ok(),
            TensorData::BF16(v) => bytemuck::try_cast_slice(v).ok(),
        }
        .filter(|_| T::DTYPE == self.dtype())
    }

    /// Copy a typed slice (bit-exact: the f32 round trip is exact for each storage type).
    pub fn from_slice<T: Element>(values: &[T]) -> TensorData {
        let wide = values.iter().map(|v| v.to_f32());
        match T::DTYPE {
            DType::F32 => TensorData::F32(wide.collect()),
            DType::F16 => TensorData::F16(wide.map(f16::from_f32).collect()),
            DType::BF16 => TensorData::BF16(wide.map(bf16::from_f32).collect()),
        }
    }

    /// A typed slice or a [`ShapeError::DType`] naming the tensor.
    pub fn typed<T: Element>(
        &self,
        op: &'static str,
        tensor: &'static str,
    ) -> Result<&[T], ShapeError> {
        self.as_slice().ok_or(ShapeError::DType {
            op,
            tensor,
            expected: T::DTYPE,
            got: self.dtype(),
        })
    }
}

/// A named tensor of a case: shape and values.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// Row-major shape.
    pub shape: Vec<usize>,
    /// Values.
    pub data: TensorData,
}

/// Run `$body` with the type alias `$T` bound to the Rust type of a [`DType`] value.
///
/// ```
/// use hip_kernels::{params::{DType, Element}, with_dtype};
/// let bytes = with_dtype!(DType::BF16, T => std::mem::size_of::<T>());
/// assert_eq!(bytes, 2);
/// ```
#[macro_export]
macro_rules! with_dtype {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            $crate::params::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::params::DType::F16 => {
                type $T = $crate::params::f16;
                $body
            }
            $crate::params::DType::BF16 => {
                type $T = $crate::params::bf16;
                $body
            }
        }
    };
}

/// A golden case could not be read, run, or did not match.
#[derive(Debug, thiserror::Error)]
pub enum GoldenError {
    /// The file or directory could not be read.
    #[error("golden: cannot read {path}: {source}")]
    Io {
        /// Path.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// A case path names something other than a regular file (after following links): a FIFO
    /// would block the reader forever, a device such as `/dev/zero` never ends.
    #[error("golden: {path} is {kind}, not a regular file; only regular .safetensors files are read as cases")]
    NotAFile {
        /// Path.
        path: PathBuf,
        /// What it is, e.g. `a FIFO (named pipe)`.
        kind: &'static str,
    },
    /// A case file is larger than [`MAX_CASE_BYTES`].
    #[error("golden: {path} holds {size} bytes, more than the {limit}-byte limit for a case file; split the case or remove the file")]
    TooLarge {
        /// Path.
        path: PathBuf,
        /// Its size in bytes (at least this many when it grew while being read).
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// Running a case panicked (a bug in the implementation under test or in this crate); the
    /// runner caught it so that the other cases still run.
    #[error("golden: running {path} panicked: {message}; this is a bug, please report it with this case file")]
    Panicked {
        /// The case file.
        path: PathBuf,
        /// The panic message.
        message: String,
    },
    /// Not a valid safetensors file.
    #[error("golden case {case}: not a valid safetensors file: {source}")]
    Format {
        /// Case name.
        case: String,
        /// Cause.
        source: safetensors::SafeTensorError,
    },
    /// A key appears twice in the safetensors header (`place` is `header` for tensor names,
    /// `__metadata__` for metadata): JSON readers silently keep one of them.
    #[error("golden case {case}: key `{key}` appears more than once in the {place} of the safetensors header; remove the duplicate or regenerate the case")]
    DuplicateKey {
        /// Case name.
        case: String,
        /// The repeated key.
        key: String,
        /// `header` or `__metadata__`.
        place: &'static str,
    },
    /// A metadata key the case's op does not read (a typo would otherwise be ignored).
    #[error("golden case {case}: metadata key `{key}` is not a parameter of op {op}; remove it or fix its name")]
    UnknownMetadata {
        /// Case name.
        case: String,
        /// The key.
        key: String,
        /// The case's op.
        op: String,
    },
    /// A required metadata key is missing.
    #[error("golden case {case}: metadata key `{key}` is missing; regenerate the case with tools/golden/gen.py")]
    MissingMetadata {
        /// Case name.
        case: String,
        /// Key.
        key: String,
    },
    /// A metadata value does not parse.
    #[error("golden case {case}: metadata `{key}` = {value:?} is not {expected}")]
    BadMetadata {
        /// Case name.
        case: String,
        /// Key.
        key: String,
        /// The raw value.
        value: String,
        /// What was expected.
        expected: &'static str,
    },
    /// The `op` is not one this crate knows.
    #[error("golden case {case}: unknown op {op:?}; known ops: {}", crate::ops::golden_op_names().join(", "))]
    UnknownOp {
        /// Case name.
        case: String,
        /// The op named in the file.
        op: String,
    },
    /// A tensor the op needs is missing.
    #[error("golden case {case}: tensor `{tensor}` is missing (the schema of this op requires it with these parameters)")]
    MissingTensor {
        /// Case name.
        case: String,
        /// Tensor name.
        tensor: String,
    },
    /// The file holds a tensor the schema does not define for this op.
    #[error("golden case {case}: unexpected tensor `{tensor}` (not in the schema of this op with these parameters)")]
    UnexpectedTensor {
        /// Case name.
        case: String,
        /// Tensor name.
        tensor: String,
    },
    /// A tensor has the wrong or an unsupported dtype.
    #[error("golden case {case}: tensor `{tensor}` has dtype {got} but must be {expected}")]
    TensorDType {
        /// Case name.
        case: String,
        /// Tensor name.
        tensor: String,
        /// Required dtype.
        expected: String,
        /// Stored dtype.
        got: String,
    },
    /// A tensor has the wrong shape.
    #[error("golden case {case}: tensor `{tensor}` has shape {got:?} but must be {expected}")]
    TensorShape {
        /// Case name.
        case: String,
        /// Tensor name.
        tensor: String,
        /// What was required.
        expected: String,
        /// Stored shape.
        got: Vec<usize>,
    },
    /// The case's parameters are rejected by the op's validation.
    #[error("golden case {case}: {source}")]
    Shape {
        /// Case name.
        case: String,
        /// Cause.
        source: ShapeError,
    },
    /// The implementation under test failed.
    #[error("golden case {case}: backend {backend} failed: {source}")]
    Backend {
        /// Case name.
        case: String,
        /// Backend name.
        backend: String,
        /// Cause.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The implementation returned an output of the wrong dtype or length.
    #[error("golden case {case}: backend output `{tensor}` is {got} but the expected tensor is {expected}")]
    OutputShape {
        /// Case name.
        case: String,
        /// Tensor name.
        tensor: String,
        /// Expected dtype and length.
        expected: String,
        /// Returned dtype and length.
        got: String,
    },
    /// An output differs from its expected value beyond tolerance.
    #[error("{0}")]
    Mismatch(Box<Mismatch>),
}

/// Largest case file [`load_case`] reads. The committed cases are under 100 KiB each; the cap
/// keeps a stray huge file from being read into memory.
pub const MAX_CASE_BYTES: u64 = 64 << 20;

/// The case files (`*.safetensors`, sorted by name) in a directory; other files are ignored.
pub fn case_files(dir: &Path) -> Result<Vec<PathBuf>, GoldenError> {
    let io = |source| GoldenError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let path = entry.map_err(io)?.path();
        if path.extension().is_some_and(|e| e == "safetensors") {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// The directory of the committed cases in this crate's source tree (`tests/golden`), as it was
/// at build time.
pub fn committed_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("golden")
}

/// Extra case directories from `HIPK_GOLDEN_DIR` (colon-separated; empty entries skipped).
pub fn env_dirs() -> Vec<PathBuf> {
    std::env::var_os("HIPK_GOLDEN_DIR").map_or_else(Vec::new, |v| {
        std::env::split_paths(&v)
            .filter(|p| !p.as_os_str().is_empty())
            .collect()
    })
}
