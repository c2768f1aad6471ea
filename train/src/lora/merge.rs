//! `--merge-on-save`: the base weights with the adapters folded in,
//! `W' = W + (alpha / r) · Aᵀ @ Bᵀ` (W `[in, out]`, A `[r, in]`, B `[out, r]`), summed in f64
//! and rounded once to f32.

use super::{HostAdapters, Target};
use crate::config::GptConfig;
use crate::error::{Result, TrainError};
use crate::params::{Layer, Params};

/// The weight of target `t` in `layer`.
fn weight(layer: &mut Layer<Vec<f32>>, t: Target) -> &mut Vec<f32> {
    match t {
        Target::CAttn => &mut layer.qkv_w,
        Target::AttnProj => &mut layer.proj_w,
        Target::CFc => &mut layer.fc_w,
        Target::MlpProj => &mut layer.mproj_w,
    }
}

/// `base` with every adapter of `lora` merged into its target's weight.
pub fn merged(
    base: &Params<Vec<f32>>,
    lora: &HostAdapters,
    cfg: &GptConfig,
) -> Result<Params<Vec<f32>>> {
    let mut out = base.clone();
    let (r, s) = (lora.cfg.rank, lora.cfg.scale());
    for (l, layer) in out.layers.iter_mut().enumerate() {
        for &t in &lora.cfg.targets {
            let i = lora
                .cfg
                .index(l, t)
                .ok_or_else(|| TrainError::Op(format!("no adapter for h.{l}.{}", t.name())))?;
            let (n_in, n_out) = t.dims(cfg);
            let (a, b) = (&lora.params[i], &lora.params[i + 1]);
            let w = weight(layer, t);
            if a.len() != r * n_in || b.len() != n_out * r || w.len() != n_in * n_out {
                return Err(TrainError::Op(format!(
                    "h.{l}.{}: adapter sizes {} / {} do not fit a [{n_in}, {n_out}] weight at rank {r}",
                    t.name(),
                    a.len(),
                    b.len()
                )));
            }
            for row in 0..n_in {
                for col in 0..n_out {
                    // (Aᵀ @ Bᵀ)[row, col] = Σ_k A[k, row] · B[col, k].
                    let dot: f64 = (0..r)
                        .map(|k| f64::from(a[k * n_in + row]) * f64::from(b[col * r + k]))
                        .sum();
                    let x = &mut w[row * n_out + col];
                    *x = (f64::from(*x) + s * dot) as f32;
                }
            }
        }
    }
    Ok(out)
}
