//! `--offload-optimizer cpu`: the f32 master weights and AdamW moments in pinned host memory,
//! the update on the host. On hip-emu a run with it must follow the run without it within
//! 1e-6 relative per step (the host AdamW has the device kernel's formula and rounding order;
//! [`crate::tolerance`]-free: the bound is the issue's), on one device and on 2 emulated
//! devices, GPT-2 and the LLaMA family, f32 and bf16 (with master weights); the device's
//! `mem_allocated` after a step drops by exactly the optimizer state; checkpoints resume across
//! offload and no offload. With `--zero 2` a rank keeps only its shard's state on the host
//! and its gradient shard on the device: the same steps as `--zero 2` and as the plain run, on
//! 2 and 4 devices (threads) and 2 processes, and checkpoints resume across offload and stages.
//! Without a device the flag is a usage error, and so is it with LoRA (a choice: see
//! `crate::memory::check_flags`).

use super::{run_tiny, strs};
use crate::error::TrainError;

#[test]
fn offload_on_the_cpu_backend_is_a_usage_error_naming_the_flag() {
    let f = strs(&["--seq", "16", "--steps", "1", "--offload-optimizer", "cpu"]);
    match run_tiny(&f) {
        Err(e @ TrainError::Usage(_)) => {
            assert_eq!(e.exit_code(), 2);
            assert!(
                matches!(&e, TrainError::Usage(m) if m.starts_with("--offload-optimizer cpu")),
                "{e}"
            );
        }
        other => panic!("expected a usage error, got {other:?}"),
    }
    for (extra, needle) in [
        (
            &["--lora-rank", "4"][..],
            "--offload-optimizer cpu with --lora-rank 4: LoRA trains only the adapters",
        ),
        (&["--graph"][..], "--offload-optimizer cpu with --graph"),
    ] {
        let mut f = strs(&["--seq", "16", "--steps", "1", "--device", "0"]);
        f.extend(strs(&["--offload-optimizer", "cpu"]));
        f.extend(strs(extra));
        match run_tiny(&f) {
            Err(e @ TrainError::Usage(_)) => assert!(e.to_string().contains(needle), "{e}"),
            other => panic!("{extra:?}: expected a usage error, got {other:?}"),
        }
    }
}

#[cfg(feature = "device")]
mod on_device {
    use super::super::llama_train::variant_args;
    use super::super::{alone, args_with, data_dir, emu_setup, serial, strs, Scratch};
    use crate::cli::Args;
    use crate::parallel::run_devices;
    use crate::train::{run, StepLog};

    /// The bound per step between the host and the device AdamW (f32 rounding order).
    const OFFLOAD_RTOL: f64 = 1e-6;
    const OFFLOAD: [&str; 2] = ["--offload-optimizer", "cpu"];

    fn gpt2(extra: &[String]) -> Args {
        let d = data_dir();
        let mut f = strs(&[
            "--seq", "16", "--batch", "4", "--lr", "1e-2", "--steps", "3",
        ]);
        f.extend(extra.iter().cloned());
        args_with(&d.join("model"), &d.join("tokens.bin"), &f)
    }

    fn llama(extra: &[String]) -> Args {
        let mut f = strs(&["--steps", "3"]);
        f.extend(extra.iter().cloned());
        variant_args("llama_base", &f)
    }

    fn with(a: &[&str], b: &[&str]) -> Vec<String> {
        strs(&[a, b].concat())
    }

    /// Step for step: the same steps, learning rates and skips; loss and grad_norm within `tol`.
    fn assert_close(what: &str, got: &[StepLog], want: &[StepLog], tol: f64) -> f64 {
        assert_eq!(got.len(), want.len(), "{what}: steps");
        let rel = |a: f64, b: f64| (a - b).abs() / b.abs().max(1e-30);
        let mut worst = 0f64;
        for (g, w) in got.iter().zip(want) {
            assert_eq!((g.step, g.lr, g.scaler), (w.step, w.lr, w.scaler), "{what}");
            worst = worst.max(rel(g.loss, w.loss));
            if w.grad_norm.is_finite() {
                worst = worst.max(rel(g.grad_norm, w.grad_norm));
            }
            assert!(
                worst <= tol,
                "{what}, step {}: loss {} vs {}, norm {} vs {}",
                g.step,
                g.loss,
                w.loss,
                g.grad_norm,
                w.grad_norm
            );
        }
        worst
    }

