//! The tiny GLM of tests/data/train_glm (tools/gen_tiny_glm.py) trained on the CPU against
//! transformers' GlmForCausalLM in float64 (tools/train_ref_llama.py), in both checkpoint
//! layouts (`glm` and THUDM's `chatglm`, the same weights), packed sequences, and checkpoints
//! that keep the layout read.

use super::llama_train::{packed_batches, LOSS_RTOL_CPU, NORM_FACTOR};
use super::{args_with, strs, Scratch};
use crate::cli::Args;
use crate::cpu_backend::Cpu;
use crate::llama::train::{setup, train_as, Source};
use crate::llama::LlamaConfig;
use crate::train::{Role, StepLog};
use std::path::{Path, PathBuf};

/// tests/data/train_glm.
pub(super) fn glm_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/train_glm")
}

/// Args of variant `name` (variants.json) on the model directory `model` (`glm` or
/// `chatglm`), with `extra` flags appended.
pub(super) fn glm_args(name: &str, model: &str, extra: &[String]) -> Args {
    let d = glm_dir();
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("variants.json")).unwrap()).unwrap();
    let v = &v[name];
    let mut flags: Vec<String> = v["flags"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect();
    flags.extend(extra.iter().cloned());
    args_with(&d.join(model), &d.join(v["data"].as_str().unwrap()), &flags)
}

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs()
}

/// Compare `ours` with the reference `ref_<name>.jsonl` within `rtol` (grad_norm within
/// [`NORM_FACTOR`] × `rtol`); returns the largest relative loss difference.
pub(super) fn glm_compare(ours: &[StepLog], name: &str, rtol: f64) -> f64 {
    let text = std::fs::read_to_string(glm_dir().join(format!("ref_{name}.jsonl"))).unwrap();
    let refs: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        !ours.is_empty() && ours.len() <= refs.len(),
        "{name}: steps"
    );
    let (mut max_loss, mut max_norm) = (0.0f64, 0.0f64);
    for (o, r) in ours.iter().zip(&refs) {
        assert_eq!(o.step, r["step"].as_u64().unwrap());
        let dl = rel(o.loss, r["loss"].as_f64().unwrap());
        let dn = rel(o.grad_norm, r["grad_norm"].as_f64().unwrap());
        assert!(
            dl <= rtol,
            "{name} step {}: loss {} vs {} (rel {dl:e})",
            o.step,
            o.loss,
            r["loss"]
        );
        assert!(
            dn <= NORM_FACTOR * rtol,
            "{name} step {}: grad_norm {} vs {} (rel {dn:e})",
            o.step,
            o.grad_norm,
            r["grad_norm"]
        );
        (max_loss, max_norm) = (max_loss.max(dl), max_norm.max(dn));
    }
    println!(
        "{name}: {} steps, max rel diff loss {max_loss:.3e}, grad_norm {max_norm:.3e}",
        ours.len()
    );
    max_loss
}

pub(super) fn cfg_of(model: &Path) -> LlamaConfig {
    match crate::config::ModelConfig::load(&model.join("config.json")).unwrap() {
        crate::config::ModelConfig::Llama(c) => c,
        crate::config::ModelConfig::Gpt2(_) => panic!("not a glm"),
    }
}

#[test]
fn glm_and_chatglm_layouts_match_transformers_on_the_cpu() {
    let glm = crate::train::run(&glm_args("glm_base", "glm", &[])).unwrap();
    assert_eq!(glm.len(), 10);
    glm_compare(&glm, "glm_base", LOSS_RTOL_CPU);
    // The same weights in THUDM's layout train the same fused tensors: the same numbers.
    let chatglm = crate::train::run(&glm_args("glm_base", "chatglm", &[])).unwrap();
    for (a, b) in glm.iter().zip(&chatglm) {
        assert_eq!((a.step, a.loss, a.grad_norm), (b.step, b.loss, b.grad_norm));
    }
}

#[test]
fn glm_packed_sequences_match_transformers_run_one_by_one() {
    let args = glm_args("glm_packed", "chatglm", &[]);
    let cfg = cfg_of(&args.model);
    // The setup reads the token file; the packed rows replace it as the source.
    let stream = glm_args(
        "glm_base",
        "chatglm",
        &strs(&["--steps", "6", "--batch", "2", "--grad-accum", "2"]),
    );
    let mut s = setup(&stream, cfg, 1).unwrap();
    s.source = Source::Batches {
        list: packed_batches(),
        next: 0,
    };
    let out = train_as(&Cpu, &args, s, Role::SINGLE, false).unwrap();
    assert_eq!(out.logs.len(), 6);
    glm_compare(&out.logs, "glm_packed", LOSS_RTOL_CPU);
}

