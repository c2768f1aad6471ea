//! `--grad-checkpoint` (activation checkpointing): the forward keeps each layer's input only and
//! the backward recomputes the layer before its backward. On one device (the CPU backend, and
//! hip-emu in the device suite) a run with it must equal the run without it bit for bit (every
//! step's loss and gradient norm, and every byte of the checkpoints: weights, AdamW moments,
//! LoRA adapters), for GPT-2 and the LLaMA family (llama, qwen2, chatglm; packed sequences),
//! f32 and bf16, full and LoRA; on 2 emulated
//! devices it must equal the same 2-device run without it bit for bit, and one device within
//! the data-parallel bound. Its memory is measured on hip-emu
//! (`on_device::activations_drop_to_one_layer_plus_the_inputs`).

use super::glm_train::{cfg_of, glm_args};
use super::llama_lora::lora_args;
use super::llama_train::packed_batches;
use super::llama_train::variant_args;
use super::lora::lora_flags;
use super::{args_with, data_dir, strs, Scratch};
use crate::cli::Args;
use crate::cpu_backend::Cpu;
use crate::llama::train::{setup, train_as, Source};
use crate::train::{run, Role, StepLog};
use std::collections::BTreeMap;
use std::path::Path;

/// Every step's `(step, loss, grad_norm)` as bits.
fn bits(logs: &[StepLog]) -> Vec<(u64, u64, u64)> {
    logs.iter()
        .map(|l| (l.step, l.loss.to_bits(), l.grad_norm.to_bits()))
        .collect()
}

/// Every file under `dir` (relative path → bytes).
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                let rel = p.strip_prefix(root).unwrap().display().to_string();
                out.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// Run the args `make` builds from `extra` plus a checkpoint directory (saved after step 1 and
/// the last), with and without `--grad-checkpoint`, and assert the two bit-identical.
fn assert_identical(what: &str, make: &dyn Fn(&[String]) -> Args, extra: &[&str]) {
    let s = Scratch::new("grad-checkpoint");
    let mut out = Vec::new();
    for (tag, flag) in [("plain", None), ("ckpt", Some("--grad-checkpoint"))] {
        let dir = s.path(tag);
        let mut f = strs(extra);
        f.extend(strs(&["--checkpoint-dir", &dir.display().to_string()]));
        f.extend(strs(&["--save-every", "1"]));
        f.extend(flag.map(String::from));
        let logs = run(&make(&f)).unwrap_or_else(|e| panic!("{what} {tag}: {e}"));
        assert!(!logs.is_empty(), "{what}: no steps");
        out.push((bits(&logs), files(&dir)));
    }
    let (plain, ckpt) = (&out[0], &out[1]);
    assert_eq!(plain.0, ckpt.0, "{what}: losses or gradient norms differ");
    assert!(
        plain.1.len() >= 2,
        "{what}: no checkpoint files: {:?}",
        plain.1.keys()
    );
    assert_eq!(
        plain.1.keys().collect::<Vec<_>>(),
        ckpt.1.keys().collect::<Vec<_>>(),
        "{what}: checkpoint files"
    );
    for (name, bytes) in &plain.1 {
        assert!(ckpt.1[name] == *bytes, "{what}: {name} differs");
    }
}

/// The tiny GPT-2 with `extra` flags.
fn gpt2(extra: &[String]) -> Args {
    let d = data_dir();
    let mut f = strs(&["--seq", "16", "--batch", "4", "--lr", "1e-2"]);
    f.extend(extra.iter().cloned());
    args_with(&d.join("model"), &d.join("tokens.bin"), &f)
}

/// The tiny GPT-2 with the LoRA reference's flags (all four targets) and `extra`.
fn gpt2_lora(extra: &[String]) -> Args {
    let d = data_dir();
    let mut f = lora_flags(true, &[]);
    f.extend(extra.iter().cloned());
    args_with(&d.join("model"), &d.join("tokens.bin"), &f)
}

fn llama(extra: &[String]) -> Args {
    variant_args("llama_base", extra)
}

