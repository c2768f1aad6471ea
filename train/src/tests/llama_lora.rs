//! LoRA on the tiny qwen2 of tests/data/train_llama: all seven targets started from a
//! PEFT-saved adapter (`peft/`), against PEFT + transformers float64 figures
//! (`ref_qwen2_lora.jsonl`, tools/train_ref_llama.py), and the adapters' flags and files.

use super::llama_files::llama_dir;
use super::llama_train::{compare, variant, LOSS_RTOL_CPU};
use super::{args_with, strs};
use crate::cli::Args;

/// The `qwen2_lora` variant's args, `--lora-init` resolved to the committed PEFT adapter, with
/// `extra` flags appended.
pub(super) fn lora_args(extra: &[String]) -> Args {
    let (mut flags, model, data) = variant("qwen2_lora");
    let peft = llama_dir().join("peft").display().to_string();
    for f in flags.iter_mut().filter(|f| f.as_str() == "peft") {
        f.clone_from(&peft);
    }
    flags.extend(extra.iter().cloned());
    args_with(&model, &data, &flags)
}

#[test]
fn lora_on_seven_targets_from_peft_matches_peft_on_the_cpu() {
    let ours = crate::train::run(&lora_args(&[])).unwrap();
    assert_eq!(ours.len(), 10);
    compare(&ours, "qwen2_lora", LOSS_RTOL_CPU);
}

#[test]
fn lora_flags_of_another_family_are_refused() {
    let e = crate::train::run(&lora_args(&strs(&["--lora-targets", "attn.c_attn"])))
        .unwrap_err()
        .to_string();
    assert!(e.contains("`attn.c_attn` is not a target"), "{e}");
    // The PEFT file's adapter_config.json disagrees with a smaller target list.
    let e = crate::train::run(&lora_args(&strs(&["--lora-targets", "q_proj,v_proj"])))
        .unwrap_err()
        .to_string();
    assert!(e.contains("adapter_config.json"), "{e}");
}