#[test]
fn a_chatglm_checkpoint_keeps_its_layout_and_resumes_bit_for_bit() {
    let s = Scratch::new("chatglm-resume");
    let ck = s.path("ck");
    let flags = |extra: &[&str]| {
        let mut f = strs(&[
            "--checkpoint-dir",
            ck.to_str().unwrap(),
            "--save-every",
            "4",
        ]);
        f.extend(strs(extra));
        f
    };
    let full = crate::train::run(&glm_args("glm_base", "chatglm", &flags(&[]))).unwrap();
    let step4 = ck.join("step_4");
    let names = crate::weights::read_f32_tensors(&step4.join("model.safetensors")).unwrap();
    let qkv = "transformer.encoder.layers.1.self_attention.query_key_value.weight";
    assert_eq!(names[qkv].0, vec![(4 + 2 * 2) * 16, 48]);
    assert!(names.contains_key("transformer.output_layer.weight"));
    assert!(!names.keys().any(|n| n.starts_with("model.")));
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(step4.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["model_type"], "chatglm");
    let resumed = crate::train::run(&glm_args(
        "glm_base",
        "chatglm",
        &flags(&["--resume", step4.to_str().unwrap()]),
    ))
    .unwrap();
    assert_eq!(resumed.len(), 6);
    for (a, b) in full[4..].iter().zip(&resumed) {
        assert_eq!((a.step, a.loss, a.grad_norm), (b.step, b.loss, b.grad_norm));
    }
    // A chatglm checkpoint is not a glm model's.
    let e = crate::train::run(&glm_args(
        "glm_base",
        "glm",
        &flags(&["--resume", step4.to_str().unwrap()]),
    ))
    .unwrap_err()
    .to_string();
    assert!(e.contains("another model"), "{e}");
}

#[test]
fn the_first_progress_line_names_the_family() {
    let c = cfg_of(&glm_dir().join("chatglm"));
    assert_eq!(c.describe(), "chatglm L=2 C=48 H=4 K=2 D=16 F=64 V=128");
    assert_eq!((c.rotary_dim, c.rotary.theta), (8, 50000.0));
    let g = cfg_of(&glm_dir().join("glm"));
    assert_eq!((g.rotary_dim, g.rotary.theta, g.eps), (8, 50000.0, c.eps));
}

#[test]
fn save_format_hf_writes_a_chatglm_run_as_glm() {
    let s = Scratch::new("chatglm-as-glm");
    let ck = s.path("ck");
    let run = crate::train::run(&glm_args(
        "glm_base",
        "chatglm",
        &strs(&[
            "--steps",
            "3",
            "--checkpoint-dir",
            ck.to_str().unwrap(),
            "--save-every",
            "3",
            "--save-format",
            "hf",
        ]),
    ))
    .unwrap();
    let step3 = ck.join("step_3");
    let cfg = cfg_of(&step3);
    assert_eq!(cfg.family, crate::llama::Family::Glm);
    let names = crate::weights::read_f32_tensors(&step3.join("model.safetensors")).unwrap();
    assert_eq!(
        names["model.layers.0.self_attn.k_proj.weight"].0,
        vec![32, 48]
    );
    assert!(names.contains_key("model.layers.1.mlp.gate_up_proj.weight"));
    // The glm checkpoint resumes the chatglm run's trajectory with --model the checkpoint.
    let glm_run = glm_args("glm_base", "glm", &strs(&["--steps", "4"]));
    let full = crate::train::run(&glm_run).unwrap();
    assert_eq!(run[2].loss, full[2].loss);
    let mut resumed = glm_run.clone();
    resumed.model = step3.clone();
    resumed.resume = Some(step3);
    let next = crate::train::run(&resumed).unwrap();
    assert_eq!((next[0].step, next[0].loss), (4, full[3].loss));
}

#[test]
fn pytorch_bin_weights_only_is_an_error_saying_to_convert() {
    let s = Scratch::new("chatglm-bin");
    let dir = s.path("m");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        glm_dir().join("chatglm/config.json"),
        dir.join("config.json"),
    )
    .unwrap();
    std::fs::write(dir.join("pytorch_model-00001-of-00007.bin"), b"not read").unwrap();
    let mut args = glm_args("glm_base", "chatglm", &strs(&["--steps", "1"]));
    args.model = dir.clone();
    let e = crate::train::run(&args).unwrap_err().to_string();
    assert!(
        e.contains("pytorch_model") && e.contains("safetensors"),
        "{e}"
    );
    assert!(e.contains(&dir.display().to_string()), "{e}");
}