fn qwen2(extra: &[String]) -> Args {
    variant_args("qwen2_base", extra)
}

fn qwen2_lora(extra: &[String]) -> Args {
    lora_args(extra)
}

#[test]
fn gpt2_on_the_cpu_is_bit_identical_with_and_without_it() {
    assert_identical("gpt2 f32", &gpt2, &["--steps", "2", "--grad-accum", "2"]);
    assert_identical("gpt2 bf16", &gpt2, &["--steps", "2", "--dtype", "bf16"]);
    assert_identical("gpt2 LoRA", &gpt2_lora, &["--steps", "2"]);
}

#[test]
fn llama_family_on_the_cpu_is_bit_identical_with_and_without_it() {
    assert_identical("llama f32", &llama, &["--steps", "2"]);
    assert_identical("qwen2 bf16", &qwen2, &["--steps", "2", "--dtype", "bf16"]);
    assert_identical("qwen2 LoRA", &qwen2_lora, &["--steps", "2"]);
    // GLM's partial interleaved rotary, in the chatglm layout.
    let chatglm = |e: &[String]| glm_args("glm_base", "chatglm", e);
    assert_identical("chatglm f32", &chatglm, &["--steps", "2"]);
}

/// Packed sequences (their positions and sequence bounds in the recomputed attention), on the
/// GLM in the chatglm layout, as tests::glm_train runs them.
#[test]
fn packed_sequences_on_the_cpu_are_bit_identical_with_and_without_it() {
    let logs: Vec<_> = [false, true]
        .map(|ckpt| {
            let mut extra = strs(&["--steps", "3"]);
            if ckpt {
                extra.push("--grad-checkpoint".into());
            }
            let args = glm_args("glm_packed", "chatglm", &extra);
            let cfg = cfg_of(&args.model);
            // The setup reads the token file; the packed rows replace it as the source.
            let stream = glm_args(
                "glm_base",
                "chatglm",
                &strs(&["--steps", "3", "--batch", "2", "--grad-accum", "2"]),
            );
            let mut s = setup(&stream, cfg, 1).unwrap();
            s.source = Source::Batches {
                list: packed_batches(),
                next: 0,
            };
            bits(&train_as(&Cpu, &args, s, Role::SINGLE, false).unwrap().logs)
        })
        .into();
    assert_eq!(logs[0].len(), 3);
    assert_eq!(
        logs[0], logs[1],
        "packed chatglm: with and without --grad-checkpoint"
    );
}

#[cfg(feature = "device")]
mod on_device {
    use super::super::{alone, emu_setup, strs};
    use super::*;
    use crate::parallel::run_devices;

    /// A model's name and how its args are made.
    type Maker<'a> = (&'a str, &'a dyn Fn(&[String]) -> Args);

    /// 2 ranks against one device with the global batch, f32: summation order only (as
    /// the data-parallel tests' bound).
    const DDP_RTOL: f64 = 1e-5;

    #[test]
    fn on_one_device_it_is_bit_identical_with_and_without_it() {
        emu_setup();
        let dev = ["--device", "0", "--steps", "2"];
        assert_identical("gpt2 f32 (hip-emu)", &gpt2, &dev);
        let bf16 = [&dev[..], &["--dtype", "bf16"]].concat();
        assert_identical("gpt2 bf16 (hip-emu)", &gpt2, &bf16);
        assert_identical("gpt2 LoRA (hip-emu)", &gpt2_lora, &dev);
        assert_identical("llama f32 (hip-emu)", &llama, &dev);
        assert_identical("qwen2 bf16 (hip-emu)", &qwen2, &bf16);
        assert_identical("qwen2 LoRA (hip-emu)", &qwen2_lora, &dev);
    }

