//! A LLaMA-family model's weights: HF safetensors in (single or sharded, f32/f16/bf16), f32 out
//! in the canonical order of [`Layout`], and the `step_<s>` directory transformers loads.

use super::config::LlamaConfig;
use super::params::Layout;
use crate::error::{Result, TrainError};
use crate::weights::{read_model_tensors, take_strict, to_safetensors};
use std::path::Path;

/// Old transformers saves carry each layer's rotary table as a buffer; it is recomputed from
/// the config, so it is ignored.
fn is_rotary_buffer(name: &str) -> bool {
    name.starts_with("model.layers.") && name.ends_with(".self_attn.rotary_emb.inv_freq")
}

/// The parameters of `cfg` from the model directory `dir`, in [`Layout::new`]'s order. Every
/// missing, unexpected, misshapen or non-finite tensor is an error naming it; with tied
/// embeddings a `lm_head.weight` must equal `model.embed_tokens.weight` and is dropped.
pub fn load(dir: &Path, cfg: &LlamaConfig) -> Result<Vec<Vec<f32>>> {
    let (mut tensors, files) = read_model_tensors(dir)?;
    let what = match files.as_slice() {
        [one] => one.clone(),
        _ => dir.join(crate::weights::INDEX_FILE),
    };
    tensors.retain(|name, _| !is_rotary_buffer(name));
    let tied_head = match cfg.tied {
        true => tensors.remove("lm_head.weight"),
        false => None,
    };
    let layout = Layout::new(cfg);
    let values = take_strict(&what, tensors, &layout.specs, &cfg.describe())?;
    if let Some((_, head)) = tied_head {
        if values.get(layout.embed) != Some(&head) {
            return Err(TrainError::file(
                &what,
                "tensor `lm_head.weight` differs from `model.embed_tokens.weight` but \
                 config.json says `tie_word_embeddings`: true (remove lm_head.weight, or set \
                 tie_word_embeddings to false)",
            ));
        }
    }
    Ok(values)
}

/// The parameters as f32 safetensors bytes under their HF names (no lm_head when tied).
pub fn to_bytes(cfg: &LlamaConfig, params: &[Vec<f32>]) -> Result<Vec<u8>> {
    let layout = Layout::new(cfg);
    if params.len() != layout.specs.len() {
        return Err(TrainError::Op(format!(
            "{} tensors for {}, which has {}",
            params.len(),
            cfg.describe(),
            layout.specs.len()
        )));
    }
    let list: Vec<_> = layout
        .specs
        .into_iter()
        .zip(params)
        .map(|(s, t)| (s.name, s.shape, t.as_slice()))
        .collect();
    to_safetensors(&list)
}
