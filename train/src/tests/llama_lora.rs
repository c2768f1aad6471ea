//! LoRA on the tiny qwen2 of tests/data/train_llama: all seven targets started from a
//! PEFT-saved adapter (`peft/`), against PEFT + transformers float64 figures
//! (`ref_qwen2_lora.jsonl`, tools/train_ref_llama.py), and the adapters' flags and files.

use super::llama_files::llama_dir;
use super::llama_train::{compare, rel, variant, LOSS_RTOL_CPU};
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
    assert!(
        e.contains("`attn.c_attn` is not a target of this model"),
        "{e}"
    );
    // The PEFT file's adapter_config.json disagrees with a smaller target list.
    let e = crate::train::run(&lora_args(&strs(&["--lora-targets", "q_proj,v_proj"])))
        .unwrap_err()
        .to_string();
    assert!(e.contains("adapter_config.json"), "{e}");
}

#[test]
fn a_lora_checkpoint_is_a_peft_adapter_that_lora_init_reads() {
    let s = super::Scratch::new("llama-lora-save");
    let ck = s.path("ck");
    let dir = ck.to_str().unwrap();
    let run = crate::train::run(&lora_args(&strs(&[
        "--steps",
        "4",
        "--checkpoint-dir",
        dir,
        "--save-every",
        "4",
    ])))
    .unwrap();
    let step4 = ck.join("step_4");
    for f in [
        "adapter_model.safetensors",
        "adapter_config.json",
        "optimizer.safetensors",
        "trainer.json",
    ] {
        assert!(step4.join(f).is_file(), "{f}");
    }
    assert!(!step4.join("model.safetensors").exists());
    let t = crate::weights::read_f32_tensors(&step4.join("adapter_model.safetensors")).unwrap();
    // 2 layers × 7 targets × (A, B), in PEFT's names and Linear layout.
    assert_eq!(t.len(), 28);
    let a = &t["base_model.model.model.layers.1.self_attn.k_proj.lora_A.weight"];
    let b = &t["base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight"];
    assert_eq!(
        (a.0.as_slice(), b.0.as_slice()),
        (&[4, 32][..], &[8, 4][..])
    );
    let c: serde_json::Value =
        serde_json::from_slice(&std::fs::read(step4.join("adapter_config.json")).unwrap()).unwrap();
    assert_eq!(c["peft_type"], "LORA");
    assert_eq!(c["r"], 4);
    assert_eq!(c["lora_alpha"], 8.0);
    assert_eq!(c["fan_in_fan_out"], false);
    assert_eq!(c["target_modules"].as_array().unwrap().len(), 7);
    // The saved adapters start a run: its first loss is not the PEFT file's first loss (the
    // adapters trained 4 steps) and the run proceeds.
    let again = crate::train::run(&lora_args(&strs(&[
        "--steps",
        "1",
        "--lora-init",
        step4.to_str().unwrap(),
    ])))
    .unwrap();
    assert!(again[0].loss.is_finite());
    assert_ne!(again[0].loss, run[0].loss);
}

#[test]
fn bf16_lora_keeps_the_base_in_16_bits_and_stays_near_f32() {
    // The frozen bf16 base: no f32 master copy, no moments, no 2-D gradient buffers.
    let (_, model, _) = variant("qwen2_lora");
    let cfg = match crate::config::ModelConfig::load(&model.join("config.json")).unwrap() {
        crate::config::ModelConfig::Llama(c) => c,
        crate::config::ModelConfig::Gpt2(_) => panic!("not a llama"),
    };
    let params = crate::llama::params::Trained::new(&cfg)
        .fuse(&crate::llama::weights::load(&model, &cfg).unwrap());
    let none: Vec<Vec<f32>> = params.iter().map(|_| Vec::new()).collect();
    let frozen = crate::llama::model::Llama::<half::bf16, crate::cpu_backend::Cpu>::new(
        &crate::cpu_backend::Cpu,
        &cfg,
        [&params, &none, &none],
        [4, 16],
        0,
        true,
    )
    .unwrap();
    assert!(frozen.master.is_none());
    assert!(frozen.exp_avg.iter().all(Vec::is_empty));
    let big: usize = frozen.grads.iter().filter(|g| g.len() >= 32 * 32).count();
    assert_eq!(big, 0, "a 2-D weight has a gradient buffer");

    let f32_run = crate::train::run(&lora_args(&strs(&["--steps", "3"]))).unwrap();
    let bf16 = crate::train::run(&lora_args(&strs(&["--steps", "3", "--dtype", "bf16"]))).unwrap();
    for (a, b) in f32_run.iter().zip(&bf16) {
        let rel = rel(b.loss, a.loss);
        assert!(
            rel <= 2e-2,
            "step {}: bf16 {} vs f32 {}",
            a.step,
            b.loss,
            a.loss
        );
    }
}

#[test]
fn peft_loads_our_adapters_and_gives_the_next_step_loss() {
    // tools/hf_interop_llama.py: PEFT's loss (PeftModel.from_pretrained on the base, float64)
    // of step 5's batch with the trainer's step_4 adapters, and the trainer's step-5 loss.
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(llama_dir().join("interop.json")).unwrap()).unwrap();
    let r = &v["qwen2_lora"];
    let hf = r["transformers_loss"].as_f64().unwrap();
    let ours = r["trainer_loss"].as_f64().unwrap();
    assert!(rel(hf, ours) <= LOSS_RTOL_CPU, "PEFT {hf} vs {ours}");
    let now = crate::train::run(&lora_args(&strs(&["--steps", "5"]))).unwrap()[4].loss;
    assert!(
        rel(now, hf) <= LOSS_RTOL_CPU,
        "step 5 now {now} vs PEFT {hf}"
    );
}

#[test]
fn lora_flags_not_implemented_for_this_family_are_usage_errors() {
    let s = super::Scratch::new("llama-lora-refused");
    let ck = s.path("ck");
    let dir = ck.to_str().unwrap();
    for (extra, want) in [
        (
            strs(&[
                "--checkpoint-dir",
                dir,
                "--save-every",
                "2",
                "--merge-on-save",
            ]),
            "--merge-on-save",
        ),
        (strs(&["--devices", "0,1"]), "ranks"),
    ] {
        let e = crate::train::run(&lora_args(&extra)).unwrap_err();
        assert!(matches!(e, crate::error::TrainError::Usage(_)), "{e}");
        assert!(e.to_string().contains(want), "{e}");
    }
}

#[test]
fn a_resumed_lora_run_continues_bit_for_bit() {
    let s = super::Scratch::new("llama-lora-resume");
    let ck = s.path("ck");
    let dir = ck.to_str().unwrap();
    let save = strs(&["--checkpoint-dir", dir, "--save-every", "4", "--steps", "6"]);
    let full = crate::train::run(&lora_args(&save)).unwrap();
    // The same flags without --lora-init (the checkpoint holds the adapters).
    let (flags, model, data) = variant("qwen2_lora");
    let at = flags.iter().position(|f| f == "--lora-init").unwrap();
    let mut flags: Vec<String> = [&flags[..at], &flags[at + 2..]].concat();
    flags.extend(strs(&["--steps", "6", "--resume"]));
    flags.push(ck.join("step_4").display().to_string());
    let resumed = crate::train::run(&args_with(&model, &data, &flags)).unwrap();
    assert_eq!(resumed.len(), 2);
    for (a, b) in full[4..].iter().zip(&resumed) {
        assert_eq!((a.step, a.loss, a.grad_norm), (b.step, b.loss, b.grad_norm));
    }
}
