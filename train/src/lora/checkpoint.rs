//! LoRA checkpoints `DIR/step_<s>/`, in PEFT's naming where PEFT has one:
//! `adapter_model.safetensors` (the adapters in PEFT's names,
//! `base_model.model.transformer.h.{l}.{t}.lora_A.weight` / `lora_B.weight`, f32),
//! `adapter_config.json` (what `peft.PeftModel.from_pretrained` needs: [`peft::config`]),
//! `optimizer.safetensors` (`exp_avg.<adapter>`, `exp_avg_sq.<adapter>`) and `trainer.json` (as
//! a full checkpoint's). With `--merge-on-save` also `model.safetensors` + `config.json` of the
//! merged model, loadable with `--model`. Written atomically like every checkpoint
//! ([`crate::checkpoint::save_files`]). The base model is not saved: `--resume` reads it from
//! `--model` again.

use super::{peft, HostAdapters, LoraConfig};
use crate::checkpoint::{save_files, TrainerState};
use crate::config::GptConfig;
use crate::error::{read_regular, Result, TrainError};
use crate::params::Params;
use crate::weights::{params_to_safetensors, read_f32_tensors, to_safetensors};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// The adapters' file.
pub const ADAPTER_MODEL: &str = "adapter_model.safetensors";
/// PEFT's config file.
pub const ADAPTER_CONFIG: &str = "adapter_config.json";
/// The adapters' AdamW moments.
pub const OPTIMIZER: &str = "optimizer.safetensors";
/// A fingerprint of the frozen base model the adapters were trained on (per tensor: the f64 sum
/// and sum of squares of its f32 values, as hexadecimal bit patterns), checked on `--resume`.
pub const BASE_MODEL: &str = "base_model.json";

/// The fingerprint of `base`: `{name: [sum, sum of squares]}` (f64 bits in hexadecimal).
fn fingerprint(base: &Params<Vec<f32>>, cfg: &GptConfig) -> serde_json::Map<String, Value> {
    crate::params::specs(cfg)
        .into_iter()
        .zip(base.iter())
        .map(|(s, t)| {
            let (sum, sq) = t.iter().fold((0.0f64, 0.0f64), |(a, b), &x| {
                let x = f64::from(x);
                (a + x, b + x * x)
            });
            // As bit patterns: exact through JSON (serde_json's float parsing may be an ulp off).
            let hex = |x: f64| format!("{:016x}", x.to_bits());
            (s.name, json!([hex(sum), hex(sq)]))
        })
        .collect()
}

/// Refuse to resume on another base model than the checkpoint's (`path`: its base_model.json).
fn check_base(path: &Path, base: &Params<Vec<f32>>, cfg: &GptConfig) -> Result<()> {
    let raw: Value = serde_json::from_slice(&read_regular(path, 16 << 20)?)
        .map_err(|e| TrainError::file(path, format!("is not valid JSON: {e}")))?;
    let saved = raw
        .as_object()
        .ok_or_else(|| TrainError::file(path, "must hold a JSON object"))?;
    let now = fingerprint(base, cfg);
    for (name, v) in &now {
        if saved.get(name) != Some(v) {
            return Err(TrainError::file(
                path,
                format!(
                    "the adapters were trained on another base model: tensor `{name}` of \
                     --model differs (checksums {v} here, {} in the checkpoint); resume with the \
                     --model they were trained on",
                    saved.get(name).map_or("none".into(), Value::to_string)
                ),
            ));
        }
    }
    if let Some(extra) = saved.keys().find(|k| !now.contains_key(*k)) {
        return Err(TrainError::file(
            path,
            format!("names tensor `{extra}`, which --model does not have: another base model"),
        ));
    }
    Ok(())
}

/// What a LoRA checkpoint holds (host copies).
pub struct LoraSnapshot<'a> {
    /// Model config.
    pub config: &'a GptConfig,
    /// The adapters and their moments.
    pub adapters: &'a HostAdapters,
    /// Trainer state.
    pub state: &'a TrainerState,
    /// `--model` as given (PEFT's `base_model_name_or_path`, recorded, not checked).
    pub base_model: &'a Path,
    /// With `--merge-on-save`: the merged model.
    pub merged: Option<&'a Params<Vec<f32>>>,
    /// The frozen base model (only its fingerprint is saved).
    pub base: &'a Params<Vec<f32>>,
}

fn to_json(v: &impl serde::Serialize, name: &str) -> Result<Vec<u8>> {
    serde_json::to_vec_pretty(v).map_err(|e| TrainError::Op(format!("serializing {name}: {e}")))
}

