//! The parameters of a LLaMA-family model: HF names and shapes in one canonical order (the
//! order of files, the optimizer and ZeRO's ownership), and named indices into it.

use super::config::LlamaConfig;
use crate::params::Spec;

/// The seven linear layers of a decoder layer, by their HF module names (also LoRA's targets).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Linear {
    /// `self_attn.q_proj` `[H·D, C]`.
    Q,
    /// `self_attn.k_proj` `[K·D, C]`.
    K,
    /// `self_attn.v_proj` `[K·D, C]`.
    V,
    /// `self_attn.o_proj` `[C, H·D]`.
    O,
    /// `mlp.gate_proj` `[F, C]`.
    Gate,
    /// `mlp.up_proj` `[F, C]`.
    Up,
    /// `mlp.down_proj` `[C, F]`.
    Down,
}

impl Linear {
    /// All seven, in the canonical order.
    pub const ALL: [Linear; 7] = [
        Linear::Q,
        Linear::K,
        Linear::V,
        Linear::O,
        Linear::Gate,
        Linear::Up,
        Linear::Down,
    ];

    /// The module name (`q_proj`), as PEFT's `target_modules` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Linear::Q => "q_proj",
            Linear::K => "k_proj",
            Linear::V => "v_proj",
            Linear::O => "o_proj",
            Linear::Gate => "gate_proj",
            Linear::Up => "up_proj",
            Linear::Down => "down_proj",
        }
    }

    /// The path inside a layer (`self_attn.q_proj`).
    pub fn path(self) -> String {
        let block = match self {
            Linear::Q | Linear::K | Linear::V | Linear::O => "self_attn",
            Linear::Gate | Linear::Up | Linear::Down => "mlp",
        };
        format!("{block}.{}", self.name())
    }

    /// The target named `name` (`q_proj`).
    pub fn from_name(name: &str) -> Option<Linear> {
        Linear::ALL.into_iter().find(|l| l.name() == name)
    }

    /// `[out, in]` of the weight.
    pub fn shape(self, cfg: &LlamaConfig) -> [usize; 2] {
        let (c, f) = (cfg.channels, cfg.inner);
        let (q, kv) = (cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim);
        match self {
            Linear::Q => [q, c],
            Linear::K | Linear::V => [kv, c],
            Linear::O => [c, q],
            Linear::Gate | Linear::Up => [f, c],
            Linear::Down => [c, f],
        }
    }

    /// Whether `cfg` gives this layer a bias.
    pub fn has_bias(self, cfg: &LlamaConfig) -> bool {
        match self {
            Linear::Q | Linear::K | Linear::V => cfg.biases.qkv,
            Linear::O => cfg.biases.o,
            Linear::Gate | Linear::Up | Linear::Down => cfg.biases.mlp,
        }
    }
}

/// Indices (into the canonical order) of one layer's tensors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerIndex {
    /// `input_layernorm.weight`.
    pub input_norm: usize,
    /// `post_attention_layernorm.weight`.
    pub post_norm: usize,
    /// Each linear's weight, in [`Linear::ALL`]'s order.
    pub weight: [usize; 7],
    /// Each linear's bias, when it has one.
    pub bias: [Option<usize>; 7],
}

/// Indices of every tensor, and their names and shapes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Every tensor's HF name and shape, in the canonical order.
    pub specs: Vec<Spec>,
    /// `model.embed_tokens.weight`.
    pub embed: usize,
    /// `model.layers.{l}.*`.
    pub layers: Vec<LayerIndex>,
    /// `model.norm.weight`.
    pub norm: usize,
    /// `lm_head.weight` (`None` when tied to the embedding).
    pub lm_head: Option<usize>,
}

impl Layout {
    /// The layout of `cfg`'s parameters: the embedding, per layer the two norms then each
    /// linear's weight (and bias), the final norm, the lm_head when untied.
    pub fn new(cfg: &LlamaConfig) -> Self {
        let mut specs = Vec::new();
        let mut push = |name: String, shape: Vec<usize>| {
            specs.push(Spec { name, shape });
            specs.len() - 1
        };
        let (c, v) = (cfg.channels, cfg.vocab);
        let embed = push("model.embed_tokens.weight".into(), vec![v, c]);
        let layers = (0..cfg.layers)
            .map(|l| {
                let pre = format!("model.layers.{l}.");
                let input_norm = push(format!("{pre}input_layernorm.weight"), vec![c]);
                let post_norm = push(format!("{pre}post_attention_layernorm.weight"), vec![c]);
                let mut weight = [0; 7];
                let mut bias = [None; 7];
                for (i, lin) in Linear::ALL.into_iter().enumerate() {
                    let [o, n] = lin.shape(cfg);
                    weight[i] = push(format!("{pre}{}.weight", lin.path()), vec![o, n]);
                    if lin.has_bias(cfg) {
                        bias[i] = Some(push(format!("{pre}{}.bias", lin.path()), vec![o]));
                    }
                }
                LayerIndex {
                    input_norm,
                    post_norm,
                    weight,
                    bias,
                }
            })
            .collect();
        let norm = push("model.norm.weight".into(), vec![c]);
        let lm_head = (!cfg.tied).then(|| push("lm_head.weight".into(), vec![v, c]));
        Self {
            specs,
            embed,
            layers,
            norm,
            lm_head,
        }
    }

    /// Elements in all parameters.
    pub fn count(&self) -> usize {
        self.specs
            .iter()
            .map(|s| s.shape.iter().product::<usize>())
            .sum()
    }
}
