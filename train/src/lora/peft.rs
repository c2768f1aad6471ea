//! PEFT's spelling of GPT-2 adapters, so that `peft.PeftModel.from_pretrained` reads what the
//! trainer writes and `--lora-init` / `--resume` read what PEFT writes.
//!
//! PEFT saves the adapters of `GPT2LMHeadModel` as
//! `base_model.model.transformer.h.{l}.{t}.lora_A.weight` `[r, in]` and `….lora_B.weight`
//! `[out, r]`: for GPT-2's Conv1D (`fan_in_fan_out` true) its `lora_A` / `lora_B` are
//! `nn.Linear(in, r)` / `nn.Linear(r, out)`, whose weights have exactly the shapes of the short
//! names `h.{l}.{t}.lora_A` / `lora_B` used inside the trainer. Files are written in PEFT's names;
//! both spellings are read.

use super::{LoraConfig, Target};
use crate::error::{read_regular, Result, TrainError};
use serde_json::{json, Value};
use std::path::Path;

/// What PEFT puts before an adapter's short name in `adapter_model.safetensors` of GPT-2.
pub const PREFIX: &str = "base_model.model.transformer.";
/// What PEFT puts after it.
pub const SUFFIX: &str = ".weight";

/// PEFT's name of the adapter called `short` (`h.0.attn.c_attn.lora_A` →
/// `base_model.model.transformer.h.0.attn.c_attn.lora_A.weight`).
pub fn tensor_name(short: &str) -> String {
    format!("{PREFIX}{short}{SUFFIX}")
}

/// The short name of a stored tensor, in either spelling (PEFT's prefixes and `.weight` removed;
/// a short name is returned as it is).
pub fn short_name(stored: &str) -> &str {
    let n = stored.strip_prefix("base_model.model.").unwrap_or(stored);
    let n = n.strip_prefix("transformer.").unwrap_or(n);
    n.strip_suffix(SUFFIX).unwrap_or(n)
}

/// `adapter_config.json` for adapters `lora` trained on `--model base_model`: the keys PEFT's
/// `LoraConfig` needs to rebuild the same adapters on transformers' `GPT2LMHeadModel`.
pub fn config(lora: &LoraConfig, base_model: &Path) -> Value {
    json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model.display().to_string(),
        "r": lora.rank,
        "lora_alpha": lora.alpha,
        "target_modules": lora.targets.iter().map(|t| t.name()).collect::<Vec<_>>(),
        "lora_dropout": 0.0,
        "bias": "none",
        // GPT-2's modules are Conv1D (weights [in, out]).
        "fan_in_fan_out": true,
        "use_rslora": false,
        "use_dora": false,
        "inference_mode": true,
        "init_lora_weights": true,
        "modules_to_save": null,
        "layers_to_transform": null,
        "rank_pattern": {},
        "alpha_pattern": {},
    })
}

/// The targets a PEFT `target_modules` entry selects: PEFT matches a module whose name equals
/// the entry or ends with `.` + entry (`c_attn` and `attn.c_attn` select `attn.c_attn`,
/// `c_proj` both projections).
fn targets_of(entry: &str) -> Vec<Target> {
    Target::ALL
        .into_iter()
        .filter(|t| {
            let full = t.name();
            full == entry || full.ends_with(&format!(".{entry}"))
        })
        .collect()
}

