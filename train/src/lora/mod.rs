//! LoRA fine-tuning (docs/TRAIN-GPT2.md, "LoRA"): low-rank adapters beside the frozen GPT-2.
//!
//! For layer `l` and target `t` (a Conv1D with weight W `[in, out]`), the adapters are
//! `h.{l}.{t}.lora_A` `[r, in]` and `h.{l}.{t}.lora_B` `[out, r]` (PEFT's Linear layout; files
//! spell them as PEFT does, [`peft`]), and the target computes `y = x @ W + b + (alpha / r) · (x @ Aᵀ) @ Bᵀ`. Only the adapters train: the
//! base model has no gradient buffers and no optimizer state.
//!
//! - [`LoraConfig`]: the flags (`--lora-rank`, `--lora-alpha`, `--lora-targets`) checked;
//! - [`init`]: the adapters' first values (seeded, or read from `--lora-init`);
//! - [`adapters`]: the adapters on a backend, their forward and backward beside the base GEMMs;
//! - [`checkpoint`]: `adapter_model.safetensors`, `adapter_config.json` and their optimizer state;
//! - [`merge`]: `W' = W + (alpha / r) · Aᵀ @ Bᵀ` for `--merge-on-save`;
//! - [`peft`]: PEFT's tensor names and `adapter_config.json`, written and read.

pub mod adapters;
pub mod checkpoint;
pub mod init;
pub mod merge;
pub mod peft;

use crate::backend::Backend;
use crate::backend::TrainElement;
use crate::checkpoint::TrainerState;
use crate::cli::Args;
use crate::config::GptConfig;
use crate::error::{Result, TrainError};
use crate::params::{Params, Spec};
use std::path::{Path, PathBuf};

/// A layer's Conv1D that can carry adapters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Target {
    /// `attn.c_attn` (`[C, 3C]`).
    CAttn,
    /// `attn.c_proj` (`[C, C]`).
    AttnProj,
    /// `mlp.c_fc` (`[C, F]`).
    CFc,
    /// `mlp.c_proj` (`[F, C]`).
    MlpProj,
}

impl Target {
    /// Every target, in the canonical order (adapters, files and optimizer follow it).
    pub const ALL: [Target; 4] = [
        Target::CAttn,
        Target::AttnProj,
        Target::CFc,
        Target::MlpProj,
    ];

    /// The module's name after `h.{l}.`, as `--lora-targets` and PEFT's `target_modules` spell it.
    pub fn name(self) -> &'static str {
        match self {
            Target::CAttn => "attn.c_attn",
            Target::AttnProj => "attn.c_proj",
            Target::CFc => "mlp.c_fc",
            Target::MlpProj => "mlp.c_proj",
        }
    }

    /// `(in, out)` of the base weight `[in, out]`.
    pub fn dims(self, cfg: &GptConfig) -> (usize, usize) {
        let (c, f) = (cfg.channels, cfg.inner);
        match self {
            Target::CAttn => (c, 3 * c),
            Target::AttnProj => (c, c),
            Target::CFc => (c, f),
            Target::MlpProj => (f, c),
        }
    }

    /// The target called `name`.
    pub fn parse(name: &str) -> Option<Target> {
        Target::ALL.into_iter().find(|t| t.name() == name)
    }
}

/// The adapters' shape: rank, scale and which modules carry them.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraConfig {
    /// Rank r (≥ 1).
    pub rank: usize,
    /// alpha (the scale is alpha / r).
    pub alpha: f64,
    /// Adapted modules, in the canonical order, each once.
    pub targets: Vec<Target>,
}

/// The default of `--lora-targets` (PEFT's default for GPT-2).
pub const DEFAULT_TARGETS: &str = "attn.c_attn";

/// Largest `--lora-rank` accepted (far above any useful rank; keeps every size in range).
pub const MAX_RANK: usize = 1 << 16;

impl LoraConfig {
    /// The LoRA flags of `args` checked: `None` without `--lora-rank` (or with 0), when no
    /// LoRA-only flag may be given either. Every error is a usage error naming the flag.
    pub fn from_args(args: &Args) -> Result<Option<Self>> {
        let Some((rank, alpha)) = check_flags(args)? else {
            return Ok(None);
        };
        let bad = |m: String| Err(TrainError::Usage(m));
        let list = args.lora_targets.as_deref().unwrap_or(DEFAULT_TARGETS);
        let mut targets = Vec::new();
        for name in list.split(',').map(str::trim) {
            let Some(t) = Target::parse(name) else {
                let all: Vec<_> = Target::ALL.iter().map(|t| t.name()).collect();
                return bad(format!(
                    "--lora-targets: `{name}` is not a target; choose from {}",
                    all.join(", ")
                ));
            };
            if targets.contains(&t) {
                return bad(format!("--lora-targets: `{name}` is listed twice"));
            }
            targets.push(t);
        }
        targets.sort();
        Ok(Some(Self {
            rank,
            alpha,
            targets,
        }))
    }

