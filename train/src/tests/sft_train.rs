//! Training on SFT data (tests/data/sft, tools/sft_ref.py): the tiny llama on the packed ChatML
//! rows against transformers' float64 run step for step (loss, grad_norm, the step's counted
//! targets with micro-batches of unequal counts, eval_loss), resuming mid-run on the same data,
//! and refusing other data or another tokenizer.

use super::{args_with, strs, Scratch};
use crate::error::TrainError;
use crate::train::run;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// tests/data/sft.
fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/sft")
}

/// The reference run's flags (tests/data/sft/run.json) plus `extra`.
fn flags(extra: &[&str]) -> Vec<String> {
    let run: Value =
        serde_json::from_slice(&std::fs::read(dir().join("run.json")).unwrap()).unwrap();
    let n = |k: &str| run[k].as_u64().unwrap().to_string();
    let tok = dir().join(format!("tokenizer_{}", run["template"].as_str().unwrap()));
    let mut f = strs(&["--tokenizer"]);
    f.push(tok.display().to_string());
    f.push("--eval-data".into());
    f.push(dir().join("eval.jsonl").display().to_string());
    for (flag, key) in [
        ("--cutoff-len", "cutoff_len"),
        ("--seq", "seq"),
        ("--batch", "batch"),
        ("--grad-accum", "grad_accum"),
        ("--steps", "steps"),
        ("--eval-every", "eval_every"),
    ] {
        f.push(flag.into());
        f.push(n(key));
    }
    f.push("--lr".into());
    f.push(format!("{:e}", run["lr"].as_f64().unwrap()));
    f.extend(extra.iter().map(|s| s.to_string()));
    f
}

fn lines(p: &Path) -> Vec<Value> {
    std::fs::read_to_string(p)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs()
}

/// Loss (and eval_loss) within `rtol` of the reference, grad_norm within 10 × `rtol`, the
/// step's counted targets and eval_tokens equal; every reference line present, in order.
fn compare(ours: &[Value], rtol: f64) -> f64 {
    let refs = lines(&dir().join("ref_train.jsonl"));
    assert_eq!(ours.len(), refs.len(), "log lines");
    let mut worst = 0.0f64;
    for (o, r) in ours.iter().zip(&refs) {
        assert_eq!(o["step"], r["step"]);
        if let Some(e) = r["eval_loss"].as_f64() {
            assert!(o.get("loss").is_none(), "an eval line has no loss key");
            let d = rel(o["eval_loss"].as_f64().unwrap(), e);
            assert!(d <= rtol, "step {}: eval_loss off by {d:e}", r["step"]);
            assert_eq!(o["eval_tokens"], r["eval_tokens"]);
            worst = worst.max(d);
        } else {
            let d = rel(o["loss"].as_f64().unwrap(), r["loss"].as_f64().unwrap());
            let dn = rel(
                o["grad_norm"].as_f64().unwrap(),
                r["grad_norm"].as_f64().unwrap(),
            );
            assert!(d <= rtol, "step {}: loss off by {d:e}", r["step"]);
            assert!(
                dn <= 10.0 * rtol,
                "step {}: grad_norm off by {dn:e}",
                r["step"]
            );
            assert_eq!(
                o["tokens"], r["tokens"],
                "step {}: counted targets",
                r["step"]
            );
            worst = worst.max(d);
        }
    }
    worst
}

/// The reference's steps include micro-batches of unequal counted targets (with
/// --grad-accum 2 a mean of means would differ): checked on the committed figures.
#[test]
fn sft_training_matches_transformers_on_the_cpu() {
    let s = Scratch::new("sft");
    let log = s.path("log.jsonl");
    let mut f = flags(&["--log"]);
    f.push(log.display().to_string());
    let args = args_with(&dir().join("model"), &dir().join("train.jsonl"), &f);
    run(&args).unwrap();
    let worst = compare(&lines(&log), super::llama_train::LOSS_RTOL_CPU);
    assert!(worst < super::llama_train::LOSS_RTOL_CPU, "{worst:e}");
}