    /// In a process of its own: the collectives of other modules' multi-device tests running
    /// beside it would share hip-emu's devices (and under load time out). Two steps: the second
    /// starts from the first's update, which must agree bit for bit too.
    #[test]
    fn on_two_devices_it_equals_the_plain_runs() {
        if alone("tests::grad_checkpoint::on_device::on_two_devices_it_equals_the_plain_runs") {
            return;
        }
        emu_setup();
        let makers: [Maker; 2] = [("gpt2", &gpt2), ("llama", &llama)];
        for (name, make) in makers {
            let one = run(&make(&strs(&["--steps", "2", "--device", "0"]))).unwrap();
            let two = |zero: &str, ckpt: bool| {
                let mut f = strs(&["--steps", "2", "--batch", "2", "--devices", "0,1"]);
                f.extend(strs(&["--zero", zero]));
                if ckpt {
                    f.push("--grad-checkpoint".into());
                }
                run_devices(&make(&f), &[0, 1], true).unwrap()
            };
            for zero in ["0", "1"] {
                let (plain, ckpt) = (two(zero, false), two(zero, true));
                let what = format!("{name} on 2 devices, --zero {zero}");
                assert_eq!(
                    bits(&plain[0].logs),
                    bits(&ckpt[0].logs),
                    "{what}: with and without --grad-checkpoint"
                );
                for r in 0..2 {
                    assert!(
                        plain[r].tensors == ckpt[r].tensors,
                        "{what}: rank {r}'s final tensors differ"
                    );
                }
                for (g, w) in ckpt[0].logs.iter().zip(&one) {
                    let rel = |a: f64, b: f64| (a - b).abs() / b.abs();
                    assert!(
                        rel(g.loss, w.loss) <= DDP_RTOL
                            && rel(g.grad_norm, w.grad_norm) <= DDP_RTOL,
                        "{what}, --grad-checkpoint, step {}: loss {} vs {}, norm {} vs {}",
                        g.step,
                        g.loss,
                        w.loss,
                        g.grad_norm,
                        w.grad_norm
                    );
                }
            }
        }
    }

    /// The step peaks of a one-device run of `make(extra)`, and the estimate's activations part.
    fn peak(make: &dyn Fn(&[String]) -> Args, extra: &[&str]) -> (u64, u64) {
        let a = make(&strs(extra));
        let (_, est) = crate::memory::for_args(&a, 1, Some(0)).unwrap();
        let logs = run(&a).unwrap();
        let measured = logs.iter().map(|l| l.mem.unwrap().peak).max().unwrap();
        (measured, est.parts[activations_part()])
    }

    fn activations_part() -> usize {
        use crate::memory::estimate::Part;
        Part::ALL
            .iter()
            .position(|&p| p == Part::Activations)
            .unwrap()
    }

    /// The measured peak drops by the activations of all layers but one, less one layer's input
    /// each: exactly what the estimate's activations part says (hip-emu's allocator rounds
    /// every buffer the same way in both runs and in the estimate).
    #[test]
    fn activations_drop_to_one_layer_plus_the_inputs() {
        if alone("tests::grad_checkpoint::on_device::activations_drop_to_one_layer_plus_the_inputs")
        {
            return;
        }
        emu_setup();
        let makers: [Maker; 2] = [("gpt2", &gpt2), ("llama", &llama)];
        for (name, make) in makers {
            for dtype in ["f32", "bf16"] {
                let base = ["--device", "0", "--steps", "2", "--dtype", dtype];
                let (plain, est_plain) = peak(make, &base);
                let (ckpt, est_ckpt) = peak(make, &[&base[..], &["--grad-checkpoint"]].concat());
                let (drop, est_drop) = (plain - ckpt, est_plain - est_ckpt);
                println!(
                    "emulated (hip-emu) {name} {dtype}: mem_peak {plain} B → {ckpt} B with \
                     --grad-checkpoint (−{drop} B, {:.1} %); the estimate's activations \
                     {est_plain} B → {est_ckpt} B",
                    100.0 * drop as f64 / plain as f64
                );
                assert!(ckpt < plain, "{name} {dtype}: {ckpt} B ≥ {plain} B");
                assert_eq!(
                    drop, est_drop,
                    "{name} {dtype}: the measured drop is not the activations of L − 1 layers"
                );
            }
        }
    }
}
