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
            let what = || format!("h.{l}.{}", t.name());
            let dims = [n_out, n_in, r];
            fold_adapter(
                weight(layer, t),
                [a, b],
                dims,
                s,
                WeightLayout::InOut,
                &what,
            )?;
        }
    }
    Ok(out)
}

/// How a base weight is laid out: HF's `Linear` (`[out, in]`) or GPT-2's `Conv1D` (`[in, out]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WeightLayout {
    /// `[out, in]` (transformers' `nn.Linear`).
    OutIn,
    /// `[in, out]` (GPT-2's `Conv1D`).
    InOut,
}

/// `w += s · B·A` for one adapter (A `[r, in]`, B `[out, r]`) on a weight in `layout`: each
/// element's Σ_k B[o, k]·A[k, i] summed in f64, added to the weight in f64 and rounded once to
/// f32. `what` names the target when the lengths do not fit `[n_out, n_in, r]`.
pub(crate) fn fold_adapter(
    w: &mut [f32],
    [a, b]: [&[f32]; 2],
    [n_out, n_in, r]: [usize; 3],
    s: f64,
    layout: WeightLayout,
    what: &dyn Fn() -> String,
) -> Result<()> {
    if a.len() != r * n_in || b.len() != n_out * r || w.len() != n_out * n_in {
        let shape = match layout {
            WeightLayout::OutIn => format!("[{n_out}, {n_in}]"),
            WeightLayout::InOut => format!("[{n_in}, {n_out}]"),
        };
        return Err(TrainError::Op(format!(
            "{}: adapter sizes {} / {} do not fit a {shape} weight at rank {r}",
            what(),
            a.len(),
            b.len()
        )));
    }
    for o in 0..n_out {
        for i in 0..n_in {
            let dot: f64 = (0..r)
                .map(|k| f64::from(b[o * r + k]) * f64::from(a[k * n_in + i]))
                .sum();
            let x = &mut w[match layout {
                WeightLayout::OutIn => o * n_in + i,
                WeightLayout::InOut => i * n_out + o,
            }];
            *x = (f64::from(*x) + s * dot) as f32;
        }
    }
    Ok(())
}