#[test]
fn sft_resume_continues_and_refuses_other_data_or_tokenizer() {
    let s = Scratch::new("sft-resume");
    let ck = s.path("ck");
    let whole = s.path("whole.jsonl");
    let ck_s = ck.display().to_string();
    // Steps 1..=2 saved, then 3..=4 resumed: the same log lines as the uninterrupted run.
    let mut f = flags(&[
        "--steps",
        "2",
        "--save-every",
        "2",
        "--checkpoint-dir",
        &ck_s,
    ]);
    f.extend(["--log".into(), s.path("a.jsonl").display().to_string()]);
    run(&args_with(
        &dir().join("model"),
        &dir().join("train.jsonl"),
        &f,
    ))
    .unwrap();
    let step2 = ck.join("step_2");
    let state: Value =
        serde_json::from_slice(&std::fs::read(step2.join("sft_data.json")).unwrap()).unwrap();
    assert_eq!(
        (state["row"].as_u64(), state["epoch"].as_u64()),
        (Some(8), Some(0))
    );
    let mut f = flags(&["--resume", &step2.display().to_string(), "--steps", "4"]);
    f.extend(["--log".into(), s.path("b.jsonl").display().to_string()]);
    run(&args_with(
        &dir().join("model"),
        &dir().join("train.jsonl"),
        &f,
    ))
    .unwrap();
    let mut f = flags(&["--steps", "4", "--log"]);
    f.push(whole.display().to_string());
    run(&args_with(
        &dir().join("model"),
        &dir().join("train.jsonl"),
        &f,
    ))
    .unwrap();
    let strip = |v: Vec<Value>| -> Vec<Value> {
        v.into_iter()
            .map(|mut x| {
                if let Some(o) = x.as_object_mut() {
                    o.remove("tokens_per_s");
                }
                x
            })
            .collect()
    };
    // The first part's run ended at step 2, so it evaluated there (after its last step).
    let mut resumed: Vec<Value> = strip(lines(&s.path("a.jsonl")))
        .into_iter()
        .filter(|v| v.get("eval_loss").is_none())
        .collect();
    resumed.extend(strip(lines(&s.path("b.jsonl"))));
    assert_eq!(resumed, strip(lines(&whole)));

    // Other data, another tokenizer: refused, naming which.
    let other = s.path("other.jsonl");
    let mut text = std::fs::read_to_string(dir().join("train.jsonl")).unwrap();
    text.push_str("{\"instruction\": \"one more\", \"output\": \"line\"}\n");
    std::fs::write(&other, text).unwrap();
    let f = flags(&["--resume", &step2.display().to_string()]);
    let e = run(&args_with(&dir().join("model"), &other, &f)).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("other.jsonl") && (msg.contains("not the data") || msg.contains("rows")),
        "{msg}"
    );
    let mut f = flags(&["--resume", &step2.display().to_string()]);
    let i = f.iter().position(|x| x == "--tokenizer").unwrap();
    f[i + 1] = dir().join("tokenizer_sysprompt").display().to_string();
    let msg = run(&args_with(
        &dir().join("model"),
        &dir().join("train.jsonl"),
        &f,
    ))
    .unwrap_err()
    .to_string();
    assert!(
        msg.contains("tokenizer_sysprompt") && msg.contains("not the tokenizer"),
        "{msg}"
    );
}