/// Write `dir/step_<s>/` atomically; returns its path.
pub fn save(dir: &Path, snap: &LoraSnapshot<'_>) -> Result<PathBuf> {
    let a = snap.adapters;
    let specs = a.cfg.specs(snap.config);
    let adapters: Vec<_> = specs
        .iter()
        .zip(&a.params)
        .map(|(s, t)| (peft::tensor_name(&s.name), s.shape.clone(), t.as_slice()))
        .collect();
    let mut moments: Vec<_> = specs
        .iter()
        .zip(&a.exp_avg)
        .map(|(s, t)| (format!("exp_avg.{}", s.name), s.shape.clone(), t.as_slice()))
        .collect();
    moments.extend(specs.iter().zip(&a.exp_avg_sq).map(|(s, t)| {
        (
            format!("exp_avg_sq.{}", s.name),
            s.shape.clone(),
            t.as_slice(),
        )
    }));
    let mut files = vec![
        (ADAPTER_MODEL, to_safetensors(&adapters)?),
        (
            ADAPTER_CONFIG,
            to_json(&peft::config(&a.cfg, snap.base_model), ADAPTER_CONFIG)?,
        ),
        (OPTIMIZER, to_safetensors(&moments)?),
        ("trainer.json", to_json(snap.state, "trainer.json")?),
        (
            BASE_MODEL,
            to_json(&fingerprint(snap.base, snap.config), BASE_MODEL)?,
        ),
    ];
    if let Some(m) = snap.merged {
        files.push(("config.json", to_json(&snap.config.raw, "config.json")?));
        files.push(("model.safetensors", params_to_safetensors(m, snap.config)?));
    }
    save_files(dir, snap.state.step, &files)
}

/// Read the adapters, their moments and the trainer state of a checkpoint written by [`save`]
/// for the flags `lora` on model `cfg` with the frozen weights `base` (which must be the ones the
/// checkpoint was trained on).
pub fn load(
    dir: &Path,
    lora: &LoraConfig,
    cfg: &GptConfig,
    base: &Params<Vec<f32>>,
) -> Result<(HostAdapters, TrainerState)> {
    if !dir.exists() {
        crate::checkpoint::recover_for_resume(dir)?;
    }
    if !dir.is_dir() {
        return Err(TrainError::file(
            dir,
            "--resume needs a checkpoint directory DIR/step_<s>",
        ));
    }
    let cfg_path = dir.join(ADAPTER_CONFIG);
    if !cfg_path.exists() {
        return Err(TrainError::file(
            dir,
            format!(
                "has no {ADAPTER_CONFIG}: not a LoRA checkpoint (resume a full fine-tuning \
                 checkpoint without --lora-rank)"
            ),
        ));
    }
    peft::check_config(&cfg_path, lora)?;
    check_base(&dir.join(BASE_MODEL), base, cfg)?;
    let state_path = dir.join("trainer.json");
    let state = TrainerState::from_json(&state_path, &read_regular(&state_path, 1 << 20)?)?;
    let specs = lora.specs(cfg);
    let model_path = dir.join(ADAPTER_MODEL);
    let params = super::init::take_adapters(
        &model_path,
        read_f32_tensors(&model_path)?,
        "",
        &specs,
        lora,
    )?;
    let opt_path = dir.join(OPTIMIZER);
    let mut opt = read_f32_tensors(&opt_path)?;
    let mut first = std::collections::BTreeMap::new();
    let keys: Vec<String> = opt.keys().cloned().collect();
    for k in keys {
        if k.starts_with("exp_avg.") {
            if let Some(t) = opt.remove(&k) {
                first.insert(k, t);
            }
        }
    }
    let exp_avg = super::init::take_adapters(&opt_path, first, "exp_avg.", &specs, lora)?;
    let exp_avg_sq = super::init::take_adapters(&opt_path, opt, "exp_avg_sq.", &specs, lora)?;
    if let Some((i, x)) = exp_avg_sq
        .iter()
        .flatten()
        .enumerate()
        .find(|(_, x)| **x < 0.0)
    {
        return Err(TrainError::file(
            &opt_path,
            format!(
                "a second moment holds {x} (flat index {i} over all adapters); it must be >= 0"
            ),
        ));
    }
    Ok((
        HostAdapters {
            cfg: lora.clone(),
            params,
            exp_avg,
            exp_avg_sq,
        },
        state,
    ))
}
