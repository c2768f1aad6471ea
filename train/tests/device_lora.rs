//! The device allocator's figures (`mem_allocated`, `mem_peak`) of LoRA against full fine-tuning
//! of the same tiny model, in a test binary of its own: the figures are the whole process's, and
//! the library's device tests run in parallel. On hip-emu (CI) these are emulated figures: the
//! bytes the trainer asks the caching allocator for, not a GPU's behaviour.
#![cfg(feature = "device")]

use clap::Parser;
use hipk_train::cli::Args;
use hipk_train::train::{run, StepLog};
use std::path::PathBuf;

fn data() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/train_gpt2")
}

fn run_with(extra: &[&str]) -> Vec<StepLog> {
    let d = data();
    let mut argv: Vec<String> = vec!["train_gpt2".into(), "--model".into()];
    argv.push(d.join("model").display().to_string());
    argv.push("--data".into());
    argv.push(d.join("tokens.bin").display().to_string());
    for a in [
        "--device", "0", "--seq", "16", "--batch", "4", "--steps", "2", "--lr", "1e-2",
    ] {
        argv.push(a.into());
    }
    argv.extend(extra.iter().map(|s| s.to_string()));
    run(&Args::try_parse_from(argv).expect("flags")).expect("the run")
}

#[test]
fn lora_allocates_less_than_full_fine_tuning() {
    // Sequential in this process: each run's buffers are freed (to the allocator's cache) before
    // the next starts, so `allocated` and `peak` are that run's.
    let full = run_with(&[]);
    let lora = run_with(&[
        "--lora-rank",
        "4",
        "--lora-targets",
        "attn.c_attn,attn.c_proj,mlp.c_fc,mlp.c_proj",
    ]);
    let (f, l) = (
        full[1].mem.expect("device figures"),
        lora[1].mem.expect("device figures"),
    );
    println!(
        "emulated (hip-emu), tiny model f32, after step 2: full fine-tuning allocated {} B, \
         peak {} B; LoRA r=4 on 4 targets allocated {} B, peak {} B",
        f.allocated, f.peak, l.allocated, l.peak
    );
    // Full fine-tuning holds a gradient and two f32 moments per base parameter (12 B each:
    // 29,568 parameters); LoRA holds a copy, gradient and two moments per adapter parameter
    // (16 B each: 4,096) and its saved x @ Aᵀ products (8 modules × 64 rows × 4 × 4 B). The
    // allocator rounds blocks up, so the saving must reach 90% of that arithmetic.
    let expected = 12 * 29_568u64 - 16 * 4_096 - 8 * 64 * 4 * 4;
    let saved = f.allocated.saturating_sub(l.allocated);
    println!("saved {saved} B; by arithmetic {expected} B");
    assert!(l.peak < f.peak, "{l:?} vs {f:?}");
    assert!(
        saved * 10 >= expected * 9,
        "saved {saved} B, arithmetic {expected} B"
    );
}
