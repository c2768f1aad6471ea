//! `--merge-on-save` for the LLaMA family: the base weights with the adapters folded in,
//! `W' = W + (alpha / r) · B·A` (W `[out, in]`, A `[r, in]`, B `[out, r]`: HF's Linear layout, as
//! PEFT's `merge_and_unload` computes it), summed in f64 and rounded once to f32.

use super::config::LlamaConfig;
use super::lora::LlamaLora;
use super::params::{Layout, Linear};
use crate::error::{Result, TrainError};

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
            if a.len() != r * n_in || b.len() != n_out * r || w.len() != n_out * n_in {
                return Err(TrainError::Op(format!(
                    "{}: adapter sizes {} / {} do not fit a [{n_out}, {n_in}] weight at rank {r}",
                    name(),
                    a.len(),
                    b.len()
                )));
            }
            for row in 0..n_out {
                for col in 0..n_in {
                    // (B·A)[row, col] = Σ_k B[row, k] · A[k, col].
                    let dot: f64 = (0..r)
                        .map(|k| f64::from(b[row * r + k]) * f64::from(a[k * n_in + col]))
                        .sum();
                    let x = &mut w[row * n_in + col];
                    *x = (f64::from(*x) + s * dot) as f32;
                }
            }
        }
    }
    Ok(out)
}

/// `t`'s position in [`Linear::ALL`] (the index into [`super::params::LayerIndex::weight`]).
fn position(t: Linear) -> usize {
    Linear::ALL.iter().position(|&x| x == t).unwrap_or(0)
}