    /// One device: losses as without offload; `mem_allocated` after a step lower by the
    /// optimizer state (2 f32 moments, and in bf16 the f32 master weights, per tensor, each
    /// rounded as the caching allocator does: 512 B after hip-emu's guard byte) and the device
    /// AdamW's tensor table.
    #[test]
    fn one_device_follows_the_plain_run_without_optimizer_state_on_the_device() {
        if alone("tests::offload::on_device::one_device_follows_the_plain_run_without_optimizer_state_on_the_device") {
            return;
        }
        emu_setup();
        type Maker<'a> = (&'a str, &'a dyn Fn(&[String]) -> Args);
        let makers: [Maker; 2] = [("gpt2", &gpt2), ("llama", &llama)];
        for (name, make) in makers {
            let lens = tensor_lens(make);
            for dtype in ["f32", "bf16"] {
                let dev = ["--device", "0", "--dtype", dtype];
                let plain = run(&make(&strs(&dev))).unwrap();
                let off = run(&make(&with(&dev, &OFFLOAD))).unwrap();
                let what = format!("{name} {dtype} offload");
                let worst = assert_close(&what, &off, &plain, OFFLOAD_RTOL);
                let groups = if dtype == "f32" { 2 } else { 3 };
                let guard = usize::from(hip_rt::emu::is_hip_emu());
                let round = |bytes: usize| (bytes + guard).div_ceil(512) * 512;
                let state: usize = lens.iter().map(|&n| groups * round(n * 4)).sum();
                let (p, o) = (
                    plain.last().unwrap().mem.unwrap(),
                    off.last().unwrap().mem.unwrap(),
                );
                let drop = p.allocated as i64 - o.allocated as i64;
                eprintln!(
                    "{what}: worst rel {worst:e}; mem_allocated {} → {} (drop {drop}, optimizer \
                     state {state}); mem_peak {} → {}",
                    p.allocated, o.allocated, p.peak, o.peak
                );
                // The optimizer state, plus the device-side AdamW table the plain run keeps
                // across steps (a few allocator blocks); LLaMA's final tensors (HF order) split
                // the trained elements differently, so their per-tensor rounding differs by a
                // few blocks: within 2 %.
                let ratio = drop as f64 / state as f64;
                assert!(
                    (0.98..=1.02).contains(&ratio),
                    "{what}: mem_allocated dropped {drop} bytes, the optimizer state is {state}"
                );
                assert!(o.peak < p.peak, "{what}: mem_peak did not drop");
            }
        }
    }

    /// The trained tensors' lengths of a model (from a one-step run's final parameters).
    fn tensor_lens(make: &dyn Fn(&[String]) -> Args) -> Vec<usize> {
        let a = make(&strs(&["--devices", "0", "--steps", "1"]));
        let out = run_devices(&a, &[0], true).unwrap();
        finals(&out[0]).iter().map(Vec::len).collect()
    }

    /// A rank's final f32 parameters (either model family).
    fn finals(o: &crate::train::RankOutcome) -> Vec<Vec<f32>> {
        match (&o.params, &o.tensors) {
            (Some(p), _) => p.iter().into_iter().cloned().collect(),
            (None, Some([t, _])) => t.clone(),
            _ => panic!("the rank's parameters were not kept"),
        }
    }