#[test]
fn sft_flags_are_checked() {
    let model = dir().join("model");
    let data = dir().join("train.jsonl");
    // No --tokenizer.
    let e = run(&args_with(
        &model,
        &data,
        &strs(&["--seq", "64", "--steps", "1"]),
    ))
    .unwrap_err();
    assert!(
        matches!(e, TrainError::Usage(_)) && e.to_string().contains("--tokenizer DIR"),
        "{e}"
    );
    // --cutoff-len above --seq + 1.
    let mut f = flags(&[]);
    let i = f.iter().position(|x| x == "--cutoff-len").unwrap();
    f[i + 1] = "66".into();
    let e = run(&args_with(&model, &data, &f)).unwrap_err();
    assert_eq!(e.exit_code(), 2, "{e}");
    assert!(
        e.to_string().contains("--cutoff-len 66 with --seq 64"),
        "{e}"
    );
    // SFT flags with a token file, --eval-every without --eval-data.
    let tokens = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/train_gpt2/tokens.bin");
    let tok = dir().join("tokenizer_chatml").display().to_string();
    let e = run(&args_with(&model, &tokens, &strs(&["--tokenizer", &tok]))).unwrap_err();
    assert!(
        e.to_string().contains("--tokenizer is for SFT examples"),
        "{e}"
    );
    let mut f = flags(&[]);
    let i = f.iter().position(|x| x == "--eval-data").unwrap();
    f.drain(i..i + 2);
    let e = run(&args_with(&model, &data, &f)).unwrap_err();
    assert!(
        e.to_string().contains("--eval-every 4 needs --eval-data"),
        "{e}"
    );
}

/// LoRA on SFT data: a seeded start (B = 0) leaves the model as it was, so step 1's loss is the
/// full fine-tune's step 1; then only the adapters move the loss, and a LoRA step saved and
/// resumed continues the same run.
#[test]
fn sft_with_lora_starts_at_the_base_loss_and_resumes() {
    let s = Scratch::new("sft-lora");
    let ck = s.path("ck");
    let ck_s = ck.display().to_string();
    let lora = [
        "--lora-rank",
        "4",
        "--lora-targets",
        "q_proj,v_proj,down_proj",
    ];
    let base = run(&args_with(
        &dir().join("model"),
        &dir().join("train.jsonl"),
        &flags(&["--steps", "1"]),
    ))
    .unwrap();
    let mut f = flags(&[
        "--steps",
        "3",
        "--save-every",
        "2",
        "--checkpoint-dir",
        &ck_s,
    ]);
    f.extend(strs(&lora));
    let whole = run(&args_with(
        &dir().join("model"),
        &dir().join("train.jsonl"),
        &f,
    ))
    .unwrap();
    assert_eq!(
        whole[0].loss, base[0].loss,
        "B = 0 leaves the base model's loss"
    );
    assert_ne!(whole[2].loss, whole[0].loss, "the adapters train");
    let mut r = flags(&["--steps", "3", "--resume"]);
    r.push(ck.join("step_2").display().to_string());
    r.extend(strs(&lora));
    let resumed = run(&args_with(
        &dir().join("model"),
        &dir().join("train.jsonl"),
        &r,
    ))
    .unwrap();
    assert_eq!(resumed.last().map(|l| l.loss), whole.last().map(|l| l.loss));
}

/// The reference flags without the pairs of `skip` (to set them otherwise), plus `extra`.
#[cfg(feature = "device")]
fn flags_without(skip: &[&str], extra: &[&str]) -> Vec<String> {
    let all = flags(&[]);
    let mut out = Vec::new();
    let mut i = 0;
    while i < all.len() {
        if skip.contains(&all[i].as_str()) {
            i += 2;
        } else {
            out.push(all[i].clone());
            i += 1;
        }
    }
    out.extend(extra.iter().map(|s| s.to_string()));
    out
}

/// A run's log figures that the data path must not change, bit for bit (serde_json writes the
/// shortest text that reads back as the same f64).
#[cfg(feature = "device")]
fn figures(lines: &[Value]) -> Vec<String> {
    lines
        .iter()
        .map(|l| {
            let k = [
                "step",
                "loss",
                "grad_norm",
                "tokens",
                "eval_loss",
                "eval_tokens",
            ];
            k.map(|k| l.get(k).map_or(String::new(), |v| v.to_string()))
                .join(" ")
        })
        .collect()
}

