//! Data parallelism. The usage errors need no device; the rest runs in the device suite
//! (`--features device`) on hip-emu's emulated devices and RCCL (four devices, set by
//! [`super::emu_setup`]): emulated, so these tests check what the ranks compute, never speed.
//!
//! A W-device run with `--batch B` must reproduce the one-device run with `--batch W·B` step
//! for step (the spec's 1e-5 in f32), end with bit-identical parameters on every rank, write
//! checkpoints that resume on another number of devices, and do the same from one process per
//! device launched with torchrun's variables.

use super::{run_tiny, strs};
use crate::error::TrainError;

/// `--device N` with `--devices`, a device listed twice, a ZeRO stage past 2, `--zero 2` on one
/// rank and ZeRO with LoRA (stage 1 or 2) are usage errors (exit status 2), found before any device is touched.
#[test]
fn device_and_devices_together_are_usage_errors() {
    for (flags, needle) in [
        (
            &["--device", "0", "--devices", "0,1"][..],
            "--device 0 with --devices 0,1",
        ),
        (&["--devices", "1,1"][..], "device 1 is listed twice"),
        (
            &["--devices", "0,1", "--zero", "3"][..],
            "--zero 3: only stages 0",
        ),
        (&["--zero", "2"][..], "--zero 2 with 1 rank"),
        (
            &["--devices", "0,1", "--zero", "2", "--lora-rank", "4"][..],
            "--zero 2 with --lora-rank 4",
        ),
        (
            &["--devices", "0,1", "--zero", "2", "--bucket-mb", "0"][..],
            "--bucket-mb 0: must be a positive",
        ),
        (
            &["--devices", "0,1", "--zero", "1", "--lora-rank", "4"][..],
            "--zero 1 with --lora-rank 4",
        ),
    ] {
        let mut f = strs(&["--seq", "16", "--steps", "1"]);
        f.extend(strs(flags));
        match run_tiny(&f) {
            Err(e @ TrainError::Usage(_)) => {
                assert_eq!(e.exit_code(), 2);
                assert!(e.to_string().contains(needle), "{e}");
            }
            other => panic!("{flags:?}: expected a usage error, got {other:?}"),
        }
    }
}

#[cfg(feature = "device")]
mod on_devices {
    use super::super::{args_with, data_dir, emu_setup, run_tiny, serial, strs, Scratch};
    use crate::parallel::run_devices;
    use crate::train::{RankOutcome, StepLog};

    /// The spec's bound between W ranks and one device with the global batch, f32: the two runs
    /// differ only in summation order (a sum across ranks of per-rank gradient sums).
    const DDP_RTOL: f64 = 1e-5;
    /// The device suite's bound against PyTorch's float64 figures (issue 14).
    const DEVICE_LOSS_RTOL: f64 = 1e-4;
    /// Steps per run: on hip-emu a tiny-model step of one device takes about a second. Three
    /// give a first step, a step after it and a third for the runs resumed from step 1's
    /// checkpoint to continue over two steps.
    const STEPS: &str = "3";

    fn flags(batch: usize, extra: &[&str]) -> Vec<String> {
        let mut f = strs(&["--seq", "16", "--lr", "1e-2", "--steps", STEPS]);
        f.extend(strs(&["--batch", &batch.to_string()]));
        f.extend(strs(extra));
        f
    }

    /// `world` ranks of `--batch batch` in this process, with their final parameters.
    fn ranks(world: usize, batch: usize, extra: &[&str]) -> Vec<RankOutcome> {
        let (args, list) = ranks_args(world, batch, extra);
        run_devices(&args, &list, true).unwrap()
    }

    /// [`ranks`], run once per process (`tests::ranks_once`): for the runs that
    /// `tests::offload`'s ZeRO 2 test compares too.
    fn ranks_shared(world: usize, batch: usize, extra: &[&str]) -> Vec<RankOutcome> {
        let (args, list) = ranks_args(world, batch, extra);
        super::super::ranks_once(&args, &list)
    }

    fn ranks_args(world: usize, batch: usize, extra: &[&str]) -> (crate::cli::Args, Vec<usize>) {
        emu_setup();
        let list: Vec<usize> = (0..world).collect();
        let mut f = flags(batch, extra);
        let names: Vec<String> = list.iter().map(|d| d.to_string()).collect();
        f.extend(["--devices".to_string(), names.join(",")]);
        let d = data_dir();
        (args_with(&d.join("model"), &d.join("tokens.bin"), &f), list)
    }

