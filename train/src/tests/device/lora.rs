//! LoRA on the device (hip-emu in CI: semantics, not speed): every step against the float64
//! PyTorch reference, bf16 against the CPU backend, bit-identical resume.

use super::DEVICE_LOSS_RTOL;
use crate::tests::lora::{compare, lora_flags, reference};
use crate::tests::{run_tiny, Scratch};
use crate::train::StepLog;

fn on_device(extra: &[&str]) -> Vec<StepLog> {
    let mut e = vec!["--device", "0"];
    e.extend_from_slice(extra);
    run_tiny(&lora_flags(true, &e)).unwrap()
}

#[test]
fn lora_on_the_device_matches_pytorch_every_step() {
    let ours = on_device(&[]);
    let (l, n) = compare(&ours, &reference("ref_lora.jsonl"), DEVICE_LOSS_RTOL);
    println!("device lora f32: 20 steps, max rel diff loss {l:.3e}, grad_norm {n:.3e} vs PyTorch");
    assert!(ours.iter().all(|s| s.mem.is_some()));
}

#[test]
fn bf16_and_f16_lora_on_the_device_train_close_to_the_cpu_backend() {
    for dtype in ["bf16", "f16"] {
        let dev = on_device(&["--dtype", dtype, "--steps", "3"]);
        let cpu = run_tiny(&lora_flags(true, &["--dtype", dtype, "--steps", "3"])).unwrap();
        // As for full fine-tuning (device.rs): both round to 8 (bf16) or 11 (f16) bits at
        // different places.
        let d = dev
            .iter()
            .zip(&cpu)
            .map(|(a, b)| (a.loss - b.loss).abs() / b.loss)
            .fold(0.0f64, f64::max);
        println!("device lora {dtype}, 3 steps: max rel loss diff {d:.3e} vs the CPU backend");
        assert!(d <= 4e-3, "{dtype}: {d}");
        assert!(dev.iter().all(|l| l.scaler.is_some() == (dtype == "f16")));
    }
}

#[test]
fn lora_resume_on_the_device_continues_bit_identically() {
    let s = Scratch::new("device-lora-resume");
    let ck = s.path("ck").display().to_string();
    let full = on_device(&["--steps", "4", "--checkpoint-dir", &ck, "--save-every", "2"]);
    let mut f = lora_flags(true, &["--device", "0", "--steps", "4"]);
    let i = f.iter().position(|x| x == "--lora-init").unwrap();
    f.drain(i..i + 2);
    f.push("--resume".into());
    f.push(s.path("ck/step_2").display().to_string());
    let resumed = run_tiny(&f).unwrap();
    let bits = |l: &StepLog| (l.step, l.loss.to_bits(), l.grad_norm.to_bits());
    assert_eq!(
        full[2..].iter().map(bits).collect::<Vec<_>>(),
        resumed.iter().map(bits).collect::<Vec<_>>()
    );
}

// The allocator's figures of LoRA against full fine-tuning: tests/device_lora.rs (a process of
// its own, as the figures are the process's and these tests run in parallel).
