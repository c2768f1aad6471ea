//! `config.json` of the LLaMA family (HF `LlamaConfig` / `Qwen2Config` keys, both rotary
//! spellings) and the model's dimensions.

use crate::error::{Result, TrainError};
use hip_kernels::ops::rope::RopeScaling;
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// Which HF model class the config describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// `LlamaForCausalLM` (`model_type` `llama`).
    Llama,
    /// `Qwen2ForCausalLM` (`model_type` `qwen2`): biases on q, k, v; none on o or the MLP.
    Qwen2,
    /// `GlmForCausalLM` (`model_type` `glm`): fused gate-up, partial interleaved rotary
    /// (`crate::glm`).
    Glm,
    /// THUDM's ChatGLM2/3 / GLM-4 layout (`model_type` `chatglm`): fused q/k/v and gate-up
    /// (`crate::glm`).
    ChatGlm,
}

impl Family {
    /// Whether this is the GLM family (`glm` or `chatglm`).
    pub fn is_glm(self) -> bool {
        matches!(self, Family::Glm | Family::ChatGlm)
    }

    /// The `model_type` string.
    pub fn name(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Qwen2 => "qwen2",
            Family::Glm => "glm",
            Family::ChatGlm => "chatglm",
        }
    }
}

/// Which linear layers carry a bias.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Biases {
    /// q_proj, k_proj, v_proj.
    pub qkv: bool,
    /// o_proj.
    pub o: bool,
    /// gate_proj, up_proj, down_proj.
    pub mlp: bool,
}

/// The rotary embedding's parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rotary {
    /// Base θ.
    pub theta: f64,
    /// Frequency rescaling (`default` or `llama3`).
    pub scaling: RopeScaling,
}

/// The dimensions and options of a LLaMA-family model, from `config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    /// `model_type`.
    pub family: Family,
    /// Vocabulary size V.
    pub vocab: usize,
    /// Width C (`hidden_size`).
    pub channels: usize,
    /// MLP width F (`intermediate_size`).
    pub inner: usize,
    /// Layers L.
    pub layers: usize,
    /// Query heads H.
    pub heads: usize,
    /// Key/value heads K (H % K == 0).
    pub kv_heads: usize,
    /// Head dimension D (`head_dim`, C / H when absent).
    pub head_dim: usize,
    /// Positions P (`max_position_embeddings`).
    pub positions: usize,
    /// RMSNorm epsilon.
    pub eps: f64,
    /// The lm_head is the embedding.
    pub tied: bool,
    /// Which projections have biases.
    pub biases: Biases,
    /// Rotary parameters.
    pub rotary: Rotary,
    /// Dims of each head the rotary turns (D, or D·`partial_rotary_factor` for GLM).
    pub rotary_dim: usize,
    /// Rotary pairs are (x_{2i}, x_{2i+1}) (GLM) rather than (x_i, x_{i+R/2}).
    pub interleaved: bool,
    /// The file as read, written back unchanged into checkpoints.
    pub raw: Value,
    /// Where it was read from (named in errors).
    pub path: PathBuf,
}

/// Largest count a config may give (as for GPT-2).
const COUNT_MAX: u64 = 1 << 24;

/// Reads keys of one JSON object, with errors naming the file and the key.
pub(crate) struct Keys<'a> {
    pub(crate) path: &'a Path,
    pub(crate) obj: &'a Map<String, Value>,
    /// `rope_parameters.` when reading the nested object, for error messages.
    pub(crate) prefix: &'static str,
}