    /// One device, `--batch batch`.
    fn single(batch: usize, extra: &[&str]) -> Vec<StepLog> {
        let mut f = flags(batch, extra);
        f.extend(strs(&["--device", "0"]));
        run_tiny(&f).unwrap()
    }

    fn rel(a: f64, b: f64) -> f64 {
        (a - b).abs() / b.abs().max(1e-30)
    }

    /// Step for step: the same steps, learning rates and skips; loss and (on steps not skipped)
    /// grad_norm within `tol`; returns the largest relative differences.
    fn assert_close(what: &str, got: &[StepLog], want: &[StepLog], tol: f64) -> (f64, f64) {
        assert_eq!(got.len(), want.len(), "{what}: steps");
        let (mut dl, mut dn) = (0.0f64, 0.0f64);
        for (g, w) in got.iter().zip(want) {
            assert_eq!((g.step, g.lr), (w.step, w.lr), "{what}");
            assert_eq!(
                g.scaler, w.scaler,
                "{what}: step {} loss scale / skip",
                g.step
            );
            dl = dl.max(rel(g.loss, w.loss));
            if w.grad_norm.is_finite() {
                dn = dn.max(rel(g.grad_norm, w.grad_norm));
            }
        }
        assert!(
            dl <= tol && dn <= tol,
            "{what}: loss {dl:e}, grad_norm {dn:e} > {tol:e}"
        );
        (dl, dn)
    }

    /// Every rank ends with the same parameters, bit for bit, and logged the same figures.
    fn assert_ranks_agree(what: &str, outs: &[RankOutcome]) {
        let first = outs[0].params.as_ref().expect("rank 0's parameters");
        for (r, o) in outs.iter().enumerate().skip(1) {
            let p = o.params.as_ref().expect("the rank's parameters");
            for (i, (a, b)) in first.iter().iter().zip(p.iter()).enumerate() {
                let same = a.len() == b.len()
                    && a.iter()
                        .zip(b.iter())
                        .all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(same, "{what}: rank {r}'s tensor {i} differs from rank 0's");
            }
            let key = |l: &StepLog| (l.loss.to_bits(), l.grad_norm.to_bits());
            let ours: Vec<_> = o.logs.iter().map(key).collect();
            let theirs: Vec<_> = outs[0].logs.iter().map(key).collect();
            assert_eq!(ours, theirs, "{what}: rank {r}'s step figures");
        }
        assert!(outs[0].logs.iter().all(|l| l.world_size == outs.len()));
    }

    /// How the last step's gradients were summed: without ZeRO every rank holds every sum
    /// (all-reduce); with `--zero 1` each tensor's sum lands on its owner only (a reduce to
    /// it), so the other rank still holds its own contribution, which differs. The owner's
    /// buffer is the all-reduced one.
    fn assert_grads_reduced_to_owners(dtype: &str, plain: &[RankOutcome], zero: &[RankOutcome]) {
        // Bit patterns: f16's overflowed steps leave NaN, which equals nothing.
        let grads = |o: &RankOutcome| {
            let g = o.grads.as_ref().expect("the rank's gradients");
            let bits = |t: &Vec<f32>| t.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
            g.iter().into_iter().map(bits).collect::<Vec<_>>()
        };
        let (p0, p1) = (grads(&plain[0]), grads(&plain[1]));
        assert!(
            p0 == p1,
            "{dtype}: all-reduced gradients differ across ranks"
        );
        let (z0, z1) = (grads(&zero[0]), grads(&zero[1]));
        let lens: Vec<usize> = p0.iter().map(|t| t.len()).collect();
        let owners = crate::model::zero_owners(&lens, 2);
        assert!(owners.contains(&0) && owners.contains(&1), "{owners:?}");
        for (i, &owner) in owners.iter().enumerate() {
            let (mine, other) = match owner {
                0 => (&z0, &z1),
                _ => (&z1, &z0),
            };
            let (sum, own, other) = (&p0[i], &mine[i], &other[i]);
            // Booleans: the tensors are too long to print.
            assert!(
                own == sum,
                "{dtype}: tensor {i}: its owner {owner} lacks the sum"
            );
            assert!(
                other != sum,
                "{dtype}: tensor {i}: the rank that does not own it (owner {owner}) holds the \
                 sum: the gradient was all-reduced, not reduced to its owner"
            );
        }
    }

