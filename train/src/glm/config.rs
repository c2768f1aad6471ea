//! The GLM family's config keys: `partial_rotary_factor` (`glm`) and THUDM's `chatglm` keys.

use crate::error::{Result, TrainError};
use crate::llama::config::{Biases, Keys, Rotary};
use crate::llama::{Family, LlamaConfig};
use hip_kernels::ops::rope::RopeScaling;
use serde_json::Value;
use std::path::Path;

/// GlmConfig's `partial_rotary_factor` when absent.
const GLM_PARTIAL_DEFAULT: f64 = 0.5;

/// `glm`'s rotary dims R = ⌊D · `partial_rotary_factor`⌋ (as transformers' `int(head_dim *
/// factor)`), the factor at the top level or inside `rope_parameters` (default 0.5); R must be
/// even and in 2..=D, and the rotary type the default one (GlmForCausalLM's only one).
pub(crate) fn glm_rotary_dim(top: &Keys<'_>, rotary: &Rotary, head_dim: usize) -> Result<usize> {
    if rotary.scaling != RopeScaling::Default {
        return Err(TrainError::file(
            top.path,
            "the glm family's rotary type must be \"default\" (rope_type / rope_scaling)",
        ));
    }
    let nested = match top.get("rope_parameters") {
        Some(Value::Object(o)) => Some(Keys {
            path: top.path,
            obj: o,
            prefix: "rope_parameters.",
        }),
        _ => None,
    };
    let keys = match nested.as_ref() {
        Some(n) if n.get("partial_rotary_factor").is_some() => n,
        _ => top,
    };
    let factor = keys.number_or("partial_rotary_factor", GLM_PARTIAL_DEFAULT, true)?;
    let r = (head_dim as f64 * factor).floor();
    if !(factor <= 1.0 && r >= 2.0 && (r as usize) % 2 == 0) {
        return Err(keys.bad(
            "partial_rotary_factor",
            &Value::from(factor),
            &format!(
                "gives {r} rotary dims of head_dim {head_dim}; they must be an even count in \
                 2..={head_dim}"
            ),
        ));
    }
    Ok(r as usize)
}

/// A check that a `chatglm` key has the one value this model supports.
fn require(k: &Keys<'_>, key: &str, want: &Value, default: &Value, why: &str) -> Result<()> {
    let got = k.get(key).unwrap_or(default);
    let same = match (got, want) {
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        (a, b) => a == b,
    };
    match same {
        true => Ok(()),
        false => Err(k.bad(key, got, &format!("must be {want}: {why}"))),
    }
}

/// Check a `chatglm` config (THUDM's `ChatGLMConfig` keys, its defaults for absent ones).
pub fn chatglm_from_value(path: &Path, raw: Value) -> Result<LlamaConfig> {
    let obj = raw
        .as_object()
        .ok_or_else(|| TrainError::file(path, "must hold a JSON object"))?;
    let k = Keys {
        path,
        obj,
        prefix: "",
    };
    let not_this = "ChatGLM-6B v1 and P-tuning checkpoints are not supported";
    require(
        &k,
        "rmsnorm",
        &Value::Bool(true),
        &Value::Bool(true),
        not_this,
    )?;
    for key in [
        "add_bias_linear",
        "apply_residual_connection_post_layernorm",
    ] {
        require(&k, key, &Value::Bool(false), &Value::Bool(false), not_this)?;
    }
    for key in ["post_layer_norm", "original_rope"] {
        require(&k, key, &Value::Bool(true), &Value::Bool(true), not_this)?;
    }
    if let Some(v) = k.get("pre_seq_len") {
        return Err(k.bad(
            "pre_seq_len",
            v,
            "P-tuning prefixes are not supported; set it to null",
        ));
    }
    require(
        &k,
        "quantization_bit",
        &Value::from(0),
        &Value::from(0),
        "train from the unquantized checkpoint",
    )?;
    let vocab = k.count("padded_vocab_size")?;
    let channels = k.count("hidden_size")?;
    let inner = k.count("ffn_hidden_size")?;
    let layers = k.count("num_layers")?;
    let heads = k.count("num_attention_heads")?;
    let kv_heads = match k.flag_or("multi_query_attention", false)? {
        true => k.count("multi_query_group_num")?,
        false => heads,
    };
    if heads % kv_heads != 0 {
        return Err(TrainError::file(
            path,
            format!(
                "`num_attention_heads` = {heads} is not a multiple of `multi_query_group_num` \
                 = {kv_heads}"
            ),
        ));
    }
    let head_dim = match k.get("kv_channels") {
        Some(v) => k.count_value("kv_channels", v)?,
        None if channels % heads == 0 => channels / heads,
        None => {
            return Err(TrainError::file(
                path,
                format!(
                    "`hidden_size` = {channels} is not a multiple of `num_attention_heads` = \
                     {heads}; give `kv_channels`"
                ),
            ))
        }
    };
    if head_dim % 4 != 0 {
        return Err(TrainError::file(
            path,
            format!(
                "`kv_channels` = {head_dim} must be a multiple of 4 (the rotary turns pairs of \
                 its first half)"
            ),
        ));
    }
    let positions = k.count_or("seq_length", 2048)?;
    let eps = k.number_or("layernorm_epsilon", 1e-5, false)?;
    let ratio = k.number_or("rope_ratio", 1.0, true)?;
    let theta = 10000.0 * ratio;
    hip_kernels::ops::rope::rope_frequencies(theta, head_dim / 2, RopeScaling::Default)
        .map_err(|e| TrainError::file(path, format!("rotary parameters: {e}")))?;
    Ok(LlamaConfig {
        family: Family::ChatGlm,
        vocab,
        channels,
        inner,
        layers,
        heads,
        kv_heads,
        head_dim,
        positions,
        eps,
        tied: false,
        biases: Biases {
            qkv: k.flag_or("add_qkv_bias", false)?,
            o: false,
            mlp: false,
        },
        rotary: Rotary {
            theta,
            scaling: RopeScaling::Default,
        },
        rotary_dim: head_dim / 2,
        interleaved: true,
        raw,
        path: path.to_path_buf(),
    })
}