impl Keys<'_> {
    pub(crate) fn bad(&self, key: &str, v: &Value, why: &str) -> TrainError {
        TrainError::file(self.path, format!("`{}{key}` = {v}: {why}", self.prefix))
    }

    /// A present, non-null value.
    pub(crate) fn get(&self, key: &str) -> Option<&Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    pub(crate) fn count(&self, key: &str) -> Result<usize> {
        let v = self
            .get(key)
            .ok_or_else(|| TrainError::file(self.path, format!("has no `{}{key}`", self.prefix)))?;
        self.count_value(key, v)
    }

    pub(crate) fn count_value(&self, key: &str, v: &Value) -> Result<usize> {
        match v.as_u64().filter(|n| (1..=COUNT_MAX).contains(n)) {
            Some(n) => usize::try_from(n).map_err(|_| self.bad(key, v, "does not fit")),
            None => Err(self.bad(key, v, "must be an integer in 1..=16777216")),
        }
    }

    pub(crate) fn count_or(&self, key: &str, default: usize) -> Result<usize> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => self.count_value(key, v),
        }
    }

    pub(crate) fn number_or(&self, key: &str, default: f64, positive: bool) -> Result<f64> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() && (x > 0.0 || (!positive && x == 0.0)) => Ok(x),
                _ => Err(self.bad(
                    key,
                    v,
                    if positive {
                        "must be a finite number > 0"
                    } else {
                        "must be a finite number >= 0"
                    },
                )),
            },
        }
    }

    pub(crate) fn number(&self, key: &str) -> Result<f64> {
        match self.get(key) {
            None => Err(TrainError::file(
                self.path,
                format!("has no `{}{key}` (the llama3 rotary needs it)", self.prefix),
            )),
            Some(_) => self.number_or(key, 0.0, true),
        }
    }

    pub(crate) fn flag_or(&self, key: &str, default: bool) -> Result<bool> {
        match self.get(key) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(self.bad(key, v, "must be true or false")),
        }
    }

    pub(crate) fn string(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.bad(key, v, "must be a string")),
        }
    }
}

/// The rotary parameters in either spelling: transformers 5's `rope_parameters`, or
/// `rope_theta` with `rope_scaling` (what the Hub's checkpoints hold).
/// With `partial_ok` (GLM) a `partial_rotary_factor` is left to the caller.
pub(crate) fn rotary(top: &Keys<'_>, partial_ok: bool) -> Result<Rotary> {
    let path = top.path;
    let nested = match top.get("rope_parameters") {
        None => None,
        Some(Value::Object(o)) => Some(Keys {
            path,
            obj: o,
            prefix: "rope_parameters.",
        }),
        Some(v) => return Err(top.bad("rope_parameters", v, "must be an object")),
    };
    let scaling = match top.get("rope_scaling") {
        None => None,
        Some(Value::Object(o)) => Some(Keys {
            path,
            obj: o,
            prefix: "rope_scaling.",
        }),
        Some(v) => return Err(top.bad("rope_scaling", v, "must be an object or null")),
    };
    // Where the type and the llama3 keys are: rope_parameters when present, else rope_scaling.
    let params = nested.as_ref().or(scaling.as_ref());
    let theta = match nested.as_ref().and_then(|n| n.get("rope_theta")) {
        Some(_) => nested
            .as_ref()
            .map_or(Ok(10000.0), |n| n.number_or("rope_theta", 10000.0, true))?,
        None => top.number_or("rope_theta", 10000.0, true)?,
    };
    for k in [Some(top), nested.as_ref()]
        .into_iter()
        .flatten()
        .filter(|_| !partial_ok)
    {
        if let Some(v) = k.get("partial_rotary_factor") {
            if v.as_f64() != Some(1.0) {
                return Err(k.bad(
                    "partial_rotary_factor",
                    v,
                    "only 1 (rotary over the whole head) is supported by the llama family",
                ));
            }
        }
    }
    let Some(p) = params else {
        return Ok(Rotary {
            theta,
            scaling: RopeScaling::Default,
        });
    };
    let kind = match p.string("rope_type")? {
        Some(t) => Some(t),
        None => p.string("type")?,
    };
    let scaling = match kind.unwrap_or("default") {
        "default" => RopeScaling::Default,
        "llama3" => RopeScaling::Llama3 {
            factor: p.number("factor")?,
            low_freq_factor: p.number("low_freq_factor")?,
            high_freq_factor: p.number("high_freq_factor")?,
            original_max_position_embeddings: p.number("original_max_position_embeddings")?,
        },
        other => {
            let key = if p.get("rope_type").is_some() {
                "rope_type"
            } else {
                "type"
            };
            return Err(p.bad(
                key,
                &Value::String(other.into()),
                "is not supported; use \"default\" or \"llama3\"",
            ));
        }
    };
    // The kernel's own checks (high > low, positive factors), as a config error.
    hip_kernels::ops::rope::rope_frequencies(theta, 2, scaling)
        .map_err(|e| TrainError::file(path, format!("rotary parameters: {e}")))?;
    Ok(Rotary { theta, scaling })
}