    /// Two emulated devices (threads), with ZeRO 1 (each rank keeps the host state of the
    /// tensors it owns), and LLaMA also without ZeRO: the ranks agree bit for bit, and follow
    /// the plain 2-rank run within the bound. (GPT-2 without ZeRO, f16's skip included, is
    /// checked beside `--zero 2` in
    /// [`zero_2_with_offload_follows_zero_2_and_keeps_only_the_gradient_shard`].)
    #[test]
    fn two_devices_with_zero_1_and_llama_follow_the_plain_run() {
        if alone(
            "tests::offload::on_device::two_devices_with_zero_1_and_llama_follow_the_plain_run",
        ) {
            return;
        }
        let _s = serial();
        let two = ["--batch", "2", "--devices", "0,1"];
        // GPT-2 f32, bf16 and f16 without ZeRO: in
        // [`zero_2_with_offload_follows_zero_2_and_keeps_only_the_gradient_shard`], beside the
        // --zero 2 runs of the same flags.
        let what = "gpt2 bf16 zero 1";
        let extra = [&two[..], &["--dtype", "bf16", "--zero", "1"]].concat();
        let plain = run_devices(&gpt2(&strs(&extra)), &[0, 1], true).unwrap();
        let off = run_devices(&gpt2(&with(&extra, &OFFLOAD)), &[0, 1], true).unwrap();
        assert_ranks_agree(what, &off);
        let worst = assert_close(what, &off[0].logs, &plain[0].logs, OFFLOAD_RTOL);
        eprintln!("{what} on 2 devices with offload: worst rel {worst:e}");
        for extra in [&two[..], &[&two[..], &["--zero", "1"]].concat()[..]] {
            let what = format!("llama f32 on 2 devices {extra:?}");
            let plain = run_devices(&llama(&strs(extra)), &[0, 1], true).unwrap();
            let off = run_devices(&llama(&with(extra, &OFFLOAD)), &[0, 1], true).unwrap();
            let worst = assert_close(&what, &off[0].logs, &plain[0].logs, OFFLOAD_RTOL);
            // The final parameters (ZeRO 1: gathered from the owners' host state) agree.
            let bits = |o| -> Vec<Vec<u32>> {
                finals(o)
                    .iter()
                    .map(|t| t.iter().map(|x| x.to_bits()).collect())
                    .collect()
            };
            assert!(
                bits(&off[0]) == bits(&off[1]),
                "{what}: the ranks' parameters differ"
            );
            eprintln!("{what} with offload: worst rel {worst:e}");
        }
    }

    /// The host state is the optimizer state saved: an offloaded run resumes bit for bit with
    /// offload, and within the bound without it; a plain checkpoint resumes with offload.
    #[test]
    fn checkpoints_resume_across_offload_and_no_offload() {
        emu_setup();
        let s = Scratch::new("offload-resume");
        let ck = s.path("off").display().to_string();
        let dev = ["--device", "0", "--dtype", "bf16", "--steps", "4"];
        let save = ["--checkpoint-dir", ck.as_str(), "--save-every", "2"];
        let full = run(&gpt2(&strs(&[&dev[..], &OFFLOAD[..], &save[..]].concat()))).unwrap();
        let from = format!("{ck}/step_2");
        let resume = ["--resume", from.as_str()];
        let again = run(&gpt2(&strs(
            &[&dev[..], &OFFLOAD[..], &resume[..]].concat(),
        )))
        .unwrap();
        let bits = |l: &[StepLog]| -> Vec<(u64, u64)> {
            l.iter()
                .map(|x| (x.loss.to_bits(), x.grad_norm.to_bits()))
                .collect()
        };
        assert_eq!(bits(&again), bits(&full[2..]), "offload → offload resume");
        let plain = run(&gpt2(&strs(&[&dev[..], &resume[..]].concat()))).unwrap();
        assert_close("offload → no offload", &plain, &full[2..], OFFLOAD_RTOL);
        // A checkpoint of a run without offload, resumed with it.
        let ck2 = s.path("plain").display().to_string();
        let save2 = ["--checkpoint-dir", ck2.as_str(), "--save-every", "2"];
        let base = run(&gpt2(&strs(&[&dev[..], &save2[..]].concat()))).unwrap();
        let from2 = format!("{ck2}/step_2");
        let off = run(&gpt2(&strs(
            &[&dev[..], &OFFLOAD[..], &["--resume", from2.as_str()][..]].concat(),
        )))
        .unwrap();
        assert_close("no offload → offload", &off, &base[2..], OFFLOAD_RTOL);
    }

    /// `--zero 2` with buckets of 0.01 MiB (2621 f32 elements: about a dozen buckets of the
    /// tiny GPT-2, so that the pieces go down bucket by bucket).
    const ZERO2: [&str; 4] = ["--zero", "2", "--bucket-mb", "0.01"];
    /// The bound across ZeRO stages (summation orders of the collectives differ), as
    /// `tests::parallel`'s.
    const STAGES_RTOL: f64 = 1e-5;

