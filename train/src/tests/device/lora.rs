//! LoRA on the device (hip-emu in CI: semantics, not speed): every step against the float64
//! PyTorch reference, bf16 against the CPU backend, bit-identical resume, and the launches of
//! one adapted target (hip-emu's counters).

use super::DEVICE_LOSS_RTOL;
use crate::backend::Backend;
use crate::device_backend::DeviceBackend;
use crate::tests::lora::{compare, lora_flags, reference};
use crate::tests::{run_tiny, Scratch};
use crate::train::StepLog;
use hip_kernels::hip_rt::emu::{self, StatsScope};

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

/// `--graph` with the backward's row groups (16 × 32 = 512 rows at rank 4: `lora_gradw` takes
/// its f32 partials from the allocator inside the captured step): the same losses and norms,
/// bit for bit, as eager steps.
#[test]
fn lora_graph_steps_with_row_groups_equal_eager_ones() {
    use hip_kernels::ops::lora_gemm::plan::GradwPlan;
    // The widest adapted output (mlp.c_fc, 128 columns): two groups whatever the CU count.
    assert_eq!(GradwPlan::new(512, 128, 4, 4, 1).groups, 2);
    assert_eq!(GradwPlan::new(512, 128, 4, 4, 1024).groups, 2);
    let run = |mode: &str| {
        on_device(&["--batch", "16", "--seq", "32", "--steps", "3", mode])
            .iter()
            .map(|l| (l.step, l.loss.to_bits(), l.grad_norm.to_bits()))
            .collect::<Vec<_>>()
    };
    let (graph, eager) = (run("--graph"), run("--no-graph"));
    assert_eq!(graph.len(), 3);
    assert_eq!(graph, eager);
}

/// Kernel launches `f` queues from this thread (hip-emu's counters; `None` off hip-emu).
fn launches(f: impl FnOnce()) -> Option<u64> {
    let before = emu::stats(StatsScope::Thread)?;
    f();
    Some(emu::stats(StatsScope::Thread)?.since(&before).launches)
}

/// The launches of one adapted target's forward and backward on the device backend: GPT-2's
/// `attn.c_attn` (its whole `[N, 3C]` output) and qwen2's `k_proj` (the k column block of the
/// stacked q/k/v output), at 64 rows (one row group) and 2048 rows (the row reductions split
/// into groups, one more launch). At most 3 forward and 4 backward (issue 35); the skinny
/// kernels take 2 forward and 3 or 4 backward.
#[test]
fn one_adapted_target_takes_2_launches_forward_and_3_or_4_backward() {
    use crate::llama::lora::{seeded, LlamaAdapters, LlamaLora};
    use crate::llama::Linear;
    use crate::lora::adapters::Adapters;
    use crate::lora::{init, HostAdapters, LoraConfig, Target};
    let be = DeviceBackend::new(0, 1).unwrap();
    if emu::stats(StatsScope::Thread).is_none() {
        eprintln!("not hip-emu: no launch counters, skipped");
        return;
    }
    let data = crate::tests::data_dir();
    let gpt = crate::config::GptConfig::load(&data.join("model/config.json")).unwrap();
    let qwen =
        match crate::config::ModelConfig::load(&data.join("../train_llama/qwen2/config.json"))
            .unwrap()
        {
            crate::config::ModelConfig::Llama(c) => c,
            crate::config::ModelConfig::Gpt2(_) => unreachable!("qwen2 is a LLaMA-family model"),
        };
    let zeros = |n: usize| Backend::<f32>::zeros::<f32>(&be, n).unwrap();
    for (rows, backward) in [(64, 3), (2048, 4)] {
        // GPT-2, attn.c_attn.
        let lora = LoraConfig {
            rank: 4,
            alpha: 8.0,
            targets: vec![Target::CAttn],
        };
        let host = HostAdapters::with_zero_moments(lora.clone(), init::seeded(&lora, &gpt, 1));
        let mut ad = Adapters::<f32, DeviceBackend>::new(&be, &gpt, &host, rows).unwrap();
        let (n_in, n_out) = Target::CAttn.dims(&gpt);
        let (x, dy) = (zeros(rows * n_in), zeros(rows * n_out));
        let (mut y, mut dx) = (zeros(rows * n_out), zeros(rows * n_in));
        let fwd = launches(|| ad.forward(&be, 0, Target::CAttn, &x, &mut y).unwrap()).unwrap();
        let bwd = launches(|| {
            ad.backward(&be, 0, Target::CAttn, &x, &dy, &mut dx)
                .unwrap()
        })
        .unwrap();
        println!("gpt2 attn.c_attn, {rows} rows: forward {fwd} launches, backward {bwd} (hip-emu)");
        assert_eq!((fwd, bwd), (2, backward), "gpt2, {rows} rows");
        // qwen2, k_proj.
        let lora = LlamaLora {
            rank: 4,
            alpha: 8.0,
            targets: vec![Linear::K],
        };
        let params = seeded(&lora, &qwen, 1);
        let moments: Vec<Vec<f32>> = params.iter().map(|p| vec![0.0; p.len()]).collect();
        let mut ad = LlamaAdapters::<f32, DeviceBackend>::new(
            &be,
            &qwen,
            lora,
            [&params, &moments, &moments],
            rows,
        )
        .unwrap();
        let site = crate::llama::lora::site(&qwen, Linear::K);
        assert!(site.offset > 0 && site.width > site.outputs, "{site:?}");
        let x = zeros(rows * site.inputs);
        let (mut qkv, mut dqkv, mut dx) = (
            zeros(rows * site.width),
            zeros(rows * site.width),
            zeros(rows * site.inputs),
        );
        let fwd = launches(|| ad.forward(&be, 0, Linear::K, &x, &mut qkv).unwrap()).unwrap();
        let bwd = launches(|| {
            ad.backward(&be, 0, Linear::K, &x, &mut dqkv, &mut dx)
                .unwrap()
        })
        .unwrap();
        println!("qwen2 k_proj, {rows} rows: forward {fwd} launches, backward {bwd} (hip-emu)");
        assert_eq!((fwd, bwd), (2, backward), "qwen2, {rows} rows");
    }
}
