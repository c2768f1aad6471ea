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
        false,
        true,
        false,
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
fn lora_with_zero_1_is_a_usage_error_naming_the_flag() {
    // As GPT-2's LoRA: ZeRO shards optimizer state of the base, which LoRA does not have.
    let e = crate::train::run(&lora_args(&strs(&["--devices", "0,1", "--zero", "1"]))).unwrap_err();
    assert!(matches!(e, crate::error::TrainError::Usage(_)), "{e}");
    assert!(e.to_string().contains("--zero 1 with --lora-rank 4"), "{e}");
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

/// The `qwen2_lora` variant's args without `--lora-init` (the adapters come from `--resume
/// dir`), with `extra` flags appended.
fn resume_args(dir: &std::path::Path, extra: &[&str]) -> Args {
    let (flags, model, data) = variant("qwen2_lora");
    let at = flags.iter().position(|f| f == "--lora-init").unwrap();
    let mut flags: Vec<String> = [&flags[..at], &flags[at + 2..]].concat();
    flags.extend(strs(extra));
    flags.extend(["--resume".to_string(), dir.display().to_string()]);
    args_with(&model, &data, &flags)
}

#[test]
fn resume_of_a_bare_peft_directory_starts_at_step_1_from_its_adapters() {
    // `peft/` has adapter_config.json and adapter_model.safetensors only: the run is the one
    // --lora-init gives (fresh moments, the data from its start).
    let init = crate::train::run(&lora_args(&strs(&["--steps", "3"]))).unwrap();
    let resumed =
        crate::train::run(&resume_args(&llama_dir().join("peft"), &["--steps", "3"])).unwrap();
    assert_eq!(resumed.len(), 3);
    for (a, b) in init.iter().zip(&resumed) {
        assert_eq!((a.step, a.loss, a.grad_norm), (b.step, b.loss, b.grad_norm));
    }
    // Half a trainer checkpoint (the moments without trainer.json) is an error naming the file.
    let s = super::Scratch::new("llama-lora-half");
    let half = s.path("step_4");
    std::fs::create_dir_all(&half).unwrap();
    for f in ["adapter_config.json", "adapter_model.safetensors"] {
        std::fs::copy(llama_dir().join("peft").join(f), half.join(f)).unwrap();
    }
    std::fs::write(half.join("optimizer.safetensors"), b"").unwrap();
    let e = crate::train::run(&resume_args(&half, &["--steps", "3"]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("trainer.json"), "{e}");
}

#[test]
fn a_checkpoint_whose_adapters_peft_rewrote_resumes() {
    // `peft_resaved/`: the trainer's step_4 of `--steps 6`, its adapter files then rewritten by
    // PEFT (PeftModel.from_pretrained + save_pretrained; tools/peft_resave_llama.py): another
    // header order and PEFT's own adapter_config.json (and README.md).
    let dir = llama_dir().join("peft_resaved");
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("adapter_config.json")).unwrap()).unwrap();
    assert!(cfg.get("peft_version").is_some(), "not PEFT's config");
    assert!(dir.join("README.md").is_file());
    let full = crate::train::run(&lora_args(&strs(&["--steps", "6"]))).unwrap();
    let resumed = crate::train::run(&resume_args(&dir, &["--steps", "6"])).unwrap();
    assert_eq!(resumed.len(), 2);
    // The fixture was written by this trainer (equal to the bit when made); the tolerance lets
    // a later change of summation order pass.
    for (a, b) in full[4..].iter().zip(&resumed) {
        assert_eq!(a.step, b.step);
        assert!(
            rel(b.loss, a.loss) <= LOSS_RTOL_CPU,
            "step {}: {} vs {}",
            a.step,
            b.loss,
            a.loss
        );
    }
}

