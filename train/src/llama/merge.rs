//! `--merge-on-save` for the LLaMA family: the base weights with the adapters folded in,
//! `W' = W + (alpha / r) · B·A` (W `[out, in]`, A `[r, in]`, B `[out, r]`: HF's Linear layout, as
//! PEFT's `merge_and_unload` computes it), summed in f64 and rounded once to f32.

use super::config::LlamaConfig;
use super::lora::LlamaLora;
use super::params::{Layout, Linear};
use crate::error::{Result, TrainError};
use crate::lora::merge::{fold_adapter, WeightLayout};

/// `base` (HF tensors in [`Layout::new`]'s order) with every adapter of `lora` (`adapters` in
/// [`LlamaLora::specs`]' order) merged into its target's weight.
pub fn merged(
    cfg: &LlamaConfig,
    lora: &LlamaLora,
    base: &[Vec<f32>],
    adapters: &[Vec<f32>],
) -> Result<Vec<Vec<f32>>> {
    let layout = Layout::new(cfg);
    if base.len() != layout.specs.len() || adapters.len() != lora.specs(cfg).len() {
        return Err(TrainError::Op(format!(
            "merging {} adapter tensors into {} base tensors of {}",
            adapters.len(),
            base.len(),
            cfg.describe()
        )));
    }
    let mut out = base.to_vec();
    let (r, s) = (lora.rank, lora.scale());
    for (l, layer) in layout.layers.iter().enumerate() {
        for &t in &lora.targets {
            let name = || format!("model.layers.{l}.{}", t.path());
            let i = lora
                .index(l, t)
                .ok_or_else(|| TrainError::Op(format!("no adapter for {}", name())))?;
            let [n_out, n_in] = t.shape(cfg);
            let (a, b) = (&adapters[i], &adapters[i + 1]);
            let w = &mut out[layer.weight[position(t)]];
            let dims = [n_out, n_in, r];
            fold_adapter(w, [a, b], dims, s, WeightLayout::OutIn, &name)?;
        }
    }
    Ok(out)
}

/// `t`'s position in [`Linear::ALL`] (the index into [`super::params::LayerIndex::weight`]).
fn position(t: Linear) -> usize {
    Linear::ALL.iter().position(|&x| x == t).unwrap_or(0)
}
