//! Checkpoints of a LLaMA-family run, `DIR/step_<s>/`: `config.json` (as read) and
//! `model.safetensors` (f32, HF names) — a directory transformers' `from_pretrained` loads and
//! `--model` reads — plus `optimizer.safetensors` (`exp_avg.<name>`, `exp_avg_sq.<name>`) and
//! `trainer.json`, written atomically as GPT-2's ([`crate::checkpoint::save_files`]).

use super::config::LlamaConfig;
use super::params::Layout;
use crate::checkpoint::{save_files, take_moments, TrainerState};
use crate::error::{read_regular, Result, TrainError};
use crate::weights::{read_f32_tensors, to_safetensors};
use std::path::{Path, PathBuf};

/// Host copies of what a checkpoint holds (tensors in [`Layout::new`]'s order).
pub struct Snapshot<'a> {
    /// Model config (written back as read).
    pub config: &'a LlamaConfig,
    /// f32 parameters.
    pub params: &'a [Vec<f32>],
    /// AdamW first moments.
    pub exp_avg: &'a [Vec<f32>],
    /// AdamW second moments.
    pub exp_avg_sq: &'a [Vec<f32>],
    /// Trainer state.
    pub state: &'a TrainerState,
}

/// What [`load`] restores.
#[derive(Debug, Clone)]
pub struct Restored {
    /// Parameters.
    pub params: Vec<Vec<f32>>,
    /// AdamW first moments.
    pub exp_avg: Vec<Vec<f32>>,
    /// AdamW second moments.
    pub exp_avg_sq: Vec<Vec<f32>>,
    /// Trainer state.
    pub state: TrainerState,
}

/// Write `dir/step_<s>/` atomically; returns its path.
pub fn save(dir: &Path, snap: &Snapshot<'_>) -> Result<PathBuf> {
    let config = serde_json::to_vec_pretty(&snap.config.raw)
        .map_err(|e| TrainError::Op(format!("serializing config.json: {e}")))?;
    let state = serde_json::to_vec_pretty(snap.state)
        .map_err(|e| TrainError::Op(format!("serializing trainer.json: {e}")))?;
    let layout = Layout::new(snap.config);
    let mut moments = Vec::new();
    for (prefix, group) in [("exp_avg", snap.exp_avg), ("exp_avg_sq", snap.exp_avg_sq)] {
        for (s, t) in layout.specs.iter().zip(group) {
            moments.push((
                format!("{prefix}.{}", s.name),
                s.shape.clone(),
                t.as_slice(),
            ));
        }
    }
    save_files(
        dir,
        snap.state.step,
        &[
            ("config.json", config),
            (
                "model.safetensors",
                super::weights::to_bytes(snap.config, snap.params)?,
            ),
            ("optimizer.safetensors", to_safetensors(&moments)?),
            ("trainer.json", state),
        ],
    )
}

/// Read a checkpoint written by [`save`] for the model `cfg` (an error if it is from another
/// model, or any file is missing or malformed).
pub fn load(dir: &Path, cfg: &LlamaConfig) -> Result<Restored> {
    if !dir.exists() {
        crate::checkpoint::recover_for_resume(dir)?;
    }
    if !dir.is_dir() {
        return Err(TrainError::file(
            dir,
            "--resume needs a checkpoint directory DIR/step_<s>",
        ));
    }
    if dir.join("adapter_config.json").exists() {
        return Err(TrainError::file(
            dir,
            "is a LoRA checkpoint (adapter_config.json): resume it with its --lora-rank, \
             --lora-alpha and --lora-targets",
        ));
    }
    let ckpt_cfg = match crate::config::ModelConfig::load(&dir.join("config.json"))? {
        crate::config::ModelConfig::Llama(c) => c,
        crate::config::ModelConfig::Gpt2(c) => {
            return Err(TrainError::file(
                dir,
                format!(
                    "checkpoint is of a GPT-2 ({}), --model of {}",
                    c.describe(),
                    cfg.describe()
                ),
            ))
        }
    };
    if !ckpt_cfg.same_model(cfg) {
        return Err(TrainError::file(
            dir,
            format!(
                "checkpoint is from another model ({}) than --model ({})",
                ckpt_cfg.describe(),
                cfg.describe()
            ),
        ));
    }
    let state_path = dir.join("trainer.json");
    let state = TrainerState::from_json(&state_path, &read_regular(&state_path, 1 << 20)?)?;
    let params = super::weights::load(dir, cfg)?;
    let opt_path = dir.join("optimizer.safetensors");
    let mut opt = read_f32_tensors(&opt_path)?;
    let layout = Layout::new(cfg);
    let mut take = |prefix: &str| take_moments(&opt_path, &mut opt, prefix, &layout.specs);
    let (exp_avg, exp_avg_sq) = (take("exp_avg")?, take("exp_avg_sq")?);
    if let Some(name) = opt.keys().next() {
        return Err(TrainError::file(
            &opt_path,
            format!("unexpected tensor `{name}`"),
        ));
    }
    Ok(Restored {
        params,
        exp_avg,
        exp_avg_sq,
        state,
    })
}