    fn reference_losses() -> Vec<f64> {
        reference_losses_in("ref_base.jsonl")
    }

    /// Every step's loss of a PyTorch figures file under tests/data/train_gpt2.
    fn reference_losses_in(file: &str) -> Vec<f64> {
        std::fs::read_to_string(data_dir().join(file))
            .unwrap()
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["loss"]
                    .as_f64()
                    .unwrap()
            })
            .collect()
    }

    /// LoRA on 2 devices (only the adapters' gradients are summed across ranks) follows one
    /// device with the global batch, and PyTorch's LoRA figures (tests/data/train_gpt2/lora:
    /// rank 4, alpha 8, all four targets, weight decay and clipping). The ranks' merged models
    /// are compared bit for bit.
    #[test]
    fn lora_on_two_devices_reproduces_one_device_with_the_global_batch() {
        let _s = serial();
        let init = data_dir().join("lora").join("init.safetensors");
        let init = init.to_str().expect("a UTF-8 path");
        let extra = [
            "--weight-decay",
            "0.1",
            "--grad-clip",
            "0.5",
            "--lora-rank",
            "4",
            "--lora-alpha",
            "8",
            "--lora-targets",
            "attn.c_attn,attn.c_proj,mlp.c_fc,mlp.c_proj",
            "--lora-init",
            init,
        ];
        let what = "LoRA on 2 devices × --batch 2";
        let one = single(4, &extra);
        let outs = ranks(2, 2, &extra);
        assert_ranks_agree(what, &outs);
        let (dl, dn) = assert_close(what, &outs[0].logs, &one, DDP_RTOL);
        let refs = reference_losses_in("lora/ref_lora.jsonl");
        for l in &outs[0].logs {
            let r = refs[l.step as usize - 1];
            assert!(
                rel(l.loss, r) <= DEVICE_LOSS_RTOL,
                "{what}: step {} loss {} vs PyTorch {r}",
                l.step,
                l.loss
            );
        }
        eprintln!("{what} vs one device --batch 4: loss {dl:e}, grad_norm {dn:e}");
    }

    #[test]
    fn bf16_and_f16_on_two_devices_follow_one_device() {
        let _s = serial();
        // f16: a first scale of 2^20 overflows step 1's gradients (on hip-emu step 2's too;
        // skipped, scale halved), and the 3rd step updates: every rank must skip the same steps
        // as one device. (A first scale of 2^24 overflowed all of 4 steps.)
        let f16 = [
            "--dtype",
            "f16",
            "--scale-init",
            "1048576",
            "--scale-window",
            "2",
        ];
        // Measured on hip-emu over 3 steps: bf16 3.8e-5 (loss) and 1.1e-4 (grad_norm),
        // f16 1.0e-7 and 2.3e-6; the bounds leave margin for the rounding of the 16-bit sums across ranks.
        for (extra, tol) in [(&["--dtype", "bf16"][..], 2e-3), (&f16[..], 1e-3)] {
            let what = format!("2 devices {extra:?}");
            let one = single(4, extra);
            let outs = ranks(2, 2, extra);
            assert_ranks_agree(&what, &outs);
            if extra.contains(&"f16") {
                let skips: Vec<_> = outs[0].logs.iter().map(|l| l.scaler).collect();
                eprintln!("{what}: (loss scale, skipped) per step {skips:?}");
                assert!(
                    skips.iter().any(|s| s.map(|s| s.1) == Some(false)),
                    "{what}: every step skipped"
                );
                assert_eq!(
                    outs[0].logs[0].scaler.map(|s| s.1),
                    Some(true),
                    "{what}: step 1"
                );
            }
            let (dl, dn) = assert_close(&what, &outs[0].logs, &one, tol);
            eprintln!("{what} vs one device: loss {dl:e}, grad_norm {dn:e}");
        }
    }

    /// 2 and 4 devices follow one device with the global batch (and PyTorch's figures), and
    /// their checkpoints resume on another number of devices. The runs that write the
    /// checkpoints are the ones compared (saving changes no step's figures).
    #[test]
    fn two_and_four_devices_reproduce_one_device_and_resume_across_world_sizes() {
        let _s = serial();
        let s = Scratch::new("ddp-resume");
        let (two_dir, one_dir) = (s.path("two"), s.path("one"));
        let (two_ck, one_ck) = (two_dir.display().to_string(), one_dir.display().to_string());
        let save = |dir: &str| ["--checkpoint-dir", dir, "--save-every", "1"].map(String::from);
        let two = ranks(2, 2, &save(&two_ck).each_ref().map(|x| x.as_str()));
        let one = single(4, &save(&one_ck).each_ref().map(|x| x.as_str()));
        let refs = reference_losses();
        for (world, batch) in [(2, 2), (4, 1)] {
            let what = format!("{world} devices × --batch {batch}");
            let four;
            let outs = match world {
                2 => &two,
                _ => {
                    four = ranks(world, batch, &[]);
                    &four
                }
            };
            assert_ranks_agree(&what, outs);
            let (dl, dn) = assert_close(&what, &outs[0].logs, &one, DDP_RTOL);
            for l in &outs[0].logs {
                let r = refs[l.step as usize - 1];
                assert!(
                    rel(l.loss, r) <= DEVICE_LOSS_RTOL,
                    "{what}: step {} vs PyTorch",
                    l.step
                );
            }
            eprintln!("{what} vs one device --batch 4: loss {dl:e}, grad_norm {dn:e}");
        }
        // A 2-device checkpoint on one device (global batch 4 = 1 × 4) ...
        let resumed_one = single(4, &["--resume", &format!("{two_ck}/step_1")]);
        assert_close("2 → 1 device", &resumed_one, &two[0].logs[1..], DDP_RTOL);
        // ... and a one-device checkpoint on two devices (2 × 2).
        let resumed_two = ranks(2, 2, &["--resume", &format!("{one_ck}/step_1")]);
        assert_ranks_agree("1 → 2 devices", &resumed_two);
        assert_close("1 → 2 devices", &resumed_two[0].logs, &one[1..], DDP_RTOL);
        // Another global batch is refused, naming it.
        let mut f = flags(4, &["--resume", &format!("{two_ck}/step_1")]);
        f.extend(strs(&["--devices", "0,1"]));
        let err = run_tiny(&f).unwrap_err();
        assert!(err.to_string().contains("2 ranks × --batch 4 = 8"), "{err}");
    }

    #[test]
    fn zero_1_gives_the_same_steps_and_checkpoints_with_less_memory_per_rank() {
        // The memory per rank compared below is the device's: alone in a process.
        if super::super::alone(
            "tests::parallel::on_devices::zero_1_gives_the_same_steps_and_checkpoints_with_less_memory_per_rank",
        ) {
            return;
        }
        let _s = serial();
        let sc = Scratch::new("ddp-zero");
        // f16: a first scale of 2^20 overflows step 1's gradients (on hip-emu step 2's too);
        // with --zero 1 every rank must still skip it (the norm combined across ranks is
        // non-finite on all of them). The 3rd step, whose gradients are compared below, updates.
        let f16 = ["--scale-init", "1048576", "--scale-window", "2"];
        for (dtype, extra) in [("f32", &[][..]), ("bf16", &[][..]), ("f16", &f16[..])] {
            let (plain_dir, zero_dir) = (
                sc.path(&format!("plain-{dtype}")),
                sc.path(&format!("zero-{dtype}")),
            );
            let (p, z) = (
                plain_dir.display().to_string(),
                zero_dir.display().to_string(),
            );
            let common = ["--dtype", dtype, "--save-every", "2", "--checkpoint-dir"];
            let plain = ranks(2, 2, &[&common[..], &[p.as_str()], extra].concat());
            let zero = ranks(
                2,
                2,
                &[&common[..], &[z.as_str(), "--zero", "1"], extra].concat(),
            );
            assert_ranks_agree(&format!("--zero 1 {dtype}"), &zero);
            assert_grads_reduced_to_owners(dtype, &plain, &zero);
            if dtype == "f16" {
                assert_eq!(zero[0].logs[0].scaler.map(|s| s.1), Some(true), "step 1");
            }
            // The owner of each tensor runs the same update: the same figures, the same
            // parameters, and the same checkpoint files. Bit for bit here, though the norm is
            // combined from the ranks' norms over their shares (√(Σ norm²), another summation
            // order): its rounding matched on these steps; the spec only asks for 1e-5.
            let key = |l: &StepLog| (l.loss.to_bits(), l.grad_norm.to_bits());
            let (a, b): (Vec<_>, Vec<_>) = (
                plain[0].logs.iter().map(key).collect(),
                zero[0].logs.iter().map(key).collect(),
            );
            assert_eq!(a, b, "{dtype}: --zero 1 changed the steps");
            assert_eq!(
                plain[0].params, zero[0].params,
                "{dtype}: --zero 1 changed the parameters"
            );
            for f in ["model.safetensors", "optimizer.safetensors"] {
                let last = format!("step_{}", plain[0].logs.len());
                let read = |d: &std::path::Path| std::fs::read(d.join(&last).join(f)).unwrap();
                assert!(
                    read(&plain_dir) == read(&zero_dir),
                    "{dtype}: {f} differs with --zero 1"
                );
            }
            // Each rank holds about half of the AdamW moments (and, in bf16, master weights).
            let per_param = if dtype == "f32" { 8 } else { 12 };
            let state = 29568 * per_param;
            let mem =
                |o: &[RankOutcome], r: usize| o[r].logs.last().unwrap().mem.unwrap().allocated;
            for r in 0..2 {
                let drop = mem(&plain, r) as f64 - mem(&zero, r) as f64;
                eprintln!(
                    "{dtype} rank {r}: mem_allocated {} without --zero, {} with --zero 1 (drop {drop} of {state} bytes of state)",
                    mem(&plain, r),
                    mem(&zero, r)
                );
                assert!(
                    (0.25..=0.75).contains(&(drop / state as f64)),
                    "{dtype} rank {r}: dropped {drop} of {state} bytes"
                );
            }
        }
        // Four ranks, each reducing to and gathering from three others.
        let (plain, zero) = (ranks(4, 1, &[]), ranks(4, 1, &["--zero", "1"]));
        assert_ranks_agree("--zero 1 on 4 devices", &zero);
        let (dl, dn) = assert_close(
            "--zero 1 on 4 devices",
            &zero[0].logs,
            &plain[0].logs,
            DDP_RTOL,
        );
        eprintln!("--zero 1 on 4 devices vs without: loss {dl:e}, grad_norm {dn:e}");
    }

    /// `--zero 2` with buckets of 0.01 MiB (2621 f32 elements: the tiny model's 29568
    /// parameters make about a dozen buckets).
    const ZERO2: [&str; 4] = ["--zero", "2", "--bucket-mb", "0.01"];

    #[test]
    fn zero_2_gives_the_steps_of_the_plain_run_with_a_share_of_the_gradients() {
        // The memory per rank compared below is the device's: alone in a process.
        // In one process with `tests::offload`'s ZeRO 2 test, which compares the same plain and
        // --zero 2 runs (f32 and bf16 on 2 ranks, f32 on 4).
        if super::super::alone_with(
            "tests::parallel::on_devices::zero_2_gives_the_steps_of_the_plain_run_with_a_share_of_the_gradients",
            &super::super::ZERO_2_GROUP,
        ) {
            return;
        }
        let _s = serial();
        const PARAMS: usize = 29568;
        for dtype in ["f32", "bf16"] {
            let common = ["--dtype", dtype];
            let plain = ranks_shared(2, 2, &common);
            let zero = ranks_shared(2, 2, &[&common[..], &ZERO2[..]].concat());
            let what = format!("--zero 2 {dtype}");
            assert_ranks_agree(&what, &zero);
            let (dl, dn) = assert_close(&what, &zero[0].logs, &plain[0].logs, DDP_RTOL);
            eprintln!("{what} vs without: loss {dl:e}, grad_norm {dn:e}");
            // Between steps a rank holds half of the gradients (storage type) and of the
            // optimizer state (f32 moments, and in bf16 the f32 master weights): one buffer of
            // ⌈P/2⌉ elements each instead of one per tensor, each rounded as the caching
            // allocator does (512 B, after hip-emu's guard byte).
            let (t, groups) = match dtype {
                "f32" => (4, 2),
                _ => (2, 3),
            };
            let guard = usize::from(hip_rt::emu::is_hip_emu());
            let round = |bytes: usize| (bytes + guard).div_ceil(512) * 512;
            let lens: Vec<usize> = plain[0]
                .params
                .as_ref()
                .unwrap()
                .iter()
                .iter()
                .map(|p| p.len())
                .collect();
            assert_eq!(lens.iter().sum::<usize>(), PARAMS);
            let per_tensor: usize = lens
                .iter()
                .map(|&n| round(n * t) + groups * round(n * 4))
                .sum();
            let shard = PARAMS.div_ceil(2);
            let sharded = round(shard * t) + groups * round(shard * 4);
            let mem = |o: &[RankOutcome], r: usize| o[r].logs.last().unwrap().mem.unwrap();
            for r in 0..2 {
                let (p, z) = (mem(&plain, r), mem(&zero, r));
                let drop = p.allocated as f64 - z.allocated as f64;
                let expected = (per_tensor - sharded) as f64;
                eprintln!(
                    "{what} rank {r}: mem_allocated {} without --zero, {} with --zero 2 \
                     (drop {drop}, expected {expected}); mem_peak {} vs {}",
                    p.allocated, z.allocated, p.peak, z.peak
                );
                assert!(
                    (0.95..=1.05).contains(&(drop / expected)),
                    "{what} rank {r}: dropped {drop} bytes, expected about {expected}"
                );
                assert!(z.peak < p.peak, "{what} rank {r}: mem_peak did not drop");
            }
            // Two micro-batches a step: each one's buckets go to their owners and add into
            // the shard, so the peak stays that of one micro-batch a step (holding every
            // gradient until the last micro-batch would add the others' share, (P - ⌈P/2⌉)
            // elements, to it); between steps the same shard.
            let accum = ranks(
                2,
                2,
                &[&common[..], &ZERO2[..], &["--grad-accum", "2"]].concat(),
            );
            let what = format!("--zero 2 --grad-accum 2 {dtype}");
            assert_ranks_agree(&what, &accum);
            // The same steps as the plain run with two micro-batches: it sums a rank's
            // micro-batches, then the ranks; ZeRO 2 sums the ranks of each micro-batch, then
            // the micro-batches (docs/MEMORY.md): in bf16 the gradients differ by that storage
            // rounding, in f32 by summation order only.
            let plain_accum = ranks(2, 2, &[&common[..], &["--grad-accum", "2"]].concat());
            let tol = match dtype {
                "f32" => DDP_RTOL,
                _ => hip_kernels::tolerance::unit_roundoff(hip_kernels::params::DType::BF16),
            };
            let (dl, dn) = assert_close(&what, &accum[0].logs, &plain_accum[0].logs, tol);
            eprintln!("{what} vs without: loss {dl:e}, grad_norm {dn:e}");
            let others = ((PARAMS - shard) * t) as f64;
            for r in 0..2 {
                let (z, a) = (mem(&zero, r), mem(&accum, r));
                let (grow, held) = (a.peak as f64 - z.peak as f64, a.allocated as f64);
                eprintln!(
                    "{what} rank {r}: mem_peak {} (--grad-accum 1: {}, +{grow}; the others' \
                     gradients: {others}); mem_allocated {held} vs {}",
                    a.peak, z.peak, z.allocated
                );
                assert!(
                    grow < others / 4.0,
                    "{what} rank {r}: mem_peak grew by {grow} bytes over one micro-batch a step"
                );
                assert_eq!(a.allocated, z.allocated, "{what} rank {r}: mem_allocated");
            }
        }
        // Four ranks.
        let f32 = ["--dtype", "f32"];
        let (plain, zero) = (
            ranks_shared(4, 1, &f32),
            ranks_shared(4, 1, &[&f32[..], &ZERO2[..]].concat()),
        );
        assert_ranks_agree("--zero 2 on 4 devices", &zero);
        let (dl, dn) = assert_close(
            "--zero 2 on 4 devices",
            &zero[0].logs,
            &plain[0].logs,
            DDP_RTOL,
        );
        eprintln!("--zero 2 on 4 devices vs without: loss {dl:e}, grad_norm {dn:e}");
    }

    /// `--zero 2 --grad-accum 2` in f16 with overflowing first steps skips them as the plain
    /// run does (f32 and bf16 with two micro-batches are compared with the plain run in
    /// [`zero_2_gives_the_steps_of_the_plain_run_with_a_share_of_the_gradients`], beside their
    /// memory).
    #[test]
    fn zero_2_with_gradient_accumulation_and_f16_skips_follows_the_plain_run() {
        let _s = serial();
        // f16 with a first scale of 2^20, two micro-batches a step: step 1 (and on hip-emu
        // step 2) overflows in the shards' sums and every rank skips it; the later step
        // updates.
        let f16 = [
            "--dtype",
            "f16",
            "--scale-init",
            "1048576",
            "--scale-window",
            "2",
            "--grad-accum",
            "2",
        ];
        let plain = ranks(2, 2, &f16);
        let zero = ranks(2, 2, &[&f16[..], &ZERO2[..]].concat());
        assert_ranks_agree("--zero 2 f16", &zero);
        assert_eq!(zero[0].logs[0].scaler.map(|s| s.1), Some(true), "step 1");
        assert!(
            zero[0]
                .logs
                .iter()
                .any(|l| l.scaler.map(|s| s.1) == Some(false)),
            "--zero 2 f16: every step skipped"
        );
        let skips: Vec<_> = zero[0].logs.iter().map(|l| l.scaler).collect();
        eprintln!("--zero 2 --grad-accum 2 f16: (loss scale, skipped) per step {skips:?}");
        // The order of the sums, as bf16's in
        // [`zero_2_gives_the_steps_of_the_plain_run_with_a_share_of_the_gradients`]: within
        // f16's unit roundoff.
        let tol = hip_kernels::tolerance::unit_roundoff(hip_kernels::params::DType::F16);
        let (dl, dn) = assert_close("--zero 2 f16", &zero[0].logs, &plain[0].logs, tol);
        eprintln!("--zero 2 --grad-accum 2 f16 vs without: loss {dl:e}, grad_norm {dn:e}");
    }

    #[test]
    fn zero_2_checkpoints_resume_across_stages_and_world_sizes() {
        let _s = serial();
        let s = Scratch::new("ddp-zero2-resume");
        let ck = s.path("z2").display().to_string();
        let save = ["--checkpoint-dir", ck.as_str(), "--save-every", "1"];
        let z2 = ranks(2, 2, &[&ZERO2[..], &save[..]].concat());
        let from = format!("{ck}/step_1");
        // On one device without ZeRO (global batch 4 = 1 × 4) ...
        let one = single(4, &["--resume", &from]);
        assert_close("--zero 2 → 1 device", &one, &z2[0].logs[1..], DDP_RTOL);
        // ... on two with ZeRO 1 ...
        let z1 = ranks(2, 2, &["--resume", &from, "--zero", "1"]);
        assert_close(
            "--zero 2 → --zero 1",
            &z1[0].logs,
            &z2[0].logs[1..],
            DDP_RTOL,
        );
        // ... and on four with ZeRO 2 (4 × 1).
        let four = ranks(
            4,
            1,
            &[&["--resume", from.as_str()][..], &ZERO2[..]].concat(),
        );
        assert_ranks_agree("--zero 2 on 2 → 4 devices", &four);
        assert_close(
            "--zero 2 on 2 → 4",
            &four[0].logs,
            &z2[0].logs[1..],
            DDP_RTOL,
        );
    }

    /// The child side of [`two_processes_through_the_launcher_variables`] and
    /// [`a_killed_rank_makes_the_other_exit_naming_it`]: its `--log` (empty: none).
    const CHILD_LOG: &str = "TRAIN_GPT2_TEST_CHILD_LOG";
    /// The child's `--steps` (default [`STEPS`]).
    const CHILD_STEPS: &str = "TRAIN_GPT2_TEST_CHILD_STEPS";

    /// Start rank `rank` of 2 as a child running test `name` with the launcher variables.
    fn spawn_rank(
        name: &str,
        rank: usize,
        port: u16,
        log: &str,
        steps: &str,
    ) -> std::process::Child {
        std::process::Command::new(std::env::current_exe().unwrap())
            .args([name, "--exact", "--test-threads=1", "--nocapture"])
            .env(CHILD_LOG, log)
            .env(CHILD_STEPS, steps)
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("WORLD_SIZE", "2")
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env("HIPK_RDZV_SECRET", "parallel-tests-secret-0123456789")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn a rank")
    }

    /// A child rank: the tiny model with `--batch 2` and the parent's `--log` and `--steps`.
    /// Returns false in the parent (the variables are not set there).
    fn child_rank() -> bool {
        let Ok(log) = std::env::var(CHILD_LOG) else {
            return false;
        };
        let steps = std::env::var(CHILD_STEPS).unwrap_or_else(|_| STEPS.into());
        let mut f = flags(2, &["--steps", &steps]);
        if !log.is_empty() {
            f.extend(["--log".to_string(), log]);
        }
        run_tiny(&f).unwrap();
        true
    }

    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port()
    }

    #[test]
    fn a_killed_rank_makes_the_other_exit_naming_it() {
        const NAME: &str =
            "tests::parallel::on_devices::a_killed_rank_makes_the_other_exit_naming_it";
        if child_rank() {
            return;
        }
        let _s = serial();
        emu_setup();
        let port = free_port();
        let mut rank1 = spawn_rank(NAME, 1, port, "", "1000");
        let mut rank0 = spawn_rank(NAME, 0, port, "", "1000");
        // Wait for rank 0's second step, then kill rank 1.
        let out0 = rank0.stdout.take().unwrap();
        let mut lines = std::io::BufRead::lines(std::io::BufReader::new(out0));
        let mut seen = String::new();
        for line in lines.by_ref() {
            let line = line.unwrap();
            seen += &line;
            seen.push('\n');
            if line.starts_with("step 2/") {
                break;
            }
        }
        assert!(
            seen.contains("step 2/"),
            "rank 0 never reached step 2:\n{seen}"
        );
        rank1.kill().unwrap();
        let _ = rank1.wait();
        let t0 = std::time::Instant::now();
        let rest: Vec<String> = lines.map_while(|l| l.ok()).collect();
        let status = rank0.wait().unwrap();
        let mut err = String::new();
        std::io::Read::read_to_string(&mut rank0.stderr.take().unwrap(), &mut err).unwrap();
        assert!(
            !status.success(),
            "rank 0 finished 1000 steps without rank 1"
        );
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(60),
            "rank 0 took {:?} to notice",
            t0.elapsed()
        );
        let all = format!("{seen}{}\n{err}", rest.join("\n"));
        assert!(
            all.contains("rank 1"),
            "rank 0's error does not name rank 1:\n{all}"
        );
    }

    #[test]
    fn two_processes_through_the_launcher_variables() {
        const NAME: &str =
            "tests::parallel::on_devices::two_processes_through_the_launcher_variables";
        if child_rank() {
            return;
        }
        let _s = serial();
        emu_setup();
        let s = Scratch::new("ddp-procs");
        let log = s.path("rank0.jsonl");
        let port = free_port();
        let children: Vec<_> = (0..2)
            .map(|rank| {
                let child_log = match rank {
                    0 => log.display().to_string(),
                    _ => String::new(),
                };
                spawn_rank(NAME, rank, port, &child_log, STEPS)
            })
            .collect();
        for (rank, c) in children.into_iter().enumerate() {
            let out = c.wait_with_output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "rank {rank} failed:\n{text}");
            let printed = text.contains("step 1/");
            assert_eq!(printed, rank == 0, "only rank 0 prints:\n{text}");
        }
        let one = single(4, &[]);
        let lines = std::fs::read_to_string(&log).unwrap();
        let logged: Vec<serde_json::Value> = lines
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(logged.len(), one.len());
        for (l, w) in logged.iter().zip(&one) {
            assert_eq!(l["world_size"], 2);
            let (loss, norm) = (
                l["loss"].as_f64().unwrap(),
                l["grad_norm"].as_f64().unwrap(),
            );
            assert!(
                rel(loss, w.loss) <= DDP_RTOL,
                "step {}: {loss} vs {}",
                w.step,
                w.loss
            );
            assert!(
                rel(norm, w.grad_norm) <= DDP_RTOL,
                "step {}: {norm}",
                w.step
            );
        }
    }
}
