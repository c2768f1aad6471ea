//! The table of docs/MEMORY.md (and the README): 6B–9B fine-tunes on 8 DCU cards, computed
//! by [`super::estimate`] from the configs in tests/data/memory (ChatGLM3-6B's and
//! GLM-4-9B-chat's own THUDM configs in the `chatglm` layout).

use super::estimate::{estimate, LoraPlan, Settings, Shape, DEFAULT_BUCKET_ELEMS};
use crate::cli::Precision;
use crate::config::ModelConfig;
use crate::error::{Result, TrainError};
use crate::llama::{Family, Linear, LlamaConfig};
use std::path::Path;

/// `(label, cards' memory in GiB)` of the two DCU cards the table is for.
pub const CARDS: [(&str, u64); 2] = [("K100_AI 64 GB", 64), ("Z100 32 GB", 32)];

/// The settings rows, cheapest first: `(label, zero, grad_checkpoint, offload, planned)`.
const FULL_ROWS: [(&str, u8, bool, bool, bool); 4] = [
    ("zero 1", 1, false, false, false),
    ("zero 2 (planned)", 2, false, false, true),
    ("zero 2 + grad-checkpoint (planned)", 2, true, false, true),
    (
        "zero 2 + grad-checkpoint + offload cpu (planned)",
        2,
        true,
        true,
        true,
    ),
];
const LORA_ROWS: [(&str, u8, bool, bool, bool); 2] = [
    ("zero 0", 0, false, false, false),
    ("zero 0 + grad-checkpoint (planned)", 0, true, false, true),
];

fn llama(dir: &Path) -> Result<LlamaConfig> {
    match ModelConfig::load(&dir.join("config.json"))? {
        ModelConfig::Llama(c) => Ok(c),
        ModelConfig::Gpt2(_) => Err(TrainError::file(dir, "is not a LLaMA-family config")),
    }
}

/// The markdown table for the models under `dir` (tests/data/memory): bf16, batch 1 × seq 1024
/// per rank, 8 ranks; LoRA r=8 on q, k and v (the GLM family: on the fused `query_key_value`,
/// LLaMA-Factory's default, one adapter over q|k|v); a GPU's allocator (no hip-emu guard byte).
pub fn markdown(dir: &Path) -> Result<String> {
    let models = [
        ("Qwen2-7B", "qwen2-7b"),
        ("Llama-2-7B", "llama-2-7b"),
        ("ChatGLM3-6B", "chatglm3-6b"),
        ("GLM-4-9B", "glm-4-9b"),
    ];
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let mut s = String::from(
        "| model | training | settings | peak per rank (GiB) | needs per card (GiB) | K100_AI 64 GB | Z100 32 GB |\n\
         |---|---|---|---:|---:|---|---|\n",
    );
    let mut cheapest = String::new();
    for (name, sub) in models {
        let cfg = llama(&dir.join(sub))?;
        // chatglm's query_key_value is keyed by q and spans q|k|v (crate::glm::lora).
        let (targets, lora_label): (&[Linear], &str) = match cfg.family {
            Family::ChatGlm => (&[Linear::Q], "LoRA r=8 (query_key_value)"),
            _ => (&[Linear::Q, Linear::K, Linear::V], "LoRA r=8 (q,k,v)"),
        };
        let lora = LoraPlan {
            rank: 8,
            modules: targets
                .iter()
                .map(|&l| {
                    let site = crate::llama::lora::site(&cfg, l);
                    (site.inputs, site.outputs)
                })
                .collect(),
        };
        for (training, rows, plan) in [
            ("full", &FULL_ROWS[..], None),
            (lora_label, &LORA_ROWS[..], Some(lora)),
        ] {
            let mut first_fit = [None; 2];
            for &(label, zero, ckpt, offload, _) in rows {
                let set = Settings {
                    dtype: Precision::Bf16,
                    batch: 1,
                    seq: 1024,
                    grad_accum: 1,
                    world: 8,
                    zero,
                    lora: plan.clone(),
                    grad_checkpoint: ckpt,
                    offload,
                    bucket_elems: DEFAULT_BUCKET_ELEMS,
                    guard_slack: 0,
                };
                let e = estimate(Shape::Llama(&cfg), &set);
                let fits: Vec<&str> = CARDS
                    .iter()
                    .enumerate()
                    .map(|(k, &(_, g))| {
                        let ok = e.needs() <= g << 30;
                        if ok && first_fit[k].is_none() {
                            first_fit[k] = Some(label);
                        }
                        if ok {
                            "fits"
                        } else {
                            "no"
                        }
                    })
                    .collect();
                s += &format!(
                    "| {name} | {training} | {label} | {:.1} | {:.1} | {} | {} |\n",
                    gib(e.peak()),
                    gib(e.needs()),
                    fits[0],
                    fits[1]
                );
            }
            for (k, (card, _)) in CARDS.iter().enumerate() {
                cheapest += &format!(
                    "- {name}, {training}, {card}: {}\n",
                    first_fit[k].unwrap_or("none of these fits")
                );
            }
        }
    }
    Ok(format!(
        "{s}\nCheapest setting that fits (first in the order above):\n\n{cheapest}"
    ))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    fn root() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    #[test]
    fn the_table_in_docs_memory_is_the_estimators() {
        let table = super::markdown(&root().join("tests/data/memory")).unwrap();
        println!("{table}");
        let doc = std::fs::read_to_string(root().join("docs/MEMORY.md")).unwrap();
        assert!(
            doc.contains(&table),
            "docs/MEMORY.md does not hold the estimator's table; paste the printed one"
        );
    }
}