    /// `world` threads' ranks of GPT-2 (`--batch` 4 / world) with `extra`.
    fn gpt2_ranks(world: usize, extra: &[&str]) -> Vec<crate::train::RankOutcome> {
        let (args, list) = gpt2_ranks_args(world, extra);
        run_devices(&args, &list, true).unwrap()
    }

    /// [`gpt2_ranks`], run once per process (`tests::ranks_once`): for the runs that
    /// `tests::parallel`'s ZeRO 2 test compares too.
    fn gpt2_ranks_shared(world: usize, extra: &[&str]) -> Vec<crate::train::RankOutcome> {
        let (args, list) = gpt2_ranks_args(world, extra);
        super::super::ranks_once(&args, &list)
    }

    fn gpt2_ranks_args(world: usize, extra: &[&str]) -> (Args, Vec<usize>) {
        let list: Vec<usize> = (0..world).collect();
        let names: Vec<String> = list.iter().map(|d| d.to_string()).collect();
        let batch = (4 / world).to_string();
        let mut f = strs(&["--batch", &batch, "--devices", &names.join(",")]);
        f.extend(strs(extra));
        (gpt2(&f), list)
    }

    fn assert_ranks_agree(what: &str, outs: &[crate::train::RankOutcome]) {
        let bits = |o| -> Vec<Vec<u32>> {
            finals(o)
                .iter()
                .map(|t| t.iter().map(|x| x.to_bits()).collect())
                .collect()
        };
        for (r, o) in outs.iter().enumerate().skip(1) {
            assert!(
                bits(o) == bits(&outs[0]),
                "{what}: rank {r}'s parameters differ"
            );
            assert_eq!(o.logs.len(), outs[0].logs.len(), "{what}: rank {r}'s steps");
        }
    }

