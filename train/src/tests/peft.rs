//! LoRA files shared with PEFT (tests/data/train_gpt2/lora/peft.json and lora/peft/, made by
//! tools/peft_interop.py with transformers + PEFT in float64): a PEFT-saved adapter directory
//! trains here from the loss PEFT computes with it, the trainer's checkpoints carry exactly the
//! tensor names and shapes PEFT saves, and PEFT's loss with the trainer's step-3 adapters is the
//! loss the trainer logs at step 4. Both spellings of the names resume.

use super::lora::lora_dir;
use super::{data_dir, run_tiny, strs, Scratch};
use crate::train::StepLog;
use crate::weights::{read_f32_tensors, to_safetensors};
use serde_json::Value;
use std::path::Path;

/// The LoRA checks' tolerance against PEFT's float64 losses (as [`super::lora`]'s against the
/// float64 reference: the CPU backend rounds every op's output to f32).
const LOSS_RTOL: f64 = 1e-5;

fn figures() -> Value {
    serde_json::from_slice(&std::fs::read(lora_dir().join("peft.json")).unwrap()).unwrap()
}

/// The flags of tools/peft_interop.py's run, from `init` (its adapter directory by default).
fn flags(init: &Path, extra: &[&str]) -> Vec<String> {
    let mut f = strs(&[
        "--seq",
        "16",
        "--batch",
        "4",
        "--lr",
        "1e-2",
        "--lora-rank",
        "4",
        "--lora-alpha",
        "8",
        "--lora-targets",
        "attn.c_attn,attn.c_proj,mlp.c_fc,mlp.c_proj",
        "--lora-init",
    ]);
    f.push(init.display().to_string());
    f.extend(strs(extra));
    f
}

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs()
}

fn peft_dir() -> std::path::PathBuf {
    lora_dir().join("peft")
}

