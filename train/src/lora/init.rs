//! The adapters' first values: seeded (A uniform in ±1/√in, PEFT's kaiming-uniform with
//! a = √5; B = 0, so the first step's loss is the base model's), or read from `--lora-init` (a
//! file or a PEFT adapter directory, in PEFT's names or the short ones).

use super::checkpoint::{ADAPTER_CONFIG, ADAPTER_MODEL};
use super::peft::{short_name, tensor_name};
use super::{LoraConfig, Target};
use crate::config::GptConfig;
use crate::error::{Result, TrainError};
use crate::params::Spec;
use crate::weights::{read_f32_tensors, HostTensor};
use std::collections::BTreeMap;
use std::path::Path;

/// Seeded adapters of `cfg` (from `seed`; the stream is fastrand's wyrand, not PyTorch's).
pub fn seeded(lora: &LoraConfig, cfg: &GptConfig, seed: u64) -> Vec<Vec<f32>> {
    let mut rng = fastrand::Rng::with_seed(seed);
    lora.specs(cfg)
        .iter()
        .map(|s| {
            let len = s.shape.iter().product();
            if s.name.ends_with(".lora_A") {
                // A is [r, in]: bound 1/√in (kaiming-uniform with a = √5 on fan_in = in).
                let bound = 1.0 / (s.shape[1] as f64).sqrt();
                (0..len)
                    .map(|_| ((2.0 * rng.f64() - 1.0) * bound) as f32)
                    .collect()
            } else {
                vec![0.0; len]
            }
        })
        .collect()
}

/// Read every adapter of `lora` from `path`: a safetensors file, or a directory PEFT's
/// `save_pretrained` wrote (its `adapter_model.safetensors`). An `adapter_config.json` beside the
/// file is checked against the flags ([`super::peft::check_config`]). An adapter missing,
/// misshapen (another rank or module size), non-finite, or a tensor that is no adapter of these
/// flags is an error naming the file and the tensor. Names are PEFT's
/// (`base_model.model.transformer.h.0.attn.c_attn.lora_A.weight`) or the short ones
/// (`h.0.attn.c_attn.lora_A`).
pub fn load(path: &Path, lora: &LoraConfig, cfg: &GptConfig) -> Result<Vec<Vec<f32>>> {
    let file = if path.is_dir() {
        path.join(ADAPTER_MODEL)
    } else {
        path.to_path_buf()
    };
    if file.file_name().is_some_and(|n| n == ADAPTER_MODEL) {
        let config = file.with_file_name(ADAPTER_CONFIG);
        if config.exists() {
            super::peft::check_config(&config, lora)?;
        }
    }
    let tensors = read_f32_tensors(&file)?;
    take_adapters(&file, tensors, "", &lora.specs(cfg), lora)
}

/// Take `prefix` + each spec's name out of `tensors` (checked as [`load`] says); anything left
/// over is an error.
pub fn take_adapters(
    path: &Path,
    tensors: BTreeMap<String, HostTensor>,
    prefix: &str,
    specs: &[Spec],
    lora: &LoraConfig,
) -> Result<Vec<Vec<f32>>> {
    let mut by_short: BTreeMap<String, (String, HostTensor)> = BTreeMap::new();
    for (name, t) in tensors {
        let key = short_name(&name).to_string();
        if by_short.contains_key(&key) {
            return Err(TrainError::file(
                path,
                format!("tensor `{key}` is present twice (with and without a prefix)"),
            ));
        }
        by_short.insert(key, (name, t));
    }
    let targets: Vec<&str> = lora.targets.iter().map(|t| t.name()).collect();
    let mut out = Vec::with_capacity(specs.len());
    for s in specs {
        let want = format!("{prefix}{}", s.name);
        let Some((stored, (shape, data))) = by_short.remove(&want) else {
            return Err(TrainError::file(
                path,
                format!(
                    "tensor `{want}`{} (shape {:?}) is missing; --lora-rank {} --lora-targets {} \
                     need it",
                    if prefix.is_empty() {
                        format!(" (PEFT's name: `{}`)", tensor_name(&want))
                    } else {
                        String::new()
                    },
                    s.shape,
                    lora.rank,
                    targets.join(",")
                ),
            ));
        };
        if shape != s.shape {
            let rank_note =
                if shape.len() == 2 && (shape[0] != s.shape[0] || shape[1] != s.shape[1]) {
                    let r = if want.ends_with("lora_A") {
                        shape[0]
                    } else {
                        shape[1]
                    };
                    format!(" (rank {r} where --lora-rank is {})", lora.rank)
                } else {
                    String::new()
                };
            return Err(TrainError::file(
                path,
                format!(
                    "tensor `{stored}` has shape {shape:?}, expected {:?}{rank_note}",
                    s.shape
                ),
            ));
        }
        if let Some(i) = data.iter().position(|x| !x.is_finite()) {
            return Err(TrainError::file(
                path,
                format!("tensor `{stored}` holds {} at flat index {i}", data[i]),
            ));
        }
        out.push(data);
    }
    if let Some((key, (stored, _))) = by_short.into_iter().next() {
        let why = match key
            .strip_prefix(prefix)
            .and_then(|k| k.strip_prefix("h."))
            .and_then(|k| k.split_once('.'))
            .map(|(_, rest)| rest.rsplit_once('.').map_or(rest, |(m, _)| m))
            .and_then(Target::parse)
        {
            Some(t) if !lora.targets.contains(&t) => format!(
                "module {} is not in --lora-targets {}",
                t.name(),
                targets.join(",")
            ),
            _ => "not an adapter of this model and these flags".into(),
        };
        return Err(TrainError::file(
            path,
            format!("unexpected tensor `{stored}` ({why})"),
        ));
    }
    Ok(out)
}
