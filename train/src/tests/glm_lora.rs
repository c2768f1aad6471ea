//! LoRA on the tiny GLM of tests/data/train_glm (tools/gen_tiny_glm.py): the six `glm` targets
//! from a PEFT-saved adapter (`glm_peft/`) and the four `chatglm` targets from an adapter in
//! THUDM's layout's PEFT names (`chatglm_peft/`), against PEFT + transformers' GlmForCausalLM
//! float64 figures (`ref_glm_lora.jsonl`, `ref_chatglm_lora.jsonl`); both layouts equal on the
//! targets they share; saved adapters in each layout's PEFT names.

use super::glm_train::{glm_args, glm_compare, glm_dir};
use super::llama_train::LOSS_RTOL_CPU;
use super::{strs, Scratch};
use crate::cli::Args;

/// Variant `name` on model `model` with `--lora-init` resolved to the committed adapter.
pub(super) fn glm_lora_args(name: &str, model: &str, extra: &[String]) -> Args {
    let mut args = glm_args(name, model, extra);
    if let Some(init) = args.lora_init.as_mut() {
        *init = glm_dir().join(&*init);
    }
    args
}

#[test]
fn glm_lora_on_six_targets_from_peft_matches_peft_on_the_cpu() {
    let ours = crate::train::run(&glm_lora_args("glm_lora", "glm", &[])).unwrap();
    assert_eq!(ours.len(), 10);
    glm_compare(&ours, "glm_lora", LOSS_RTOL_CPU);
}

#[test]
fn chatglm_lora_on_the_fused_targets_matches_peft_on_the_cpu() {
    let ours = crate::train::run(&glm_lora_args("chatglm_lora", "chatglm", &[])).unwrap();
    assert_eq!(ours.len(), 10);
    glm_compare(&ours, "chatglm_lora", LOSS_RTOL_CPU);
}

#[test]
fn both_layouts_train_the_same_adapters_on_the_targets_they_share() {
    let run = |model: &str, targets: &str| {
        let mut a = glm_args(
            "glm_base",
            model,
            &strs(&[
                "--steps",
                "4",
                "--lora-rank",
                "4",
                "--lora-alpha",
                "8",
                "--lora-targets",
                targets,
            ]),
        );
        a.lora_init = None;
        crate::train::run(&a).unwrap()
    };
    let glm = run("glm", "o_proj,gate_up_proj,down_proj");
    let chatglm = run("chatglm", "dense,dense_h_to_4h,dense_4h_to_h");
    assert_eq!(glm.len(), 4);
    for (a, b) in glm.iter().zip(&chatglm) {
        assert_eq!((a.step, a.loss, a.grad_norm), (b.step, b.loss, b.grad_norm));
    }
}

#[test]
fn glm_family_lora_targets_are_the_layouts_names() {
    let base = |model: &str, targets: Option<&str>| {
        let mut extra = strs(&["--steps", "1", "--lora-rank", "2"]);
        if let Some(t) = targets {
            extra.extend(strs(&["--lora-targets", t]));
        }
        let mut a = glm_args("glm_base", model, &extra);
        a.lora_init = None;
        a
    };
    for (model, wrong) in [("chatglm", "q_proj"), ("glm", "query_key_value")] {
        let e = crate::train::run(&base(model, Some(wrong)))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("`{wrong}` is not a target of this model")),
            "{e}"
        );
    }
    let mut merge = base("chatglm", None);
    merge.merge_on_save = true;
    merge.checkpoint_dir = Some(std::env::temp_dir().join("hipk-glm-merge-refused"));
    merge.save_every = 1;
    let e = crate::train::run(&merge).unwrap_err();
    assert!(matches!(e, crate::error::TrainError::Usage(_)), "{e}");
    assert!(e.to_string().contains("--merge-on-save"), "{e}");
    let e = crate::train::run(&base("glm", Some("gate_proj")))
        .unwrap_err()
        .to_string();
    assert!(e.contains("gate_up_proj"), "{e}");
    // The defaults (chatglm: query_key_value, as LLaMA-Factory's; glm: q_proj,v_proj) train.
    for model in ["chatglm", "glm"] {
        assert_eq!(crate::train::run(&base(model, None)).unwrap().len(), 1);
    }
}