#[test]
fn a_peft_saved_adapter_trains_from_the_loss_peft_computes() {
    let want = figures()["peft_adapter_step1_loss"].as_f64().unwrap();
    let base: Value = serde_json::from_str(
        std::fs::read_to_string(data_dir().join("ref_base.jsonl"))
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    let base = base["loss"].as_f64().unwrap();
    // The directory save_pretrained wrote, and its adapter file alone.
    for init in [peft_dir(), peft_dir().join("adapter_model.safetensors")] {
        let ours = run_tiny(&flags(&init, &["--steps", "1"])).unwrap();
        let d = rel(ours[0].loss, want);
        println!(
            "--lora-init {}: step-1 loss {} vs PEFT's {want} (rel {d:.2e}; base model {base})",
            init.display(),
            ours[0].loss
        );
        assert!(d <= LOSS_RTOL, "{} vs {want}", ours[0].loss);
        // The adapters were read: the loss is not the base model's (5.8e-4 away, 58 times the
        // tolerance; a B read as zero would give the base model's loss).
        assert!(rel(ours[0].loss, base) > 10.0 * LOSS_RTOL);
    }
}

#[test]
fn checkpoints_carry_peft_names_and_give_peft_the_logged_loss() {
    let fig = figures();
    let s = Scratch::new("peft-ck");
    let ck = s.path("ck").display().to_string();
    let log = run_tiny(&flags(
        &peft_dir(),
        &["--steps", "4", "--checkpoint-dir", &ck, "--save-every", "3"],
    ))
    .unwrap();
    let step3 = s.path("ck/step_3");
    let written = read_f32_tensors(&step3.join("adapter_model.safetensors")).unwrap();
    let names: Vec<(String, Value)> = written
        .iter()
        .map(|(k, (shape, _))| (k.clone(), serde_json::json!(shape)))
        .collect();
    let peft: Vec<(String, Value)> = fig["peft_tensors"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    assert_eq!(names, peft, "the tensors PEFT saves for these adapters");
    let config: Value =
        serde_json::from_slice(&std::fs::read(step3.join("adapter_config.json")).unwrap()).unwrap();
    for (key, value) in [
        ("peft_type", serde_json::json!("LORA")),
        ("task_type", serde_json::json!("CAUSAL_LM")),
        ("r", serde_json::json!(4)),
        ("lora_alpha", serde_json::json!(8.0)),
        ("fan_in_fan_out", serde_json::json!(true)),
        ("bias", serde_json::json!("none")),
        ("use_rslora", serde_json::json!(false)),
    ] {
        assert_eq!(config[key], value, "adapter_config.json: {key}");
    }
    assert!(config["base_model_name_or_path"].is_string());
    // PEFT's loss of batch 4 with the step-3 adapters PeftModel.from_pretrained read from this
    // run (made by tools/peft_interop.py check) is the loss logged at step 4.
    let want = fig["trainer_step3_adapters_step4_loss"].as_f64().unwrap();
    let d = rel(log[3].loss, want);
    println!(
        "step 4: loss {} vs PEFT's with the step-3 adapters {want} (rel {d:.2e})",
        log[3].loss
    );
    assert!(d <= LOSS_RTOL, "{} vs {want}", log[3].loss);
}

fn bits(l: &StepLog) -> (u64, u64, u64) {
    (l.step, l.loss.to_bits(), l.grad_norm.to_bits())
}

#[test]
fn both_spellings_of_the_adapter_names_resume() {
    let s = Scratch::new("peft-spellings");
    let ck = s.path("ck").display().to_string();
    let full = run_tiny(&flags(
        &peft_dir(),
        &["--steps", "4", "--checkpoint-dir", &ck, "--save-every", "2"],
    ))
    .unwrap();
    let resume_flags = |dir: &Path| {
        let mut f = flags(&peft_dir(), &["--steps", "4", "--resume"]);
        f.push(dir.display().to_string());
        let i = f.iter().position(|x| x == "--lora-init").unwrap();
        f.drain(i..i + 2);
        f
    };
    let step2 = s.path("ck/step_2");
    let peft_named = run_tiny(&resume_flags(&step2)).unwrap();
    // The same checkpoint with the short names of earlier versions (`h.0.attn.c_attn.lora_A`).
    let file = step2.join("adapter_model.safetensors");
    let short: Vec<_> = read_f32_tensors(&file)
        .unwrap()
        .into_iter()
        .map(|(k, (shape, v))| (crate::lora::peft::short_name(&k).to_string(), shape, v))
        .collect();
    assert!(short.iter().all(|(k, _, _)| k.starts_with("h.")));
    let list: Vec<_> = short
        .iter()
        .map(|(k, shape, v)| (k.clone(), shape.clone(), v.as_slice()))
        .collect();
    std::fs::write(&file, to_safetensors(&list).unwrap()).unwrap();
    let short_named = run_tiny(&resume_flags(&step2)).unwrap();
    let tail: Vec<_> = full[2..].iter().map(bits).collect();
    assert_eq!(peft_named.iter().map(bits).collect::<Vec<_>>(), tail);
    assert_eq!(short_named.iter().map(bits).collect::<Vec<_>>(), tail);
}

#[test]
fn a_peft_config_the_flags_or_the_trainer_disagree_with_is_named() {
    let s = Scratch::new("peft-config");
    let dir = s.path("adapter");
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["adapter_model.safetensors", "adapter_config.json"] {
        std::fs::copy(peft_dir().join(f), dir.join(f)).unwrap();
    }
    let original: Value =
        serde_json::from_slice(&std::fs::read(dir.join("adapter_config.json")).unwrap()).unwrap();
    let with = |key: &str, value: Value| {
        let mut c = original.clone();
        c[key] = value;
        std::fs::write(
            dir.join("adapter_config.json"),
            serde_json::to_vec(&c).unwrap(),
        )
        .unwrap();
        let err = run_tiny(&flags(&dir, &["--steps", "1"])).unwrap_err();
        assert_eq!(err.exit_code(), 1, "{err}");
        let text = err.to_string();
        assert!(text.contains("adapter_config.json"), "{text}");
        text
    };
    // Another alpha scales every adapter differently: refused with the flag to give.
    let text = with("lora_alpha", serde_json::json!(16));
    assert!(text.contains("--lora-alpha 16"), "{text}");
    let text = with("target_modules", serde_json::json!(["c_attn"]));
    assert!(text.contains("--lora-targets attn.c_attn"), "{text}");
    let text = with("use_rslora", serde_json::json!(true));
    assert!(text.contains("use_rslora"), "{text}");
    let text = with("target_modules", serde_json::json!(["q_proj"]));
    assert!(text.contains("`q_proj`"), "{text}");
}

#[test]
fn the_log_may_not_overwrite_a_file_of_the_peft_directory() {
    let s = Scratch::new("peft-log");
    let dir = s.path("adapter");
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["adapter_model.safetensors", "adapter_config.json"] {
        std::fs::copy(peft_dir().join(f), dir.join(f)).unwrap();
    }
    for f in ["adapter_model.safetensors", "adapter_config.json"] {
        let before = std::fs::read(dir.join(f)).unwrap();
        let log = dir.join(f).display().to_string();
        let err = run_tiny(&flags(&dir, &["--steps", "1", "--log", &log])).unwrap_err();
        assert_eq!(err.exit_code(), 2, "{err}");
        assert!(err.to_string().contains("--lora-init"), "{err}");
        assert_eq!(std::fs::read(dir.join(f)).unwrap(), before, "{f}");
    }
}
