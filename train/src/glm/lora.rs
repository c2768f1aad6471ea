//! LoRA targets of the GLM family (docs/TRAIN-GLM.md, "LoRA"): the module names each layout's
//! PEFT uses, and where each target's output sits in the trained (fused) tensors.
//!
//! The adapters themselves are the LLaMA family's ([`crate::llama::lora`]): a target is keyed
//! by the [`Linear`] its output block starts at. A fused target (`chatglm`'s
//! `query_key_value` and `dense_h_to_4h`, `glm`'s `gate_up_proj`) is one `lora_A` and one
//! `lora_B` over the whole fused output, keyed by its first linear (q, gate), whose site then
//! spans the fused width; the linears it also covers (k, v, up) carry no adapters of their own.

use crate::llama::lora::Site;
use crate::llama::{Family, Linear, LlamaConfig};

/// `glm`'s targets (transformers' GlmForCausalLM module names) and the linear each is keyed by.
const GLM: [(&str, &str, Linear); 6] = [
    ("q_proj", "self_attn.q_proj", Linear::Q),
    ("k_proj", "self_attn.k_proj", Linear::K),
    ("v_proj", "self_attn.v_proj", Linear::V),
    ("o_proj", "self_attn.o_proj", Linear::O),
    ("gate_up_proj", "mlp.gate_up_proj", Linear::Gate),
    ("down_proj", "mlp.down_proj", Linear::Down),
];

/// `chatglm`'s targets (THUDM's module names).
const CHATGLM: [(&str, &str, Linear); 4] = [
    (
        "query_key_value",
        "self_attention.query_key_value",
        Linear::Q,
    ),
    ("dense", "self_attention.dense", Linear::O),
    ("dense_h_to_4h", "mlp.dense_h_to_4h", Linear::Gate),
    ("dense_4h_to_h", "mlp.dense_4h_to_h", Linear::Down),
];

/// `(PEFT module name, path inside a layer, key)` of each target of `family` (`None` for the
/// LLaMA family, whose targets are [`Linear::ALL`] by their own names).
pub fn targets(family: Family) -> Option<&'static [(&'static str, &'static str, Linear)]> {
    match family {
        Family::Glm => Some(&GLM),
        Family::ChatGlm => Some(&CHATGLM),
        Family::Llama | Family::Qwen2 => None,
    }
}

/// The default of `--lora-targets`: `glm` PEFT's `q_proj,v_proj`, `chatglm` LLaMA-Factory's
/// `query_key_value`.
pub fn default_targets(family: Family) -> Option<&'static str> {
    match family {
        Family::Glm => Some("q_proj,v_proj"),
        Family::ChatGlm => Some("query_key_value"),
        Family::Llama | Family::Qwen2 => None,
    }
}

/// What PEFT puts before `{l}.<path>` in an adapter file of `family`'s layout.
pub fn peft_layer_prefix(family: Family) -> Option<&'static str> {
    match family {
        Family::Glm => Some("base_model.model.model.layers."),
        Family::ChatGlm => Some("base_model.model.transformer.encoder.layers."),
        Family::Llama | Family::Qwen2 => None,
    }
}

/// The target of `family` named `name` (`None`: not one of its targets).
pub fn by_name(family: Family, name: &str) -> Option<Linear> {
    targets(family)?.iter().find(|t| t.0 == name).map(|t| t.2)
}

/// The PEFT module name and in-layer path of the target keyed `key`.
pub fn name_of(family: Family, key: Linear) -> Option<(&'static str, &'static str)> {
    targets(family)?
        .iter()
        .find(|t| t.2 == key)
        .map(|t| (t.0, t.1))
}

/// The site of a fused target keyed `key` (the whole fused output), `None` when `key` is not
/// fused in `cfg`'s layout (its site is then the LLaMA one).
pub fn fused_site(cfg: &LlamaConfig, key: Linear) -> Option<Site> {
    let (c, f) = (cfg.channels, cfg.inner);
    let w = (cfg.heads + 2 * cfg.kv_heads) * cfg.head_dim;
    let whole = |inputs, width| Site {
        inputs,
        outputs: width,
        offset: 0,
        width,
    };
    match (cfg.family, key) {
        (Family::ChatGlm, Linear::Q) => Some(whole(c, w)),
        (Family::Glm | Family::ChatGlm, Linear::Gate) => Some(whole(c, 2 * f)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llama::lora::{site, LlamaLora};

    fn cfg(model: &str) -> LlamaConfig {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/data/train_glm")
            .join(model)
            .join("config.json");
        match crate::config::ModelConfig::load(&path).unwrap() {
            crate::config::ModelConfig::Llama(c) => c,
            crate::config::ModelConfig::Gpt2(_) => unreachable!(),
        }
    }

    #[test]
    fn fused_targets_are_one_adapter_over_the_fused_output_in_the_layouts_names() {
        let c = cfg("chatglm");
        // H = 4, K = 2, D = 16: query_key_value has (4 + 4)·16 = 128 outputs; F = 64.
        assert_eq!(
            site(&c, Linear::Q),
            Site {
                inputs: 48,
                outputs: 128,
                offset: 0,
                width: 128
            }
        );
        assert_eq!(site(&c, Linear::Gate).outputs, 128);
        assert_eq!(site(&c, Linear::Down).inputs, 64);
        let lora = LlamaLora {
            rank: 4,
            alpha: 8.0,
            targets: vec![Linear::Q, Linear::O, Linear::Gate, Linear::Down],
        };
        let specs = lora.specs(&c);
        assert_eq!(specs.len(), 2 * 4 * 2);
        assert_eq!(
            specs[0].name,
            "base_model.model.transformer.encoder.layers.0.self_attention.query_key_value.lora_A.weight"
        );
        assert_eq!(specs[1].shape, vec![128, 4]);
        assert_eq!(
            specs[15].name,
            "base_model.model.transformer.encoder.layers.1.mlp.dense_4h_to_h.lora_B.weight"
        );
        let g = cfg("glm");
        assert_eq!(site(&g, Linear::K).offset, 64);
        assert_eq!(site(&g, Linear::Gate).width, 128);
        let lora = LlamaLora {
            targets: vec![Linear::Gate],
            ..lora
        };
        assert_eq!(
            lora.specs(&g)[1].name,
            "base_model.model.model.layers.0.mlp.gate_up_proj.lora_B.weight"
        );
        assert_eq!(by_name(Family::ChatGlm, "q_proj"), None);
        assert_eq!(by_name(Family::Glm, "gate_up_proj"), Some(Linear::Gate));
    }
}
