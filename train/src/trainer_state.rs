//! `trainer.json` of a checkpoint: the counters and flags a resumed run needs, written with
//! serde and read back key by key, so that every value out of range is an error naming the file
//! and the key (a corrupt counter must never overflow an addition later).

use crate::cli::Precision;
use crate::error::{Result, TrainError};
use serde::Serialize;
use serde_json::{Map, Value};
use std::path::Path;

/// The `format` value of trainer.json.
pub const FORMAT: &str = "hip-kernels/train_gpt2 checkpoint v1";

/// The loss scales accepted (`--scale-init`, trainer.json, the scaler's halving and doubling):
/// 2^-64 ..= 2^64. The scale multiplies the loss gradient and AdamW divides by it, both in f32;
/// inside this range the scale and its reciprocal are normal f32 numbers with room to spare.
pub const LOSS_SCALE_RANGE: std::ops::RangeInclusive<f64> =
    5.421010862427522e-20..=1.8446744073709552e19;

/// Everything besides tensors that a resumed run needs to continue bit-identically.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrainerState {
    /// [`FORMAT`].
    pub format: String,
    /// The last completed step.
    pub step: u64,
    /// The loader's position for the next micro-batch.
    pub loader_pos: usize,
    /// Tokens in the data file (a resume with other data is refused).
    pub data_tokens: usize,
    /// Loss scale (f16; 1 otherwise).
    pub loss_scale: f64,
    /// Clean steps since the loss scale last changed.
    pub scale_clean_steps: u64,
    /// AdamW updates done (steps minus those skipped for a non-finite gradient), the step
    /// count of the bias corrections, as torch keeps it per parameter.
    pub adam_steps: u64,
    /// Flags that change what a step reads: must be equal on resume.
    pub batch: usize,
    /// `--seq`.
    pub seq: usize,
    /// `--grad-accum`.
    pub grad_accum: usize,
    /// `--dtype`.
    pub dtype: Precision,
    /// Optimizer and schedule flags of the run that wrote it (recorded; a resume may change them).
    pub lr: f64,
    /// `--lr-min`.
    pub lr_min: Option<f64>,
    /// `--warmup`.
    pub warmup: u64,
    /// `--steps`.
    pub steps: u64,
    /// `--beta1`, `--beta2`, `--eps`, `--weight-decay`, `--grad-clip`.
    pub adamw: [f64; 5],
}

/// The keys of trainer.json, in the order written.
const KEYS: [&str; 16] = [
    "format",
    "step",
    "loader_pos",
    "data_tokens",
    "loss_scale",
    "scale_clean_steps",
    "adam_steps",
    "batch",
    "seq",
    "grad_accum",
    "dtype",
    "lr",
    "lr_min",
    "warmup",
    "steps",
    "adamw",
];

/// The names of the `adamw` entries, for errors.
const ADAMW: [&str; 5] = ["beta1", "beta2", "eps", "weight_decay", "grad_clip"];

/// Reads the keys of one JSON object; every error names the file and the key.
struct Keys<'a> {
    path: &'a Path,
    obj: &'a Map<String, Value>,
}

impl Keys<'_> {
    fn get(&self, key: &str) -> Result<&Value> {
        self.obj
            .get(key)
            .ok_or_else(|| TrainError::file(self.path, format!("has no `{key}`")))
    }

    fn bad(&self, key: &str, v: &Value, why: impl std::fmt::Display) -> TrainError {
        TrainError::file(self.path, format!("`{key}` = {v}: {why}"))
    }

    /// An integer in `lo..=hi`.
    fn int(&self, key: &str, lo: u64, hi: u64) -> Result<u64> {
        let v = self.get(key)?;
        match v.as_u64() {
            Some(n) if (lo..=hi).contains(&n) => Ok(n),
            _ => Err(self.bad(key, v, format_args!("must be an integer in {lo}..={hi}"))),
        }
    }

    /// A count of at least 1 that fits a usize.
    fn count(&self, key: &str) -> Result<usize> {
        let n = self.int(key, 1, usize::MAX as u64)?;
        usize::try_from(n).map_err(|_| self.bad(key, &n.into(), "does not fit this machine"))
    }

    /// A finite number >= 0.
    fn nonneg(&self, key: &str, v: &Value) -> Result<f64> {
        match v.as_f64() {
            Some(x) if x.is_finite() && x >= 0.0 => Ok(x),
            _ => Err(self.bad(key, v, "must be a finite number >= 0")),
        }
    }
}