    /// The scale alpha / r of the adapter path.
    pub fn scale(&self) -> f64 {
        self.alpha / self.rank as f64
    }

    /// Every adapter of `cfg`, in the canonical order: layer by layer, the targets in
    /// [`Target::ALL`]'s order, `lora_A` then `lora_B`.
    pub fn specs(&self, cfg: &GptConfig) -> Vec<Spec> {
        let mut out = Vec::with_capacity(2 * cfg.layers * self.targets.len());
        for l in 0..cfg.layers {
            for &t in &self.targets {
                let (n_in, n_out) = t.dims(cfg);
                out.push(Spec {
                    name: format!("h.{l}.{}.lora_A", t.name()),
                    shape: vec![self.rank, n_in],
                });
                out.push(Spec {
                    name: format!("h.{l}.{}.lora_B", t.name()),
                    shape: vec![n_out, self.rank],
                });
            }
        }
        out
    }

    /// Index of the `lora_A` of layer `l`, target `t` in [`LoraConfig::specs`] (`lora_B` follows
    /// it), or `None` when `t` carries no adapters.
    pub fn index(&self, l: usize, t: Target) -> Option<usize> {
        let k = self.targets.iter().position(|&x| x == t)?;
        Some(2 * (l * self.targets.len() + k))
    }

    /// Trainable parameters: `r · (in + out)` per adapted module.
    pub fn trainable(&self, cfg: &GptConfig) -> usize {
        self.specs(cfg)
            .iter()
            .map(|s| s.shape.iter().product::<usize>())
            .sum()
    }
}

/// The adapters (and their AdamW moments) on the host, in [`LoraConfig::specs`]' order.
#[derive(Debug, Clone, PartialEq)]
pub struct HostAdapters {
    /// Rank, alpha, targets.
    pub cfg: LoraConfig,
    /// `lora_A`, `lora_B`, … (f32).
    pub params: Vec<Vec<f32>>,
    /// AdamW first moments.
    pub exp_avg: Vec<Vec<f32>>,
    /// AdamW second moments.
    pub exp_avg_sq: Vec<Vec<f32>>,
}

impl HostAdapters {
    /// Fresh moments (zero) for `params`.
    pub fn with_zero_moments(cfg: LoraConfig, params: Vec<Vec<f32>>) -> Self {
        let zeros: Vec<Vec<f32>> = params.iter().map(|p| vec![0.0; p.len()]).collect();
        Self {
            cfg,
            params,
            exp_avg: zeros.clone(),
            exp_avg_sq: zeros,
        }
    }
}

/// The LoRA flags of `args` checked, whatever the model family (its targets are the family's
/// to parse): `None` without `--lora-rank` (or with 0), else `(rank, alpha)`. Every error is a
/// usage error naming the flag.
pub fn check_flags(args: &Args) -> Result<Option<(usize, f64)>> {
    let bad = |m: String| Err(TrainError::Usage(m));
    if args.lora_rank == 0 {
        let given = [
            ("--lora-alpha", args.lora_alpha.is_some()),
            ("--lora-targets", args.lora_targets.is_some()),
            ("--lora-init", args.lora_init.is_some()),
            ("--seed", args.seed.is_some()),
            ("--merge-on-save", args.merge_on_save),
        ];
        if let Some((flag, _)) = given.iter().find(|(_, g)| *g) {
            return bad(format!(
                "{flag} is a LoRA flag, but --lora-rank is {}: set --lora-rank r > 0 to \
                 fine-tune with LoRA, or drop {flag}",
                args.lora_rank
            ));
        }
        return Ok(None);
    }
    if args.lora_rank > MAX_RANK {
        return bad(format!(
            "--lora-rank {}: must be at most {MAX_RANK}",
            args.lora_rank
        ));
    }
    let alpha = args.lora_alpha.unwrap_or(args.lora_rank as f64);
    if !(alpha.is_finite() && alpha > 0.0) {
        return bad(format!("--lora-alpha {alpha}: must be a finite number > 0"));
    }
    if args.lora_init.is_some() && args.seed.is_some() {
        return bad(
            "--seed seeds the adapters' initialisation, which --lora-init replaces: give one"
                .into(),
        );
    }
    if args.lora_init.is_some() && args.resume.is_some() {
        return bad(
            "--lora-init sets the first adapters, but --resume restores them from the \
             checkpoint: give one"
                .into(),
        );
    }
    if args.merge_on_save && args.checkpoint_dir.is_none() {
        return bad("--merge-on-save needs --checkpoint-dir DIR and --save-every N".into());
    }
    // Before the model is read: a name no family adapts (each family checks its own later).
    let llama: Vec<&str> = crate::llama::Linear::ALL.iter().map(|t| t.name()).collect();
    let glm: Vec<&str> = glm_names(crate::llama::Family::Glm);
    let chatglm: Vec<&str> = glm_names(crate::llama::Family::ChatGlm);
    let list = args.lora_targets.as_deref().unwrap_or(DEFAULT_TARGETS);
    for name in list.split(',').map(str::trim) {
        let known = llama.contains(&name) || glm.contains(&name) || chatglm.contains(&name);
        if Target::parse(name).is_none() && !known {
            let gpt2: Vec<_> = Target::ALL.iter().map(|t| t.name()).collect();
            return bad(format!(
                "--lora-targets: `{name}` is not a target; choose from {} (GPT-2), {} (LLaMA, \
                 Qwen2), {} (glm) or {} (chatglm)",
                gpt2.join(", "),
                llama.join(", "),
                glm.join(", "),
                chatglm.join(", ")
            ));
        }
    }
    Ok(Some((args.lora_rank, alpha)))
}