/// The SFT run of `extra` (device flags) fed through the pinned ring and the copy stream, and
/// the first [`HOST_FEED_STEPS`] steps again with `--host-feed` (each micro-batch uploaded from
/// host vectors on the compute stream, the path before the ring): the same losses, gradient
/// norms and eval losses, bit for bit; the ring's whole run within `LOSS_RTOL_DEVICE` of
/// transformers' figures.
#[cfg(feature = "device")]
fn ring_equals_host_uploads(tag: &str, extra: &[&str]) {
    let s = Scratch::new(tag);
    let run_with = |host_feed: bool| {
        let log = s.path(&format!("log-{host_feed}.jsonl"));
        let mut f = match host_feed {
            false => flags(extra),
            true => flags_without(&["--steps"], extra),
        };
        f.push("--log".into());
        f.push(log.display().to_string());
        if host_feed {
            f.extend(strs(&[
                "--host-feed",
                "--steps",
                &HOST_FEED_STEPS.to_string(),
            ]));
        }
        run(&args_with(
            &dir().join("model"),
            &dir().join("train.jsonl"),
            &f,
        ))
        .unwrap();
        lines(&log)
    };
    let (ring, host) = (run_with(false), run_with(true));
    compare(&ring, super::llama_train::LOSS_RTOL_DEVICE);
    let first = |l: &[Value]| -> Vec<Value> {
        l.iter()
            .filter(|l| l["step"].as_u64().is_some_and(|k| k <= HOST_FEED_STEPS))
            .cloned()
            .collect()
    };
    let ring = first(&ring);
    // The steps and the eval at the last of them.
    assert_eq!(ring.len(), HOST_FEED_STEPS as usize + 1, "{ring:?}");
    assert!(
        ring.iter().any(|l| l.get("eval_loss").is_some()),
        "{ring:?}"
    );
    assert_eq!(figures(&ring), figures(&host));
}

/// The steps of the `--host-feed` run compared with the ring's: up to the first eval (step 4
/// of tests/data/sft/run.json's 8, `--eval-every 4`), four steps of two micro-batches, the
/// ring's slots used over again.
#[cfg(feature = "device")]
const HOST_FEED_STEPS: u64 = 4;

/// One emulated device: the packed rows, positions and sequence bounds through the device's
/// kernels (variable-length attention), within the device bound of transformers' figures (f32
/// accumulation), fed through the ring as by host uploads.
#[cfg(feature = "device")]
#[test]
fn sft_feed_through_the_pinned_ring_is_bit_identical_on_one_emulated_device() {
    ring_equals_host_uploads("sft-ring1", &["--device", "0"]);
}

/// Two emulated devices of `--batch 1` each (the reference's two rows per micro-batch split over
/// the ranks, each rank's sequence bounds of another length): the same figures within the device
/// bound, eval_loss included, fed through the ring as by host uploads.
#[cfg(feature = "device")]
#[test]
fn sft_feed_through_the_pinned_ring_is_bit_identical_on_two_emulated_devices() {
    // In a process of its own: beside the other tests' work on device 0, rank 0 can miss the
    // collectives' arrival timeout on a loaded CI machine.
    if super::alone("tests::sft_train::sft_feed_through_the_pinned_ring_is_bit_identical_on_two_emulated_devices") {
        return;
    }
    ring_equals_host_uploads("sft-ring2", &["--devices", "0,1", "--batch", "1"]);
}

/// hip-emu's counters of the trainer's thread (one device runs on the calling thread; the
/// producer thread's own waits for a slot's last copy count on that thread, not here) over an
/// SFT run of `steps` steps without eval, fed through the ring or (`host_feed`) not.
#[cfg(feature = "device")]
fn sft_counters(steps: usize, host_feed: bool) -> Option<hip_rt::emu::EmuStats> {
    use hip_rt::emu::{stats, StatsScope};
    let n = steps.to_string();
    let mut extra = vec!["--device", "0", "--steps", n.as_str()];
    if host_feed {
        extra.push("--host-feed");
    }
    let f = flags_without(&["--steps", "--eval-every", "--eval-data"], &extra);
    let args = args_with(&dir().join("model"), &dir().join("train.jsonl"), &f);
    let before = stats(StatsScope::Thread)?;
    run(&args).unwrap();
    Some(stats(StatsScope::Thread)?.since(&before))
}