impl LlamaConfig {
    /// Check a parsed config of `family` (errors name `path` and the key).
    pub fn from_value(path: &Path, family: Family, raw: Value) -> Result<Self> {
        let obj = raw
            .as_object()
            .ok_or_else(|| TrainError::file(path, "must hold a JSON object"))?;
        let k = Keys {
            path,
            obj,
            prefix: "",
        };
        let vocab = k.count("vocab_size")?;
        let channels = k.count("hidden_size")?;
        let inner = k.count("intermediate_size")?;
        let layers = k.count("num_hidden_layers")?;
        let heads = k.count("num_attention_heads")?;
        let glm = family == Family::Glm;
        // GlmConfig's defaults for absent keys.
        let kv_heads = k.count_or("num_key_value_heads", if glm { 2 } else { heads })?;
        if heads % kv_heads != 0 {
            return Err(TrainError::file(
                path,
                format!(
                    "`num_attention_heads` = {heads} is not a multiple of `num_key_value_heads` \
                     = {kv_heads}"
                ),
            ));
        }
        let head_dim = match k.get("head_dim") {
            Some(v) => k.count_value("head_dim", v)?,
            None if glm => 128,
            None if channels % heads == 0 => channels / heads,
            None => {
                return Err(TrainError::file(
                    path,
                    format!(
                        "`hidden_size` = {channels} is not a multiple of `num_attention_heads` = \
                         {heads}; give `head_dim`"
                    ),
                ))
            }
        };
        if head_dim % 2 != 0 {
            return Err(TrainError::file(
                path,
                format!("`head_dim` = {head_dim} must be even (rotary rotates pairs)"),
            ));
        }
        let positions = k.count("max_position_embeddings")?;
        let eps = k.number_or("rms_norm_eps", if glm { 1.5625e-7 } else { 1e-6 }, false)?;
        let tied = k.flag_or("tie_word_embeddings", false)?;
        match k.get("hidden_act") {
            None => {}
            Some(Value::String(s)) if s == "silu" => {}
            Some(v) => return Err(k.bad("hidden_act", v, "must be \"silu\" (SwiGLU)")),
        }
        let biases = match family {
            Family::Llama => {
                let attn = k.flag_or("attention_bias", false)?;
                Biases {
                    qkv: attn,
                    o: attn,
                    mlp: k.flag_or("mlp_bias", false)?,
                }
            }
            Family::Glm | Family::ChatGlm => Biases {
                qkv: k.flag_or("attention_bias", true)?,
                o: false,
                mlp: false,
            },
            Family::Qwen2 => {
                if k.flag_or("use_sliding_window", false)? {
                    return Err(k.bad(
                        "use_sliding_window",
                        &Value::Bool(true),
                        "sliding-window attention is not supported; set it to false",
                    ));
                }
                Biases {
                    qkv: true,
                    o: false,
                    mlp: false,
                }
            }
        };
        let rotary = rotary(&k, glm)?;
        let rotary_dim = match glm {
            true => crate::glm::config::glm_rotary_dim(&k, &rotary, head_dim)?,
            false => head_dim,
        };
        Ok(Self {
            family,
            vocab,
            channels,
            inner,
            layers,
            heads,
            kv_heads,
            head_dim,
            positions,
            eps,
            tied,
            biases,
            rotary,
            rotary_dim,
            interleaved: glm,
            raw,
            path: path.to_path_buf(),
        })
    }

    /// Whether two configs describe the same parameter shapes and forward.
    pub fn same_model(&self, other: &Self) -> bool {
        (
            self.family,
            self.vocab,
            self.channels,
            self.inner,
            self.layers,
            self.heads,
            self.kv_heads,
            self.head_dim,
            self.tied,
            self.biases,
        ) == (
            other.family,
            other.vocab,
            other.channels,
            other.inner,
            other.layers,
            other.heads,
            other.kv_heads,
            other.head_dim,
            other.tied,
            other.biases,
        ) && self.eps == other.eps
            && self.rotary == other.rotary
            && (self.rotary_dim, self.interleaved) == (other.rotary_dim, other.interleaved)
    }

    /// One-line description: `llama L=2 C=48 H=4 K=2 D=16 F=96 V=128`.
    pub fn describe(&self) -> String {
        format!(
            "{} L={} C={} H={} K={} D={} F={} V={}",
            self.family.name(),
            self.layers,
            self.channels,
            self.heads,
            self.kv_heads,
            self.head_dim,
            self.inner,
            self.vocab
        )
    }

    /// The rotary frequency table (`R/2` f32 values, R = [`Self::rotary_dim`]) the rope op
    /// takes.
    pub fn frequencies(&self) -> Result<Vec<f32>> {
        hip_kernels::ops::rope::rope_frequencies(
            self.rotary.theta,
            self.rotary_dim,
            self.rotary.scaling,
        )
        .map_err(|e| TrainError::file(&self.path, format!("rotary parameters: {e}")))
    }
}