/// The LoRA target names of a GLM-family layout.
fn glm_names(family: crate::llama::Family) -> Vec<&'static str> {
    crate::glm::lora::targets(family)
        .unwrap_or_default()
        .iter()
        .map(|t| t.0)
        .collect()
}

/// A [`crate::checkpoint::Restored`] of a frozen base: `params`, no optimizer state (empty
/// moments), `state`.
fn frozen_restored(
    params: Params<Vec<f32>>,
    state: TrainerState,
) -> Result<crate::checkpoint::Restored> {
    let none = params.try_map(|_, _| Ok::<_, TrainError>(Vec::new()))?;
    Ok(crate::checkpoint::Restored {
        params,
        exp_avg: none.clone(),
        exp_avg_sq: none,
        state,
    })
}

fn need(lora: Option<&LoraConfig>) -> Result<&LoraConfig> {
    lora.ok_or_else(|| TrainError::Op("LoRA set up without --lora-rank".into()))
}

/// A fresh LoRA run: the adapters from `--lora-init` or seeded from `--seed`, zero moments; the
/// frozen base `params` and the trainer `state`.
pub fn start(
    args: &Args,
    lora: Option<&LoraConfig>,
    cfg: &GptConfig,
    params: Params<Vec<f32>>,
    state: TrainerState,
) -> Result<(HostAdapters, crate::checkpoint::Restored)> {
    let lora = need(lora)?;
    let values = match &args.lora_init {
        Some(path) => init::load(path, lora, cfg)?,
        None => init::seeded(lora, cfg, args.seed.unwrap_or(0)),
    };
    Ok((
        HostAdapters::with_zero_moments(lora.clone(), values),
        frozen_restored(params, state)?,
    ))
}

/// Continue a LoRA run from checkpoint `dir` on the frozen base `params` (`--model`).
pub fn resume(
    dir: &Path,
    lora: &LoraConfig,
    cfg: &GptConfig,
    params: Params<Vec<f32>>,
) -> Result<(HostAdapters, crate::checkpoint::Restored)> {
    let (adapters, state) = checkpoint::load(dir, lora, cfg, &params)?;
    Ok((adapters, frozen_restored(params, state)?))
}

/// The first progress line's parameter count: all of them, or with LoRA the trainable ones and
/// the total.
pub fn describe_parameters(
    base: &Params<Vec<f32>>,
    lora: Option<&HostAdapters>,
    cfg: &GptConfig,
) -> String {
    let total_base: usize = base.iter().iter().map(|t| t.len()).sum();
    match lora {
        None => total_base.to_string(),
        Some(h) => {
            let trainable = h.cfg.trainable(cfg);
            format!(
                "LoRA r={} alpha={} on {}: {trainable} trainable of {}",
                h.cfg.rank,
                h.cfg.alpha,
                h.cfg
                    .targets
                    .iter()
                    .map(|t| t.name())
                    .collect::<Vec<_>>()
                    .join(","),
                total_base + trainable
            )
        }
    }
}

/// Save a LoRA checkpoint of `adapters` (downloaded now) with `state`; with `--merge-on-save`
/// also the merged model of `base`.
pub fn save<T: TrainElement, B: Backend<T>>(
    dir: &Path,
    args: &Args,
    cfg: &GptConfig,
    base: &Params<Vec<f32>>,
    adapters: &adapters::Adapters<T, B>,
    backend: &B,
    state: &TrainerState,
) -> Result<PathBuf> {
    let host = adapters.download(backend)?;
    let merged = if args.merge_on_save {
        Some(merge::merged(base, &host, cfg)?)
    } else {
        None
    };
    checkpoint::save(
        dir,
        &checkpoint::LoraSnapshot {
            config: cfg,
            adapters: &host,
            state,
            base_model: &args.model,
            merged: merged.as_ref(),
            base,
        },
    )
}