    /// `--offload-optimizer cpu --zero 2` on 2 and 4 emulated devices (threads): the ranks
    /// agree bit for bit, follow `--zero 2` on the device within the offload bound and the
    /// plain run within the stages' bound; GPT-2 f32 and bf16 (host master weights), LLaMA f32
    /// with `--grad-accum 2`;
    /// f16 with an overflowing first step skips it as `--zero 2` does. Between steps a rank's
    /// `mem_allocated` is `--zero 2`'s less exactly its optimizer state's shards (one buffer of
    /// ⌈P/W⌉ f32 per group, rounded as the caching allocator does).
    #[test]
    fn zero_2_with_offload_follows_zero_2_and_keeps_only_the_gradient_shard() {
        // In one process with `tests::parallel`'s ZeRO 2 test, which compares the same plain and
        // --zero 2 runs (f32 and bf16 on 2 ranks, f32 on 4).
        if super::super::alone_with(
            "tests::offload::on_device::zero_2_with_offload_follows_zero_2_and_keeps_only_the_gradient_shard",
            &super::super::ZERO_2_GROUP,
        ) {
            return;
        }
        let _s = serial();
        const PARAMS: usize = 29568;
        let guard = usize::from(hip_rt::emu::is_hip_emu());
        let round = |bytes: usize| (bytes + guard).div_ceil(512) * 512;
        let f16 = [
            "--dtype",
            "f16",
            "--scale-init",
            "16777216",
            "--scale-window",
            "2",
        ];
        // (bf16 on 4 ranks, not run here for time, follows --zero 2 within 7e-6 only: where a
        // master weight differs by an f32 ulp, its bf16 rounding can flip by a bf16 ulp.)
        for (what, world, extra, groups) in [
            ("gpt2 f32", 2, &["--dtype", "f32"][..], 2),
            ("gpt2 bf16", 2, &["--dtype", "bf16"][..], 3),
            ("gpt2 f16 skip", 2, &f16[..], 3),
            ("gpt2 f32 on 4", 4, &["--dtype", "f32"][..], 2),
        ] {
            let plain = gpt2_ranks_shared(world, extra);
            let zero = gpt2_ranks_shared(world, &[extra, &ZERO2[..]].concat());
            let off = gpt2_ranks(world, &[extra, &ZERO2[..], &OFFLOAD[..]].concat());
            let what = format!("{what} --zero 2 offload");
            assert_ranks_agree(&what, &off);
            let w_zero = assert_close(&what, &off[0].logs, &zero[0].logs, OFFLOAD_RTOL);
            let w_plain = assert_close(&what, &off[0].logs, &plain[0].logs, STAGES_RTOL);
            // (The final weights are not compared element by element: the key bias's gradient
            // is zero up to rounding noise, and AdamW turns that noise into updates of ±lr.)
            let state = groups * round(PARAMS.div_ceil(world) * 4);
            for r in 0..world {
                let (z, o) = (
                    zero[r].logs.last().unwrap().mem.unwrap(),
                    off[r].logs.last().unwrap().mem.unwrap(),
                );
                let drop = z.allocated as i64 - o.allocated as i64;
                eprintln!(
                    "{what} rank {r}: worst rel {w_zero:e} vs --zero 2, {w_plain:e} vs plain; \
                     mem_allocated {} → {} (drop {drop}, optimizer shards {state}); mem_peak \
                     {} → {}",
                    z.allocated, o.allocated, z.peak, o.peak
                );
                // The shards, and the device AdamW's tensor table --zero 2 keeps (a block).
                let ratio = drop as f64 / state as f64;
                assert!(
                    (0.98..=1.03).contains(&ratio),
                    "{what} rank {r}: mem_allocated dropped {drop} bytes, the shards are {state}"
                );
                assert!(o.peak < z.peak, "{what} rank {r}: mem_peak did not drop");
            }
            // Without ZeRO (2 ranks): offload follows the same plain run within the offload
            // bound, and f16 skips its overflowing first step as the plain run does.
            if world == 2 {
                let off0 = gpt2_ranks(world, &[extra, &OFFLOAD[..]].concat());
                let what = what.replace("--zero 2 offload", "offload on 2 devices");
                assert_ranks_agree(&what, &off0);
                let worst = assert_close(&what, &off0[0].logs, &plain[0].logs, OFFLOAD_RTOL);
                eprintln!("{what}: worst rel {worst:e} vs plain");
            }
        }
        // Two micro-batches a step: each one's buckets reduced into the shards, the owned
        // pieces copied down during the last one only.
        let two = ["--devices", "0,1", "--batch", "2", "--grad-accum", "2"];
        let plain = run_devices(&llama(&strs(&two)), &[0, 1], true).unwrap();
        let off = run_devices(
            &llama(&strs(&[&two[..], &ZERO2[..], &OFFLOAD[..]].concat())),
            &[0, 1],
            true,
        )
        .unwrap();
        assert_ranks_agree("llama f32 --zero 2 offload", &off);
        let worst = assert_close(
            "llama --zero 2 offload",
            &off[0].logs,
            &plain[0].logs,
            STAGES_RTOL,
        );
        eprintln!(
            "llama f32 --zero 2 offload --grad-accum 2 on 2 devices vs plain: worst rel {worst:e}"
        );
    }

    /// Checkpoints of `--zero 2` with offload are those of any run: one resumes bit for bit
    /// with the same flags, and within the bounds as `--zero 1` on the device; a `--zero 1`
    /// checkpoint resumes with `--zero 2` and offload.
    #[test]
    fn zero_2_offload_checkpoints_resume_across_stages() {
        let _s = serial();
        emu_setup();
        let s = Scratch::new("offload-zero2-resume");
        let ck = s.path("z2off").display().to_string();
        let base = ["--dtype", "bf16", "--steps", "3"];
        let z2off = [&base[..], &ZERO2[..], &OFFLOAD[..]].concat();
        let save = ["--checkpoint-dir", ck.as_str(), "--save-every", "1"];
        let full = gpt2_ranks(2, &[&z2off[..], &save[..]].concat());
        let from = format!("{ck}/step_1");
        let resume = ["--resume", from.as_str()];
        let again = gpt2_ranks(2, &[&z2off[..], &resume[..]].concat());
        let bits = |l: &[StepLog]| -> Vec<(u64, u64)> {
            l.iter()
                .map(|x| (x.loss.to_bits(), x.grad_norm.to_bits()))
                .collect()
        };
        assert_eq!(bits(&again[0].logs), bits(&full[0].logs[1..]), "same flags");
        let z1 = gpt2_ranks(2, &[&base[..], &["--zero", "1"], &resume[..]].concat());
        assert_close("→ --zero 1", &z1[0].logs, &full[0].logs[1..], STAGES_RTOL);
        // A --zero 1 checkpoint (on the device), resumed with --zero 2 and offload.
        let ck1 = s.path("z1").display().to_string();
        let save1 = ["--checkpoint-dir", ck1.as_str(), "--save-every", "1"];
        let z1full = gpt2_ranks(2, &[&base[..], &["--zero", "1"], &save1[..]].concat());
        let from1 = format!("{ck1}/step_1");
        let off = gpt2_ranks(2, &[&z2off[..], &["--resume", from1.as_str()][..]].concat());
        assert_close(
            "--zero 1 →",
            &off[0].logs,
            &z1full[0].logs[1..],
            STAGES_RTOL,
        );
    }