#[test]
fn merge_on_save_writes_w_plus_scaled_ba_and_gives_the_next_loss() {
    let s = super::Scratch::new("llama-lora-merge");
    let ck = s.path("ck");
    let dir = ck.to_str().unwrap();
    let run = crate::train::run(&lora_args(&strs(&[
        "--steps",
        "5",
        "--checkpoint-dir",
        dir,
        "--save-every",
        "4",
        "--merge-on-save",
    ])))
    .unwrap();
    let step4 = ck.join("step_4");
    let (_, model, data) = variant("qwen2_lora");
    let cfg = match crate::config::ModelConfig::load(&model.join("config.json")).unwrap() {
        crate::config::ModelConfig::Llama(c) => c,
        crate::config::ModelConfig::Gpt2(_) => panic!("not a llama"),
    };
    let written: serde_json::Value =
        serde_json::from_slice(&std::fs::read(step4.join("config.json")).unwrap()).unwrap();
    assert_eq!(written, cfg.raw);
    // Every weight: the base, plus for the seven targets (alpha / r = 8 / 4)·B·A in f64.
    let base = crate::llama::weights::load(&model, &cfg).unwrap();
    let layout = crate::llama::Layout::new(&cfg);
    let merged = crate::weights::read_f32_tensors(&step4.join("model.safetensors")).unwrap();
    let ad = crate::weights::read_f32_tensors(&step4.join("adapter_model.safetensors")).unwrap();
    assert_eq!(merged.len(), layout.specs.len());
    let mut adapted = 0;
    for (spec, w) in layout.specs.iter().zip(&base) {
        let (shape, got) = &merged[&spec.name];
        assert_eq!(shape, &spec.shape, "{}", spec.name);
        let stem = spec.name.strip_suffix(".weight").unwrap_or("");
        let key = |m: &str| format!("base_model.model.{stem}.{m}.weight");
        let Some((a, b)) = ad.get(&key("lora_A")).zip(ad.get(&key("lora_B"))) else {
            assert_eq!(got, w, "{} is not adapted and must be the base", spec.name);
            continue;
        };
        adapted += 1;
        let (n_out, n_in, r) = (spec.shape[0], spec.shape[1], a.0[0]);
        for row in 0..n_out {
            for col in 0..n_in {
                let ba: f64 = (0..r)
                    .map(|k| f64::from(b.1[row * r + k]) * f64::from(a.1[k * n_in + col]))
                    .sum();
                let want = f64::from(w[row * n_in + col]) + 2.0 * ba;
                let g = f64::from(got[row * n_in + col]);
                // One rounding to f32: half an ulp.
                assert!(
                    (g - want).abs() <= want.abs() * f64::from(f32::EPSILON) / 2.0,
                    "{}[{row}, {col}]: {g} vs {want}",
                    spec.name
                );
            }
        }
    }
    assert_eq!(adapted, 2 * 7);
    // The merged model (a full fine-tuning --model) on step 5's batch gives the adapter run's
    // step-5 loss: the loss is taken before the update.
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(step4.join("trainer.json")).unwrap()).unwrap();
    let args = args_with(
        &step4,
        &data,
        &strs(&["--batch", "4", "--seq", "16", "--steps", "1"]),
    );
    let mut setup = crate::llama::train::setup(&args, cfg, 1).unwrap();
    if let crate::llama::train::Source::Stream { loader, .. } = &mut setup.source {
        loader.pos = state["loader_pos"].as_u64().unwrap() as usize;
    }
    let out = crate::llama::train::train_as(
        &crate::cpu_backend::Cpu,
        &args,
        setup,
        crate::train::Role::SINGLE,
        false,
    )
    .unwrap();
    let (m, a) = (out.logs[0].loss, run[4].loss);
    assert!(
        rel(m, a) <= LOSS_RTOL_CPU,
        "merged {m} vs adapters {a} on step 5"
    );
    // tools/lora_files_llama.py: transformers (float64) on the merged checkpoint and PEFT on
    // base + adapters give the trainer's step-5 loss; the trainer gives it again now.
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(llama_dir().join("merged.json")).unwrap()).unwrap();
    let r = &v["qwen2_lora"];
    let hf = r["merged_transformers_loss"].as_f64().unwrap();
    let peft = r["peft_loss"].as_f64().unwrap();
    let then = r["trainer_loss"].as_f64().unwrap();
    assert!(rel(hf, peft) <= LOSS_RTOL_CPU, "merged {hf} vs PEFT {peft}");
    assert!(
        rel(then, hf) <= LOSS_RTOL_CPU,
        "trainer {then} vs merged {hf}"
    );
    assert!(rel(a, hf) <= LOSS_RTOL_CPU, "step 5 now {a} vs merged {hf}");
}