/// A steady step waits once (its read), whatever feeds it: the ring's copies add no host wait
/// on the trainer's thread, and copy the same bytes as host uploads.
#[cfg(feature = "device")]
#[test]
fn sft_steady_steps_wait_once_with_the_pinned_ring() {
    if sft_counters(1, false).is_none() {
        return; // not hip-emu: no counters to read
    }
    let c = |steps, host| sft_counters(steps, host).unwrap();
    // Steps 3 and 4 over the first two (the ring's slots filled, the kernels loaded).
    let (ring2, ring4, host4) = (c(2, false), c(4, false), c(4, true));
    println!("SFT, 1 emulated device: ring 2 steps {ring2:?}\nring 4 {ring4:?}\nhost 4 {host4:?}");
    assert_eq!(
        ring4.host_waits,
        ring2.host_waits + 2,
        "{ring2:?} vs {ring4:?}"
    );
    assert!(
        ring4.host_waits <= host4.host_waits,
        "{ring4:?} vs {host4:?}"
    );
    assert_eq!(ring4.bytes_htod, host4.bytes_htod, "{ring4:?} vs {host4:?}");
}

/// A slot's copies: queued on the backend's copy stream into buffers allocated there, the
/// compute stream ordered after them (reading on the compute stream sees the staged rows).
#[cfg(feature = "device")]
#[test]
fn a_staged_micro_batch_is_copied_on_the_copy_stream() {
    use crate::backend::Backend;
    use crate::device_backend::DeviceBackend;
    use crate::sft::pack::SftBatch;
    use crate::sft::source::to_batch;
    use crate::sft::Slot;
    super::emu_setup();
    let be = DeviceBackend::new(0, 1).unwrap();
    // Two rows of 4 positions: [a a b pad], [c c c c]; this rank takes the second row.
    let global = SftBatch {
        inputs: vec![1, 2, 3, 0, 4, 5, 6, 7],
        targets: vec![2, -100, -100, -100, 5, 6, 7, -100],
        positions: vec![0, 1, 0, 0, 0, 1, 2, 3],
        cu_seqlens: vec![0, 2, 3, 4, 8],
    };
    let mut slot = Backend::<f32>::feed_slot(&be, 4..8).unwrap().unwrap();
    slot.write(&global).unwrap();
    let host = to_batch(global).rows(4..8);
    let ids = Backend::<f32>::batch_ids(&be, &host, Some(&*slot)).unwrap();
    let compute = Backend::<f32>::queue(&be);
    let cu = ids.cu_seqlens.as_ref().unwrap();
    for (got, want) in [
        (&ids.inputs, &host.inputs),
        (&ids.targets, &host.targets),
        (
            ids.positions.as_ref().unwrap(),
            host.positions.as_ref().unwrap(),
        ),
        (cu, host.cu_seqlens.as_ref().unwrap()),
    ] {
        assert_eq!(got.buffer().stream_id(), be.copy_stream().id());
        assert_ne!(got.buffer().stream_id(), compute.id());
        assert_eq!(&got.buffer().to_vec(compute).unwrap(), want);
    }
    assert_eq!(host.cu_seqlens.as_deref(), Some(&[0, 4][..]));
    // A staged micro-batch that is not the step's is refused, naming both.
    let other = to_batch(SftBatch {
        inputs: vec![1; 8],
        targets: vec![1; 8],
        positions: vec![0; 8],
        cu_seqlens: vec![0, 8],
    });
    let e = Backend::<f32>::batch_ids(&be, &other, Some(&*slot))
        .err()
        .unwrap();
    assert!(
        e.to_string().contains("not the one handed to the step"),
        "{e}"
    );
}
