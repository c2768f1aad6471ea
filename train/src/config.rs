//! `config.json`: the family its `model_type` names ([`ModelConfig`]), and GPT-2's keys and
//! dimensions ([`GptConfig`]; the LLaMA family's are in [`crate::llama::config`]).

use crate::error::{read_regular, Result, TrainError};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Largest config.json read (real ones are about 1 KB).
const CONFIG_CAP: u64 = 1 << 20;

/// The dimensions of a GPT-2, from `config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct GptConfig {
    /// Vocabulary size V.
    pub vocab: usize,
    /// Positions P (longest sequence).
    pub positions: usize,
    /// Width C.
    pub channels: usize,
    /// Layers L.
    pub layers: usize,
    /// Heads H (C % H == 0).
    pub heads: usize,
    /// MLP width (`n_inner`, 4C when null or absent).
    pub inner: usize,
    /// Layer-norm epsilon.
    pub eps: f64,
    /// The file as read, written back unchanged into checkpoints.
    pub raw: Value,
    /// Where it was read from (named in errors).
    pub path: PathBuf,
}

impl GptConfig {
    /// Read and check `path`.
    pub fn load(path: &Path) -> Result<Self> {
        let bytes = read_regular(path, CONFIG_CAP)?;
        let raw: Value = serde_json::from_slice(&bytes)
            .map_err(|e| TrainError::file(path, format!("is not valid JSON: {e}")))?;
        Self::from_value(path, raw)
    }

    /// Check a parsed config (errors name `path` and the key).
    pub fn from_value(path: &Path, raw: Value) -> Result<Self> {
        let obj = raw
            .as_object()
            .ok_or_else(|| TrainError::file(path, "must hold a JSON object"))?;
        let bad = |key: &str, v: &Value, why: &str| {
            TrainError::file(path, format!("`{key}` = {v}: {why}"))
        };
        let count = |key: &str| -> Result<usize> {
            let v = obj
                .get(key)
                .ok_or_else(|| TrainError::file(path, format!("has no `{key}`")))?;
            match v.as_u64().and_then(|n| usize::try_from(n).ok()) {
                Some(n) if (1..=1 << 24).contains(&n) => Ok(n),
                _ => Err(bad(key, v, "must be an integer in 1..=16777216")),
            }
        };
        let (vocab, positions, channels) = (
            count("vocab_size")?,
            count("n_positions")?,
            count("n_embd")?,
        );
        let (layers, heads) = (count("n_layer")?, count("n_head")?);
        if channels % heads != 0 {
            return Err(TrainError::file(
                path,
                format!("`n_embd` = {channels} is not a multiple of `n_head` = {heads}"),
            ));
        }
        let inner = match obj.get("n_inner") {
            None | Some(Value::Null) => 4 * channels,
            Some(_) => count("n_inner")?,
        };
        let eps = match obj.get("layer_norm_epsilon") {
            None => 1e-5,
            Some(v) => match v.as_f64() {
                Some(e) if e.is_finite() && e >= 0.0 => e,
                _ => return Err(bad("layer_norm_epsilon", v, "must be a finite number >= 0")),
            },
        };
        match obj.get("activation_function") {
            None => {}
            Some(Value::String(s)) if s == "gelu_new" || s == "gelu_pytorch_tanh" => {}
            Some(v) => {
                return Err(bad(
                    "activation_function",
                    v,
                    "must be \"gelu_new\" or \"gelu_pytorch_tanh\" (GPT-2's tanh GELU)",
                ))
            }
        }
        Ok(Self {
            vocab,
            positions,
            channels,
            layers,
            heads,
            inner,
            eps,
            raw,
            path: path.to_path_buf(),
        })
    }

    /// Whether two configs describe the same parameter shapes and forward (keys other than the
    /// dimensions may differ).
    pub fn same_model(&self, other: &Self) -> bool {
        (
            self.vocab,
            self.positions,
            self.channels,
            self.layers,
            self.heads,
            self.inner,
        ) == (
            other.vocab,
            other.positions,
            other.channels,
            other.layers,
            other.heads,
            other.inner,
        ) && self.eps == other.eps
    }

    /// One-line description for errors: `V=96 P=32 C=32 L=2 H=4 inner=128`.
    pub fn describe(&self) -> String {
        format!(
            "vocab_size={} n_positions={} n_embd={} n_layer={} n_head={} n_inner={}",
            self.vocab, self.positions, self.channels, self.layers, self.heads, self.inner
        )
    }
}

/// A model's `config.json`, by family (`model_type`).
#[derive(Debug, Clone, PartialEq)]
pub enum ModelConfig {
    /// `gpt2` (or no `model_type`, as GPT-2 configs written before the key existed).
    Gpt2(GptConfig),
    /// `llama` or `qwen2`.
    Llama(crate::llama::LlamaConfig),
}

/// The `model_type` values the trainer reads.
pub const MODEL_TYPES: &str = "gpt2, llama, qwen2";

impl ModelConfig {
    /// Read `path` and check it as its `model_type` says.
    pub fn load(path: &Path) -> Result<Self> {
        let bytes = read_regular(path, CONFIG_CAP)?;
        let raw: Value = serde_json::from_slice(&bytes)
            .map_err(|e| TrainError::file(path, format!("is not valid JSON: {e}")))?;
        Self::from_value(path, raw)
    }

    /// Check a parsed config.
    pub fn from_value(path: &Path, raw: Value) -> Result<Self> {
        use crate::llama::{Family, LlamaConfig};
        let kind = match raw.get("model_type") {
            None | Some(Value::Null) => "gpt2".to_string(),
            Some(Value::String(s)) => s.clone(),
            Some(v) => {
                return Err(TrainError::file(
                    path,
                    format!("`model_type` = {v}: must be a string, one of {MODEL_TYPES}"),
                ))
            }
        };
        match kind.as_str() {
            "gpt2" => Ok(Self::Gpt2(GptConfig::from_value(path, raw)?)),
            "llama" => Ok(Self::Llama(LlamaConfig::from_value(
                path,
                Family::Llama,
                raw,
            )?)),
            "qwen2" => Ok(Self::Llama(LlamaConfig::from_value(
                path,
                Family::Qwen2,
                raw,
            )?)),
            other => Err(TrainError::file(
                path,
                format!(
                    "`model_type` = \"{other}\" is not supported; the trainer reads {MODEL_TYPES}"
                ),
            )),
        }
    }
}