#[test]
fn chatglm_lora_checkpoints_hold_the_adapters_in_thudms_peft_names() {
    let s = Scratch::new("chatglm-lora-save");
    let ck = s.path("ck");
    let dir = ck.to_str().unwrap();
    let args = glm_lora_args(
        "chatglm_lora",
        "chatglm",
        &strs(&["--steps", "4", "--checkpoint-dir", dir, "--save-every", "4"]),
    );
    let run = crate::train::run(&args).unwrap();
    let step4 = ck.join("step_4");
    let t = crate::weights::read_f32_tensors(&step4.join("adapter_model.safetensors")).unwrap();
    // 2 layers × 4 targets × (A, B); the fused query_key_value is one A and one B.
    assert_eq!(t.len(), 16);
    let pre = "base_model.model.transformer.encoder.layers.1.";
    let a = &t[&format!("{pre}self_attention.query_key_value.lora_A.weight")];
    let b = &t[&format!("{pre}self_attention.query_key_value.lora_B.weight")];
    assert_eq!(
        (a.0.as_slice(), b.0.as_slice()),
        (&[4, 48][..], &[128, 4][..])
    );
    assert_eq!(
        t[&format!("{pre}mlp.dense_h_to_4h.lora_B.weight")].0,
        [128, 4]
    );
    let c: serde_json::Value =
        serde_json::from_slice(&std::fs::read(step4.join("adapter_config.json")).unwrap()).unwrap();
    assert_eq!(
        c["target_modules"],
        serde_json::json!(["query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"])
    );
    // The checkpoint is a PEFT adapter that --lora-init reads back, and --resume continues.
    let mut again = glm_lora_args("chatglm_lora", "chatglm", &strs(&["--steps", "6"]));
    again.resume = Some(step4.clone());
    again.lora_init = None;
    let resumed = crate::train::run(&again).unwrap();
    let straight = crate::train::run(&glm_lora_args(
        "chatglm_lora",
        "chatglm",
        &strs(&["--steps", "6"]),
    ))
    .unwrap();
    assert_eq!(run[3].loss, straight[3].loss);
    for (r, w) in resumed.iter().zip(&straight[4..]) {
        assert_eq!((r.step, r.loss), (w.step, w.loss));
    }
}

#[test]
fn peft_loads_our_glm_adapters_and_gives_the_next_step_loss() {
    // tools/hf_interop_glm.py: PEFT's loss (PeftModel.from_pretrained on GlmForCausalLM,
    // float64) of step 5's batch with the trainer's step_4 adapters, and the trainer's step 5.
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(glm_dir().join("interop.json")).unwrap()).unwrap();
    let r = &v["glm_lora"];
    let hf = r["transformers_loss"].as_f64().unwrap();
    let ours = r["trainer_loss"].as_f64().unwrap();
    let rel = |a: f64, b: f64| (a - b).abs() / b.abs();
    assert!(rel(hf, ours) <= LOSS_RTOL_CPU, "PEFT {hf} vs {ours}");
    let now = crate::train::run(&glm_lora_args("glm_lora", "glm", &strs(&["--steps", "5"])))
        .unwrap()[4]
        .loss;
    assert!(
        rel(now, hf) <= LOSS_RTOL_CPU,
        "step 5 now {now} vs PEFT {hf}"
    );
}

#[test]
fn the_memory_estimate_sizes_glm_lora_targets_by_their_fused_sites() {
    let estimate = |targets: &str| {
        let mut a = glm_args(
            "glm_base",
            "chatglm",
            &strs(&[
                "--lora-rank",
                "8",
                "--lora-targets",
                targets,
                "--memory-estimate",
            ]),
        );
        a.lora_init = None;
        crate::memory::for_args(&a, 1, None)
    };
    let (what, qkv) = estimate("query_key_value").unwrap();
    assert!(what.contains("LoRA r=8"), "{what}");
    let (_, more) = estimate("query_key_value,dense_h_to_4h").unwrap();
    assert!(more.peak() > qkv.peak());
    let e = estimate("q_proj").unwrap_err().to_string();
    assert!(e.contains("`q_proj` is not a target of this model"), "{e}");
}
