//! The table of docs/MEMORY.md (and the README): 6B–9B fine-tunes on 8 DCU cards, computed
//! by [`super::estimate`] from the configs in tests/data/memory (ChatGLM3-6B's and
//! GLM-4-9B-chat's own THUDM configs in the `chatglm` layout).

use super::estimate::{estimate, LoraPlan, Part, Settings, Shape, DEFAULT_BUCKET_ELEMS};
use crate::cli::Precision;
use crate::config::ModelConfig;
use crate::error::{Result, TrainError};
use crate::llama::{Family, Linear, LlamaConfig};
use std::path::Path;

/// `(label, cards' memory in GiB)` of the two DCU cards the table is for.
pub const CARDS: [(&str, u64); 2] = [("K100_AI 64 GB", 64), ("Z100 32 GB", 32)];

/// The settings rows, cheapest first: `(label, zero, grad_checkpoint, offload)`.
const FULL_ROWS: [(&str, u8, bool, bool); 5] = [
    ("zero 1", 1, false, false),
    ("zero 2", 2, false, false),
    ("zero 2 + grad-checkpoint", 2, true, false),
    ("zero 0 + grad-checkpoint + offload cpu", 0, true, true),
    ("zero 2 + grad-checkpoint + offload cpu", 2, true, true),
];
const LORA_ROWS: [(&str, u8, bool, bool); 2] = [
    ("zero 0", 0, false, false),
    ("zero 0 + grad-checkpoint", 0, true, false),
];

/// The models of the tables: `(name, directory under tests/data/memory)`.
const MODELS: [(&str, &str); 4] = [
    ("Qwen2-7B", "qwen2-7b"),
    ("Llama-2-7B", "llama-2-7b"),
    ("ChatGLM3-6B", "chatglm3-6b"),
    ("GLM-4-9B", "glm-4-9b"),
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
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let mut s = String::from(
        "| model | training | settings | peak per rank (GiB) | needs per card (GiB) | K100_AI 64 GB | Z100 32 GB |\n\
         |---|---|---|---:|---:|---|---|\n",
    );
    let mut cheapest = String::new();
    for (name, sub) in MODELS {
        let cfg = llama(&dir.join(sub))?;
        let lora = qkv_lora(&cfg);
        let lora_label = lora_label(&cfg);
        for (training, rows, plan) in [
            ("full", &FULL_ROWS[..], None),
            (lora_label, &LORA_ROWS[..], Some(lora)),
        ] {
            let mut first_fit = [None; 2];
            for &(label, zero, ckpt, offload) in rows {
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

/// LoRA r=8 on q, k and v.
fn qkv_lora(cfg: &LlamaConfig) -> LoraPlan {
    // chatglm's query_key_value is keyed by q and spans q|k|v (crate::glm::lora).
    let targets: &[Linear] = match cfg.family {
        Family::ChatGlm => &[Linear::Q],
        _ => &[Linear::Q, Linear::K, Linear::V],
    };
    LoraPlan {
        rank: 8,
        modules: targets
            .iter()
            .map(|&l| {
                let site = crate::llama::lora::site(cfg, l);
                (site.inputs, site.outputs)
            })
            .collect(),
    }
}

/// The checkpointing table's LoRA row label.
fn lora_label_zero0(cfg: &LlamaConfig) -> &'static str {
    match cfg.family {
        Family::ChatGlm => "LoRA r=8 (query_key_value), zero 0",
        _ => "LoRA r=8 (q,k,v), zero 0",
    }
}

/// The LoRA rows' label: the targets of [`qkv_lora`].
fn lora_label(cfg: &LlamaConfig) -> &'static str {
    match cfg.family {
        Family::ChatGlm => "LoRA r=8 (query_key_value)",
        _ => "LoRA r=8 (q,k,v)",
    }
}

/// What `--grad-checkpoint` saves on the models under `dir`, as a markdown table: the
/// estimator's activations and peak per rank without and with it (bf16, batch 1 × seq 1024, 8
/// ranks; full with `--zero 1`, LoRA r=8 on q, k, v with `--zero 0`).
pub fn checkpoint_markdown(dir: &Path) -> Result<String> {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let mut s = String::from(
        "| model | training | activations (GiB) | with --grad-checkpoint | peak per rank (GiB) | with --grad-checkpoint | peak drop |\n\
         |---|---|---:|---:|---:|---:|---:|\n",
    );
    let at = Part::ALL
        .iter()
        .position(|&p| p == Part::Activations)
        .unwrap_or(0);
    for (name, sub) in MODELS {
        let cfg = llama(&dir.join(sub))?;
        for (training, zero, lora) in [
            ("full, zero 1", 1, None),
            (lora_label_zero0(&cfg), 0, Some(qkv_lora(&cfg))),
        ] {
            let [plain, ckpt] = [false, true].map(|grad_checkpoint| {
                let set = Settings {
                    dtype: Precision::Bf16,
                    batch: 1,
                    seq: 1024,
                    grad_accum: 1,
                    world: 8,
                    zero,
                    lora: lora.clone(),
                    grad_checkpoint,
                    offload: false,
                    bucket_elems: DEFAULT_BUCKET_ELEMS,
                    guard_slack: 0,
                };
                estimate(Shape::Llama(&cfg), &set)
            });
            let drop = plain.peak().saturating_sub(ckpt.peak());
            s += &format!(
                "| {name} | {training} | {:.2} | {:.2} | {:.1} | {:.1} | {:.1} % |\n",
                gib(plain.parts[at]),
                gib(ckpt.parts[at]),
                gib(plain.peak()),
                gib(ckpt.peak()),
                100.0 * drop as f64 / plain.peak() as f64
            );
        }
    }
    Ok(s)
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

    #[test]
    fn the_checkpointing_table_in_docs_memory_is_the_estimators() {
        let table = super::checkpoint_markdown(&root().join("tests/data/memory")).unwrap();
        println!("{table}");
        let doc = std::fs::read_to_string(root().join("docs/MEMORY.md")).unwrap();
        assert!(
            doc.contains(&table),
            "docs/MEMORY.md does not hold the estimator's checkpointing table; paste the \
             printed one"
        );
    }
}
