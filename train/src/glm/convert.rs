//! `--save-format hf`: a `chatglm` run's checkpoints written as transformers' `glm`
//! (`GlmForCausalLM`), which loads without THUDM's remote code. Both layouts train the same
//! fused tensors ([`crate::llama::params::Trained`]), so the conversion is the trained tensors
//! cut along the `glm` layout.

use crate::cli::SaveFormat;
use crate::error::Result;
use crate::llama::{Family, LlamaConfig};
use serde_json::{json, Value};

/// The config checkpoints are written with: `cfg` itself, or for a `chatglm` model with
/// [`SaveFormat::Hf`] the same model as a `glm` config (θ as `rope_theta`, R = D/2 as
/// `partial_rotary_factor` 0.5, the chatglm config's eos and pad ids kept).
pub fn save_config(cfg: &LlamaConfig, format: SaveFormat) -> Result<LlamaConfig> {
    if format == SaveFormat::Native || cfg.family != Family::ChatGlm {
        return Ok(cfg.clone());
    }
    let mut raw = json!({
        "architectures": ["GlmForCausalLM"],
        "model_type": "glm",
        "vocab_size": cfg.vocab,
        "hidden_size": cfg.channels,
        "intermediate_size": cfg.inner,
        "num_hidden_layers": cfg.layers,
        "num_attention_heads": cfg.heads,
        "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.head_dim,
        "max_position_embeddings": cfg.positions,
        "rms_norm_eps": cfg.eps,
        "hidden_act": "silu",
        "attention_bias": cfg.biases.qkv,
        "tie_word_embeddings": false,
        "partial_rotary_factor": cfg.rotary_dim as f64 / cfg.head_dim as f64,
        "rope_theta": cfg.rotary.theta,
    });
    for key in ["eos_token_id", "pad_token_id", "bos_token_id"] {
        if let (Some(v), Some(o)) = (cfg.raw.get(key), raw.as_object_mut()) {
            o.insert(key.into(), v.clone());
        }
    }
    if let Some(o) = raw.as_object_mut() {
        // transformers' Embedding(padding_idx) needs an id below the vocabulary.
        if o.get("pad_token_id")
            .and_then(Value::as_u64)
            .is_some_and(|p| p >= cfg.vocab as u64)
        {
            o.remove("pad_token_id");
        }
    }
    LlamaConfig::from_value(&cfg.path, Family::Glm, raw)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llama::params::{Layout, Trained};

    #[test]
    fn a_chatglm_model_as_glm_is_the_same_model_in_glm_names() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/data/train_glm/chatglm/config.json");
        let chat = match crate::config::ModelConfig::load(&path).unwrap() {
            crate::config::ModelConfig::Llama(c) => c,
            crate::config::ModelConfig::Gpt2(_) => unreachable!(),
        };
        let glm = save_config(&chat, SaveFormat::Hf).unwrap();
        assert_eq!(glm.family, Family::Glm);
        assert_eq!(
            (
                glm.rotary_dim,
                glm.rotary.theta,
                glm.eps,
                glm.kv_heads,
                glm.biases
            ),
            (
                chat.rotary_dim,
                chat.rotary.theta,
                chat.eps,
                chat.kv_heads,
                chat.biases
            )
        );
        let shapes = |c: &LlamaConfig| -> Vec<Vec<usize>> {
            Trained::new(c).specs.into_iter().map(|s| s.shape).collect()
        };
        assert_eq!(shapes(&glm), shapes(&chat));
        let names: Vec<String> = Layout::new(&glm)
            .specs
            .into_iter()
            .map(|s| s.name)
            .collect();
        assert!(names.contains(&"model.layers.1.self_attn.k_proj.bias".to_string()));
        assert_eq!(save_config(&chat, SaveFormat::Native).unwrap(), chat);
    }
}
