//! The tiny GLM on hip-emu: both layouts against transformers' GlmForCausalLM float64 figures,
//! and two devices against one.

use super::glm_train::{glm_args, glm_compare};
use super::llama_train::LOSS_RTOL_DEVICE;
use super::{emu_setup, strs};

/// Steps per device run: a tiny-model step on hip-emu takes about a second.
const STEPS: &str = "3";

/// Between 2 ranks and one device with the global batch (f32): the runs differ only in the
/// order of the sum across ranks.
const DDP_RTOL: f64 = 1e-5;

#[test]
fn glm_and_chatglm_on_a_device_match_transformers_and_two_devices_equal_one() {
    let _s = super::serial();
    emu_setup();
    let mut one = Vec::new();
    for model in ["glm", "chatglm"] {
        let logs = crate::train::run(&glm_args(
            "glm_base",
            model,
            &strs(&["--steps", STEPS, "--device", "0"]),
        ))
        .unwrap();
        glm_compare(&logs, "glm_base", LOSS_RTOL_DEVICE);
        one = logs;
    }
    // The same global batch: 2 ranks × --batch 2.
    let args = glm_args(
        "glm_base",
        "chatglm",
        &strs(&["--steps", STEPS, "--batch", "2", "--devices", "0,1"]),
    );
    let outs = crate::parallel::run_devices(&args, &[0, 1], true).unwrap();
    for (g, w) in outs[0].logs.iter().zip(&one) {
        let rel = |a: f64, b: f64| (a - b).abs() / b.abs();
        assert!(
            rel(g.loss, w.loss) <= DDP_RTOL,
            "step {}: {} vs {}",
            g.step,
            g.loss,
            w.loss
        );
        assert!(
            rel(g.grad_norm, w.grad_norm) <= 10.0 * DDP_RTOL,
            "step {}: {} vs {}",
            g.step,
            g.grad_norm,
            w.grad_norm
        );
    }
    assert_eq!(outs[0].logs.len(), one.len());
    let [p0, _] = outs[0].tensors.as_ref().unwrap();
    let [p1, _] = outs[1].tensors.as_ref().unwrap();
    assert_eq!(p0, p1, "the ranks' parameters differ");
}

#[test]
fn glm_family_lora_on_a_device_matches_peft() {
    let _s = super::serial();
    emu_setup();
    for (name, model) in [("glm_lora", "glm"), ("chatglm_lora", "chatglm")] {
        let logs = crate::train::run(&super::glm_lora::glm_lora_args(
            name,
            model,
            &strs(&["--steps", "3", "--device", "0"]),
        ))
        .unwrap();
        assert_eq!(logs.len(), 3);
        glm_compare(&logs, name, LOSS_RTOL_DEVICE);
    }
}

#[test]
fn chatglm3_lora_sft_on_a_device_equals_the_cpu() {
    let _s = super::serial();
    emu_setup();
    let steps = ["--steps", "3"];
    let cpu = crate::train::run(&super::glm_sft::chatglm_sft_args(&steps)).unwrap();
    let mut dev = steps.to_vec();
    dev.extend(["--device", "0"]);
    let gpu = crate::train::run(&super::glm_sft::chatglm_sft_args(&dev)).unwrap();
    assert_eq!(gpu.len(), 3);
    let mut max = 0.0f64;
    for (g, c) in gpu.iter().zip(&cpu) {
        let rel = (g.loss - c.loss).abs() / c.loss.abs();
        max = max.max(rel);
        assert!(
            rel <= LOSS_RTOL_DEVICE,
            "step {}: device {} vs cpu {}",
            g.step,
            g.loss,
            c.loss
        );
    }
    println!("chatglm3 LoRA SFT: device vs cpu, max rel diff loss {max:.3e}");
}

#[test]
fn chatglm_lora_on_two_devices_equals_one() {
    let _s = super::serial();
    emu_setup();
    let run = |extra: &[&str]| {
        let mut flags = strs(&["--steps", STEPS]);
        flags.extend(strs(extra));
        super::glm_lora::glm_lora_args("chatglm_lora", "chatglm", &flags)
    };
    let one = crate::train::run(&run(&["--device", "0"])).unwrap();
    // The same global batch: 2 ranks × --batch 2.
    let args = run(&["--batch", "2", "--devices", "0,1"]);
    let outs = crate::parallel::run_devices(&args, &[0, 1], false).unwrap();
    assert_eq!((outs.len(), outs[0].logs.len()), (2, one.len()));
    // The device keeps the loss in f32: equal figures are possible; grad_norm shows the ranks.
    for (g, w) in outs[0].logs.iter().zip(&one) {
        let rel = (g.grad_norm - w.grad_norm).abs() / w.grad_norm;
        assert!(rel <= 10.0 * DDP_RTOL, "step {}: grad_norm {rel:e}", g.step);
    }
    let mut worst = 0.0f64;
    for (g, w) in outs[0].logs.iter().zip(&one) {
        let rel = (g.loss - w.loss).abs() / w.loss.abs();
        worst = worst.max(rel);
        assert!(rel <= DDP_RTOL, "step {}: {} vs {}", g.step, g.loss, w.loss);
    }
    println!("chatglm LoRA, 2 devices vs 1: largest relative loss difference {worst:.1e}");
}