/// Check the `adapter_config.json` at `path` against the flags `lora`: `r`, `lora_alpha` and the
/// targets must agree, and no PEFT option this trainer does not implement may be on (rsLoRA's
/// scale, DoRA, trained biases, per-layer or per-module ranks). Errors name the file, the key and
/// the flags to give.
pub fn check_config(path: &Path, lora: &LoraConfig) -> Result<()> {
    let raw: Value = serde_json::from_slice(&read_regular(path, 1 << 20)?)
        .map_err(|e| TrainError::file(path, format!("is not valid JSON: {e}")))?;
    let bad = |m: String| Err(TrainError::file(path, m));
    if let Some(kind) = raw.get("peft_type").and_then(Value::as_str) {
        if kind != "LORA" {
            return bad(format!(
                "has peft_type `{kind}`; only LORA adapters are read"
            ));
        }
    }
    let r = raw.get("r").and_then(Value::as_u64);
    let alpha = raw.get("lora_alpha").and_then(Value::as_f64);
    let entries: Option<Vec<&str>> = raw
        .get("target_modules")
        .and_then(Value::as_array)
        .and_then(|a| a.iter().map(Value::as_str).collect());
    let (Some(r), Some(alpha), Some(entries)) = (r, alpha, entries) else {
        return bad(
            "needs `r` (an integer), `lora_alpha` (a number) and `target_modules` (a list of \
             module names)"
                .into(),
        );
    };
    let truthy = |k: &str| raw.get(k).is_some_and(|v| v.as_bool() == Some(true));
    let nonempty = |k: &str| {
        raw.get(k).is_some_and(|v| match v {
            Value::Null => false,
            Value::Object(m) => !m.is_empty(),
            Value::Array(a) => !a.is_empty(),
            _ => true,
        })
    };
    for (key, on) in [
        ("use_rslora", truthy("use_rslora")),
        ("use_dora", truthy("use_dora")),
        ("layers_to_transform", nonempty("layers_to_transform")),
        ("rank_pattern", nonempty("rank_pattern")),
        ("alpha_pattern", nonempty("alpha_pattern")),
        ("modules_to_save", nonempty("modules_to_save")),
        ("exclude_modules", nonempty("exclude_modules")),
        ("layer_replication", nonempty("layer_replication")),
        (
            "trainable_token_indices",
            nonempty("trainable_token_indices"),
        ),
        ("target_parameters", nonempty("target_parameters")),
        ("lora_bias", truthy("lora_bias")),
        ("use_qalora", truthy("use_qalora")),
    ] {
        if on {
            return bad(format!(
                "sets `{key}`, which this trainer does not implement (plain LoRA only: scale \
                 lora_alpha / r on every layer of the target modules)"
            ));
        }
    }
    if let Some(b) = raw.get("bias").and_then(Value::as_str) {
        if b != "none" {
            return bad(format!(
                "has bias `{b}`; only `none` is read (the base biases stay frozen)"
            ));
        }
    }
    let mut targets = Vec::new();
    for e in &entries {
        let hit = targets_of(e);
        if hit.is_empty() {
            let all: Vec<_> = Target::ALL.iter().map(|t| t.name()).collect();
            return bad(format!(
                "target_modules entry `{e}` selects none of GPT-2's adaptable modules ({})",
                all.join(", ")
            ));
        }
        targets.extend(hit);
    }
    targets.sort();
    targets.dedup();
    if r != lora.rank as u64 || alpha != lora.alpha || targets != lora.targets {
        let names = |t: &[Target]| t.iter().map(|t| t.name()).collect::<Vec<_>>().join(",");
        return bad(format!(
            "the adapters have r = {r}, lora_alpha = {alpha}, target_modules = {}; run with \
             --lora-rank {r} --lora-alpha {alpha} --lora-targets {} (the flags give {} / {} / {})",
            entries.join(","),
            names(&targets),
            lora.rank,
            lora.alpha,
            names(&lora.targets)
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_spellings_have_one_short_name() {
        let short = "h.1.mlp.c_fc.lora_B";
        let peft = tensor_name(short);
        assert_eq!(
            peft,
            "base_model.model.transformer.h.1.mlp.c_fc.lora_B.weight"
        );
        assert_eq!(short_name(&peft), short);
        assert_eq!(short_name(short), short);
    }

    #[test]
    fn peft_target_entries_select_by_suffix() {
        assert_eq!(targets_of("c_attn"), [Target::CAttn]);
        assert_eq!(targets_of("attn.c_attn"), [Target::CAttn]);
        assert_eq!(targets_of("c_proj"), [Target::AttnProj, Target::MlpProj]);
        assert!(targets_of("q_proj").is_empty());
    }
}
