//! The GLM family's two checkpoint layouts as a [`Layout`]: the names and shapes of the tensors
//! as the files hold them. A fused HF tensor (`glm`'s `gate_up_proj`, `chatglm`'s
//! `query_key_value` and `dense_h_to_4h`) is one entry, and every linear it holds points at it,
//! so the trained layout ([`crate::llama::params::Trained`]) takes it as it is.

use crate::llama::params::{LayerIndex, Layout};
use crate::llama::{Family, LlamaConfig};
use crate::params::Spec;

/// The names of a layout's tensors outside the layers, and of one layer's.
struct Names {
    embed: &'static str,
    /// Layer prefix before `{l}.`.
    layer: &'static str,
    norm: &'static str,
    lm_head: &'static str,
    /// q, k, v (one name when fused), o, gate/up (one name), down.
    qkv: &'static [&'static str],
    o: &'static str,
    gate_up: &'static str,
    down: &'static str,
}

const GLM: Names = Names {
    embed: "model.embed_tokens.weight",
    layer: "model.layers.",
    norm: "model.norm.weight",
    lm_head: "lm_head.weight",
    qkv: &["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
    o: "self_attn.o_proj",
    gate_up: "mlp.gate_up_proj",
    down: "mlp.down_proj",
};

const CHATGLM: Names = Names {
    embed: "transformer.embedding.word_embeddings.weight",
    layer: "transformer.encoder.layers.",
    norm: "transformer.encoder.final_layernorm.weight",
    lm_head: "transformer.output_layer.weight",
    qkv: &["self_attention.query_key_value"],
    o: "self_attention.dense",
    gate_up: "mlp.dense_h_to_4h",
    down: "mlp.dense_4h_to_h",
};

/// The layout of a `glm` or `chatglm` config (`None` for the other families): the embedding,
/// per layer the two norms then q, k, v (chatglm: query_key_value), o, gate-up and down, each
/// weight followed by its bias, the final norm and the output layer (absent when tied).
pub fn layout(cfg: &LlamaConfig) -> Option<Layout> {
    let names = match cfg.family {
        Family::Glm => &GLM,
        Family::ChatGlm => &CHATGLM,
        Family::Llama | Family::Qwen2 => return None,
    };
    let (c, v, f, d) = (cfg.channels, cfg.vocab, cfg.inner, cfg.head_dim);
    let (h, k) = (cfg.heads, cfg.kv_heads);
    let mut specs = Vec::new();
    let mut push = |name: String, shape: Vec<usize>| {
        specs.push(Spec { name, shape });
        specs.len() - 1
    };
    let embed = push(names.embed.into(), vec![v, c]);
    let layers = (0..cfg.layers)
        .map(|l| {
            let pre = format!("{}{l}.", names.layer);
            let input_norm = push(format!("{pre}input_layernorm.weight"), vec![c]);
            let post_norm = push(format!("{pre}post_attention_layernorm.weight"), vec![c]);
            let mut weight = [0; 7];
            let mut bias = [None; 7];
            // q, k, v: three tensors (glm) or one of (H + 2K)·D rows (chatglm).
            let rows = [h * d, k * d, k * d];
            let mut at = 0;
            for (i, name) in names.qkv.iter().enumerate() {
                let out = match names.qkv.len() {
                    1 => rows.iter().sum(),
                    _ => rows[i],
                };
                let w = push(format!("{pre}{name}.weight"), vec![out, c]);
                let b = cfg
                    .biases
                    .qkv
                    .then(|| push(format!("{pre}{name}.bias"), vec![out]));
                let span = 3 / names.qkv.len();
                for j in at..at + span {
                    weight[j] = w;
                    bias[j] = b;
                }
                at += span;
            }
            weight[3] = push(format!("{pre}{}.weight", names.o), vec![c, h * d]);
            let gate_up = push(format!("{pre}{}.weight", names.gate_up), vec![2 * f, c]);
            weight[4] = gate_up;
            weight[5] = gate_up;
            weight[6] = push(format!("{pre}{}.weight", names.down), vec![c, f]);
            LayerIndex {
                input_norm,
                post_norm,
                weight,
                bias,
            }
        })
        .collect();
    let norm = push(names.norm.into(), vec![c]);
    let lm_head = (!cfg.tied).then(|| push(names.lm_head.into(), vec![v, c]));
    Some(Layout {
        specs,
        embed,
        layers,
        norm,
        lm_head,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llama::params::Trained;

    fn cfg(raw: serde_json::Value) -> LlamaConfig {
        match crate::config::ModelConfig::from_value(std::path::Path::new("config.json"), raw) {
            Ok(crate::config::ModelConfig::Llama(c)) => c,
            other => panic!("{other:?}"),
        }
    }

    fn glm() -> serde_json::Value {
        serde_json::json!({"model_type": "glm", "vocab_size": 64, "hidden_size": 32,
            "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
            "head_dim": 8, "max_position_embeddings": 32})
    }

    fn chatglm() -> serde_json::Value {
        serde_json::json!({"model_type": "chatglm", "padded_vocab_size": 64, "hidden_size": 32,
            "ffn_hidden_size": 48, "num_layers": 2, "num_attention_heads": 4, "kv_channels": 8,
            "multi_query_attention": true, "multi_query_group_num": 2, "seq_length": 32,
            "layernorm_epsilon": 1.5625e-7, "add_qkv_bias": true})
    }

    #[test]
    fn both_layouts_train_the_same_fused_tensors() {
        let (g, c) = (cfg(glm()), cfg(chatglm()));
        // GlmConfig's defaults: K = 2, biases on q/k/v, partial 0.5, eps 1.5625e-7.
        assert_eq!(
            (g.kv_heads, g.biases.qkv, g.rotary_dim, g.eps),
            (2, true, 4, 1.5625e-7)
        );
        assert!(g.interleaved && c.interleaved);
        assert_eq!((c.kv_heads, c.rotary_dim), (2, 4));
        let (lg, lc) = (Layout::new(&g), Layout::new(&c));
        assert_eq!(lg.specs.len(), 1 + 2 * (2 + 3 + 3 + 3) + 2);
        assert_eq!(lc.specs.len(), 1 + 2 * (2 + 2 + 3) + 2);
        assert_eq!(
            lc.specs[lc.layers[1].weight[0]].name,
            "transformer.encoder.layers.1.self_attention.query_key_value.weight"
        );
        assert_eq!(
            lc.specs[lc.layers[1].weight[0]].shape,
            vec![(4 + 4) * 8, 32]
        );
        assert_eq!(
            lg.specs[lg.layers[0].weight[4]].name,
            "model.layers.0.mlp.gate_up_proj.weight"
        );
        let (tg, tc) = (Trained::new(&g), Trained::new(&c));
        let shapes = |t: &Trained| t.specs.iter().map(|s| s.shape.clone()).collect::<Vec<_>>();
        assert_eq!(shapes(&tg), shapes(&tc));
        // Fusing then splitting gives back each file's tensors.
        let hf: Vec<Vec<f32>> = lc
            .specs
            .iter()
            .enumerate()
            .map(|(i, s)| vec![i as f32; s.shape.iter().product()])
            .collect();
        assert_eq!(tc.split(&lc, &tc.fuse(&hf)), hf);
    }

    #[test]
    fn configs_other_than_this_model_are_errors_naming_the_key() {
        for (key, value) in [
            ("rmsnorm", serde_json::json!(false)),
            ("add_bias_linear", serde_json::json!(true)),
            ("post_layer_norm", serde_json::json!(false)),
            ("original_rope", serde_json::json!(false)),
            ("pre_seq_len", serde_json::json!(128)),
            ("quantization_bit", serde_json::json!(4)),
            (
                "apply_residual_connection_post_layernorm",
                serde_json::json!(true),
            ),
        ] {
            let mut raw = chatglm();
            raw[key] = value;
            let e = crate::config::ModelConfig::from_value(std::path::Path::new("c.json"), raw)
                .unwrap_err()
                .to_string();
            assert!(e.contains(key) && e.contains("c.json"), "{key}: {e}");
        }
        let mut raw = glm();
        raw["partial_rotary_factor"] = serde_json::json!(0.1);
        let e = crate::config::ModelConfig::from_value(std::path::Path::new("c.json"), raw)
            .unwrap_err()
            .to_string();
        assert!(e.contains("partial_rotary_factor"), "{e}");
        let mut raw = glm();
        raw["rope_scaling"] = serde_json::json!({"rope_type": "llama3", "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16});
        let e = crate::config::ModelConfig::from_value(std::path::Path::new("c.json"), raw)
            .unwrap_err()
            .to_string();
        assert!(e.contains("default"), "{e}");
        // rope_parameters spelling of the factor, and rope_ratio's θ.
        let mut raw = glm();
        raw["rope_parameters"] = serde_json::json!({"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 1.0});
        let g = cfg(raw);
        assert_eq!((g.rotary_dim, g.rotary.theta), (8, 500.0));
        let mut raw = chatglm();
        raw["rope_ratio"] = serde_json::json!(500);
        assert_eq!(cfg(raw).rotary.theta, 5_000_000.0);
    }
}