impl TrainerState {
    /// Parse and range-check trainer.json's bytes (`path` is named in errors).
    pub fn from_json(path: &Path, bytes: &[u8]) -> Result<Self> {
        let raw: Value = serde_json::from_slice(bytes)
            .map_err(|e| TrainError::file(path, format!("is not valid JSON: {e}")))?;
        let obj = raw
            .as_object()
            .ok_or_else(|| TrainError::file(path, "must hold a JSON object"))?;
        if let Some(k) = obj.keys().find(|k| !KEYS.contains(&k.as_str())) {
            return Err(TrainError::file(path, format!("unexpected key `{k}`")));
        }
        let k = Keys { path, obj };
        let format = k.get("format")?;
        if format.as_str() != Some(FORMAT) {
            return Err(k.bad("format", format, format_args!("must be \"{FORMAT}\"")));
        }
        // A checkpoint is saved after a step, never at step 0.
        let step = k.int("step", 1, u64::MAX)?;
        let steps = k.int("steps", step, u64::MAX)?;
        // Neither AdamW updates nor clean steps can outnumber the steps run.
        let adam_steps = k.int("adam_steps", 0, step)?;
        let scale_clean_steps = k.int("scale_clean_steps", 0, step)?;
        let data_tokens = k.count("data_tokens")?;
        let loader_pos = k.int("loader_pos", 0, data_tokens as u64)? as usize;
        let (batch, seq, grad_accum) = (k.count("batch")?, k.count("seq")?, k.count("grad_accum")?);
        let dtype_v = k.get("dtype")?;
        let dtype: Precision = serde_json::from_value(dtype_v.clone())
            .map_err(|_| k.bad("dtype", dtype_v, "must be \"f32\", \"bf16\" or \"f16\""))?;
        let scale_v = k.get("loss_scale")?;
        let loss_scale = match (dtype, scale_v.as_f64()) {
            (Precision::F16, Some(x)) if LOSS_SCALE_RANGE.contains(&x) => x,
            (Precision::F16, _) => {
                return Err(k.bad(
                    "loss_scale",
                    scale_v,
                    format_args!(
                        "must be a number in {:e}..={:e} (2^-64..=2^64)",
                        LOSS_SCALE_RANGE.start(),
                        LOSS_SCALE_RANGE.end()
                    ),
                ))
            }
            (_, Some(x)) if x == 1.0 => x,
            _ => return Err(k.bad("loss_scale", scale_v, "must be 1 unless `dtype` is f16")),
        };
        let lr = k.nonneg("lr", k.get("lr")?)?;
        let lr_min = match k.get("lr_min")? {
            Value::Null => None,
            v => Some(k.nonneg("lr_min", v)?),
        };
        let warmup = k.int("warmup", 0, u64::MAX)?;
        let adamw_v = k.get("adamw")?;
        let list = adamw_v
            .as_array()
            .filter(|a| a.len() == ADAMW.len())
            .ok_or_else(|| {
                k.bad(
                    "adamw",
                    adamw_v,
                    "must be [beta1, beta2, eps, weight_decay, grad_clip]",
                )
            })?;
        let mut adamw = [0.0; 5];
        for (i, (v, name)) in list.iter().zip(ADAMW).enumerate() {
            // beta1 and beta2 in [0, 1); eps, weight decay and clip finite and >= 0.
            let (hi, why) = match i {
                0 | 1 => (1.0, "must be in [0, 1)"),
                _ => (f64::INFINITY, "must be a finite number >= 0"),
            };
            adamw[i] = v
                .as_f64()
                .filter(|x| (0.0..hi).contains(x))
                .ok_or_else(|| {
                    TrainError::file(path, format!("`adamw`[{i}] ({name}) = {v}: {why}"))
                })?;
        }
        Ok(Self {
            format: FORMAT.into(),
            step,
            loader_pos,
            data_tokens,
            loss_scale,
            scale_clean_steps,
            adam_steps,
            batch,
            seq,
            grad_accum,
            dtype,
            lr,
            lr_min,
            warmup,
            steps,
            adamw,
        })
    }
}