    /// The child side of [`zero_2_offload_on_two_processes`]: its `--log` (empty: none).
    const CHILD_LOG: &str = "HIPK_OFFLOAD_TEST_CHILD_LOG";

    /// `--zero 2 --offload-optimizer cpu --grad-accum 2` as 2 processes started with the
    /// launcher's variables (each micro-batch's buckets reduced to their owners across
    /// processes and added into the shards): rank 0's logged steps follow the plain 2-thread
    /// run with `--grad-accum 2` within the stages' bound.
    #[test]
    fn zero_2_offload_on_two_processes() {
        const NAME: &str = "tests::offload::on_device::zero_2_offload_on_two_processes";
        const ACCUM: [&str; 2] = ["--grad-accum", "2"];
        let flags = [&["--batch", "2"][..], &ZERO2[..], &OFFLOAD[..], &ACCUM[..]].concat();
        if let Ok(log) = std::env::var(CHILD_LOG) {
            let mut f = strs(&flags);
            f.extend(["--log".to_string(), log]);
            run(&gpt2(&f)).unwrap();
            return;
        }
        let _s = serial();
        emu_setup();
        let s = Scratch::new("offload-zero2-procs");
        let log = s.path("rank0.jsonl");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let children: Vec<_> = (0..2)
            .map(|rank| {
                std::process::Command::new(std::env::current_exe().unwrap())
                    .args([NAME, "--exact", "--test-threads=1", "--nocapture"])
                    .env(CHILD_LOG, s.path(&format!("rank{rank}.jsonl")))
                    .env("RANK", rank.to_string())
                    .env("LOCAL_RANK", rank.to_string())
                    .env("WORLD_SIZE", "2")
                    .env("MASTER_ADDR", "127.0.0.1")
                    .env("MASTER_PORT", port.to_string())
                    .env("HIPK_RDZV_SECRET", "offload-tests-secret-0123456789ab")
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .expect("spawn a rank")
            })
            .collect();
        for (rank, c) in children.into_iter().enumerate() {
            let out = c.wait_with_output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "rank {rank} failed:\n{text}");
            assert!(
                text.contains("1 passed"),
                "rank {rank} ran nothing:\n{text}"
            );
        }
        let plain = gpt2_ranks(2, &ACCUM);
        let lines = std::fs::read_to_string(&log).unwrap();
        let logged: Vec<serde_json::Value> = lines
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(logged.len(), plain[0].logs.len());
        let rel = |a: f64, b: f64| (a - b).abs() / b.abs().max(1e-30);
        for (l, w) in logged.iter().zip(&plain[0].logs) {
            assert_eq!(l["world_size"], 2);
            let loss = l["loss"].as_f64().unwrap();
            let norm = l["grad_norm"].as_f64().unwrap();
            assert!(
                rel(loss, w.loss) <= STAGES_RTOL,
                "step {}: {loss} vs {}",
                w.step,
                w.loss
            );
            assert!(
                rel(norm, w.grad_norm) <= STAGES_RTOL,
                "step {}: {norm}",
                w.step
            );
        }
    }

    /// The child side of [`forward_waits_for_each_layers_upload_under_shuffled_streams`]: the
    /// model (`gpt2` or `llama`) and its `--log`.
    const SEED_CHILD: &str = "HIPK_OFFLOAD_TEST_SEED_CHILD";

    /// The updated weights go up on the copy stream while the next forward runs: each layer
    /// waits for its own tensors' uploads only (`Backend::offload_params_ready`). hip-emu with
    /// `HIPK_EMU_LAZY=1` holds queued work until the host waits for it, and with
    /// `HIPK_EMU_SEED` then runs the ready streams in a random order, so a layer that did not
    /// wait for its weights would read the previous step's and the losses would leave the
    /// plain run's (checked: with only the last wait kept, GPT-2's step 3 differs by 8e-6, 8 times
    /// the bound).
    /// One process per model (hip-emu reads both variables at start-up), f32 and bf16 master
    /// weights: within the offload bound of the plain run.
    #[test]
    fn forward_waits_for_each_layers_upload_under_shuffled_streams() {
        const NAME: &str =
            "tests::offload::on_device::forward_waits_for_each_layers_upload_under_shuffled_streams";
        // (model, its arguments, dtype)
        type Run<'a> = (&'a str, &'a dyn Fn(&[String]) -> Args, &'a str);
        let makers: [Run; 2] = [("gpt2", &gpt2, "f32"), ("llama", &llama, "bf16")];
        if let Ok(child) = std::env::var(SEED_CHILD) {
            let (model, log) = child.split_once(':').expect("model:log");
            let (_, make, dtype) = makers.iter().find(|m| m.0 == model).expect("a model");
            let f = with(&["--device", "0", "--dtype", dtype, "--log", log], &OFFLOAD);
            run(&make(&f)).unwrap();
            return;
        }
        emu_setup();
        let s = Scratch::new("offload-seeded");
        for (model, make, dtype) in makers {
            let log = s.path(&format!("{model}.jsonl"));
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args([NAME, "--exact", "--test-threads=1", "--nocapture"])
                .env(SEED_CHILD, format!("{model}:{}", log.display()))
                .env("HIPK_EMU_LAZY", "1")
                .env("HIPK_EMU_SEED", "7")
                .output()
                .expect("spawn the seeded run");
            let text = String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr);
            assert!(
                out.status.success(),
                "{model}: the seeded run failed:\n{text}"
            );
            assert!(text.contains("1 passed"), "{model}: ran nothing:\n{text}");
            let plain = run(&make(&strs(&["--device", "0", "--dtype", dtype]))).unwrap();
            let lines = std::fs::read_to_string(&log).unwrap();
            let logged: Vec<serde_json::Value> = lines
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            assert_eq!(logged.len(), plain.len(), "{model}: steps");
            let rel = |a: f64, b: f64| (a - b).abs() / b.abs().max(1e-30);
            for (l, w) in logged.iter().zip(&plain) {
                let loss = l["loss"].as_f64().unwrap();
                let norm = l["grad_norm"].as_f64().unwrap();
                eprintln!(
                    "{model} {dtype} offload, HIPK_EMU_SEED=7, step {}: loss {loss} vs {} \
                     (rel {:e}), grad_norm {norm} vs {}",
                    w.step,
                    w.loss,
                    rel(loss, w.loss),
                    w.grad_norm
                );
                assert!(
                    rel(loss, w.loss) <= OFFLOAD_RTOL && rel(norm, w.grad_norm) <= OFFLOAD_RTOL,
                    "{model} step {}: loss {loss} vs {}, grad_norm {norm} vs {}",
                    w.step,
                    w.loss,
                    w.grad_norm
                );
            }
        }
    }

    /// ZeRO 0/1: once an update has seen the gradient buffers, the backward's buckets
    /// ([`crate::offload::HostOptimizer::copy_ready`]) queue their copies down, and the update
    /// copies only the rest; the parameters are the host AdamW's of the same gradients, bit for
    /// bit.
    #[test]
    fn gradients_go_down_bucket_by_bucket_once_their_buffers_are_known() {
        use crate::backend::{AdamWStep, UpdateScalars};
        use crate::offload::HostOptimizer;
        use hip_kernels::ops::{AdamW, AdamWParams, AdamWTensor};
        use hip_kernels::params::Host;
        use hip_rt::{DeviceBuffer, Stream, StreamOptions};
        emu_setup();
        let device = hip_rt::Device::get(0).unwrap();
        let stream = Stream::new(&device, StreamOptions::default()).unwrap();
        let lens = [300usize, 70];
        let p: Vec<Vec<f32>> = lens
            .iter()
            .map(|&n| (0..n).map(|i| (i as f32 * 0.37).sin()).collect())
            .collect();
        let zeros: Vec<Vec<f32>> = lens.iter().map(|&n| vec![0.0; n]).collect();
        fn refs(g: &[Vec<f32>]) -> Vec<&[f32]> {
            g.iter().map(Vec::as_slice).collect()
        }
        let decays = [true, false];
        let mut h =
            HostOptimizer::<f32>::new(&device, [&refs(&p), &refs(&zeros), &refs(&zeros)], &decays)
                .unwrap();
        let up = |h: &[f32]| DeviceBuffer::from_slice(&stream, h).unwrap();
        let mut params: Vec<DeviceBuffer<f32>> = p.iter().map(|t| up(t)).collect();
        let mut grads: Vec<DeviceBuffer<f32>> = zeros.iter().map(|t| up(t)).collect();
        let found_inf = up(&[0.0]);
        let scalars = UpdateScalars {
            grad_scale: None,
            found_inf,
        };
        // The expected state, on the host.
        let (mut want, mut m, mut v) = (p.clone(), zeros.clone(), zeros.clone());
        for step in 1..=3u64 {
            let g: Vec<Vec<f32>> = lens
                .iter()
                .map(|&n| {
                    (0..n)
                        .map(|i| ((i as u64 * 7 + step) as f32).cos())
                        .collect()
                })
                .collect();
            for (d, host) in grads.iter_mut().zip(&g) {
                stream.copy_htod(host, d).unwrap();
            }
            if step > 1 {
                // The backward's last bucket: the second tensor, handed over early.
                let (_, second) = grads.split_at_mut(1);
                h.copy_ready(&stream, &[&mut second[0]]).unwrap();
            }
            let hyper = AdamWStep {
                lr: 1e-2,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                weight_decay: 0.1,
                step,
            };
            let gs: Vec<&DeviceBuffer<f32>> = grads.iter().collect();
            let mut ps: Vec<&mut DeviceBuffer<f32>> = params.iter_mut().collect();
            h.update(&stream, &hyper, &scalars, &gs, &mut ps).unwrap();
            assert_eq!(
                h.late_copies(),
                if step == 1 { 2 } else { 1 },
                "step {step}"
            );
            let mut items: Vec<AdamWTensor<'_, Host, f32>> = want
                .iter_mut()
                .zip(&g)
                .zip(m.iter_mut().zip(v.iter_mut()))
                .zip(decays)
                .map(
                    |(((param, grad), (exp_avg, exp_avg_sq)), decay)| AdamWTensor {
                        param: param.as_mut_slice(),
                        grad: grad.as_slice(),
                        exp_avg: exp_avg.as_mut_slice(),
                        exp_avg_sq: exp_avg_sq.as_mut_slice(),
                        max_exp_avg_sq: None,
                        master: None,
                        weight_decay: (!decay).then_some(0.0),
                        lr_scale: None,
                    },
                )
                .collect();
            hip_kernels::cpu::adamw(AdamW::<Host, f32> {
                params: AdamWParams {
                    lr: hyper.lr,
                    beta1: hyper.beta1,
                    beta2: hyper.beta2,
                    eps: hyper.eps,
                    weight_decay: hyper.weight_decay,
                    maximize: false,
                    amsgrad: false,
                    step,
                },
                grad_scale: None,
                found_inf: None,
                tensors: &mut items,
            })
            .unwrap();
        }
        // The uploads were queued without the stream waiting for them: ask for the first
        // tensor (a prefix), then for all.
        h.params_ready(&stream, 1).unwrap();
        let first = params[0].to_vec(&stream).unwrap();
        assert_eq!(first, want[0], "tensor 0 after waiting for it alone");
        h.params_ready(&stream, usize::MAX).unwrap();
        for (t, (d, w)) in params.iter().zip(&want).enumerate() {
            let got = d.to_vec(&stream).unwrap();
            let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(w), "tensor {t}");
        }
    }
}
