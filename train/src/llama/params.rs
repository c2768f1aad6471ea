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
    /// Each linear's weight, in [`Linear::ALL`]'s order (linears that one HF tensor holds
    /// fused, as GLM's gate and up, share its index).
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
        if let Some(glm) = crate::glm::params::layout(cfg) {
            return glm;
        }
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

/// Indices (into the trained order) of one layer's tensors, q/k/v and gate/up fused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrainedLayer {
    /// `input_layernorm.weight` `[C]`.
    pub input_norm: usize,
    /// q, k, v weights stacked by rows `[(H + 2K)·D, C]`.
    pub qkv_w: usize,
    /// Their biases `[(H + 2K)·D]`.
    pub qkv_b: Option<usize>,
    /// `o_proj.weight` `[C, H·D]`.
    pub o_w: usize,
    /// `o_proj.bias` `[C]`.
    pub o_b: Option<usize>,
    /// `post_attention_layernorm.weight` `[C]`.
    pub post_norm: usize,
    /// gate and up weights stacked by rows `[2F, C]`.
    pub gate_up_w: usize,
    /// Their biases `[2F]`.
    pub gate_up_b: Option<usize>,
    /// `down_proj.weight` `[C, F]`.
    pub down_w: usize,
    /// `down_proj.bias` `[C]`.
    pub down_b: Option<usize>,
}

/// The tensors as the model trains them: q, k and v (and gate and up) stacked by rows into one
/// tensor each, so that one GEMM computes them and attention and SwiGLU read them in place.
/// A Linear weight is `[out, in]` row-major, so stacking rows is concatenating the flat
/// tensors: [`Trained::fuse`] and [`Trained::split`] convert from and to the HF tensors of
/// [`Layout`] exactly, and AdamW (elementwise) is the same on either.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trained {
    /// Shapes (and descriptive names) in the trained order; 2-D ones take weight decay.
    pub specs: Vec<Spec>,
    /// The embedding `[V, C]`.
    pub embed: usize,
    /// Per layer.
    pub layers: Vec<TrainedLayer>,
    /// `model.norm.weight` `[C]`.
    pub norm: usize,
    /// `lm_head.weight` `[V, C]` (`None` when tied).
    pub lm_head: Option<usize>,
    /// For each trained tensor, the HF tensors (indices into [`Layout::specs`]) it stacks.
    pub parts: Vec<Vec<usize>>,
}

impl Trained {
    /// How long a prefix of the trained order the forward has read when it starts layer `l`:
    /// the embedding, the layers before `l` and layer `l`'s input norm (fused into the residual
    /// add that ends layer `l - 1`); every tensor from the last layer's end on (the final norm
    /// and the lm_head follow it). With the optimizer offloaded the forward waits for that
    /// prefix's uploads only.
    pub fn read_before(&self, l: usize) -> usize {
        self.layers
            .get(l)
            .map_or(usize::MAX, |layer| layer.input_norm.max(self.embed) + 1)
    }

    /// The trained layout of `cfg` (built from [`Layout::new`]).
    pub fn new(cfg: &LlamaConfig) -> Self {
        let hf = Layout::new(cfg);
        let mut specs = Vec::new();
        let mut parts = Vec::new();
        let mut push = |name: String, mut from: Vec<usize>| {
            // A fused HF tensor (GLM's gate_up_proj, ChatGLM's query_key_value) stands for
            // several linears: take it once.
            from.dedup();
            let first = &hf.specs[from[0]].shape;
            let rows: usize = from.iter().map(|&i| hf.specs[i].shape[0]).sum();
            let mut shape = first.clone();
            shape[0] = rows;
            specs.push(Spec { name, shape });
            parts.push(from);
            specs.len() - 1
        };
        let embed = push(hf.specs[hf.embed].name.clone(), vec![hf.embed]);
        let layers = hf
            .layers
            .iter()
            .enumerate()
            .map(|(l, li)| {
                let pre = format!("model.layers.{l}.");
                let w = |i: usize| li.weight[i];
                let b = |ids: &[usize]| -> Option<Vec<usize>> {
                    ids.iter().map(|&i| li.bias[i]).collect()
                };
                let input_norm = push(hf.specs[li.input_norm].name.clone(), vec![li.input_norm]);
                let qkv_w = push(format!("{pre}self_attn.qkv.weight"), vec![w(0), w(1), w(2)]);
                let qkv_b = b(&[0, 1, 2]).map(|p| push(format!("{pre}self_attn.qkv.bias"), p));
                let o_w = push(hf.specs[w(3)].name.clone(), vec![w(3)]);
                let o_b = li.bias[3].map(|i| push(hf.specs[i].name.clone(), vec![i]));
                let post_norm = push(hf.specs[li.post_norm].name.clone(), vec![li.post_norm]);
                let gate_up_w = push(format!("{pre}mlp.gate_up.weight"), vec![w(4), w(5)]);
                let gate_up_b = b(&[4, 5]).map(|p| push(format!("{pre}mlp.gate_up.bias"), p));
                let down_w = push(hf.specs[w(6)].name.clone(), vec![w(6)]);
                let down_b = li.bias[6].map(|i| push(hf.specs[i].name.clone(), vec![i]));
                TrainedLayer {
                    input_norm,
                    qkv_w,
                    qkv_b,
                    o_w,
                    o_b,
                    post_norm,
                    gate_up_w,
                    gate_up_b,
                    down_w,
                    down_b,
                }
            })
            .collect();
        let norm = push(hf.specs[hf.norm].name.clone(), vec![hf.norm]);
        let lm_head = hf.lm_head.map(|i| push(hf.specs[i].name.clone(), vec![i]));
        Self {
            specs,
            embed,
            layers,
            norm,
            lm_head,
            parts,
        }
    }

    /// The trained tensors from HF tensors in [`Layout`]'s order (rows stacked).
    pub fn fuse(&self, hf: &[Vec<f32>]) -> Vec<Vec<f32>> {
        self.parts
            .iter()
            .map(|from| from.iter().flat_map(|&i| hf[i].iter().copied()).collect())
            .collect()
    }

    /// The HF tensors (in [`Layout`]'s order, shapes `hf`) from trained tensors (rows cut).
    pub fn split(&self, hf: &Layout, trained: &[Vec<f32>]) -> Vec<Vec<f32>> {
        let mut out = vec![Vec::new(); hf.specs.len()];
        for (from, t) in self.parts.iter().zip(trained) {
            let mut at = 0;
            for &i in from {
                let len: usize = hf.specs[i].shape.iter().product();
                out[i] = t.get(at..at + len).map(<[f32]>::to_vec).unwrap_or_default();
                at += len;
            }
        }
        out
    }
}
