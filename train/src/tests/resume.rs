//! Checkpoints: atomic layout, resume bit-identical to an uninterrupted run, the model part
//! loadable again as `--model`.

use super::{args_with, data_dir, run_tiny, strs, Scratch};
use crate::train::{run, StepLog};

fn flags(steps: &str, extra: &[String]) -> Vec<String> {
    let mut f = strs(&[
        "--seq",
        "16",
        "--batch",
        "4",
        "--lr",
        "1e-2",
        "--grad-clip",
        "0.8",
        "--steps",
        steps,
    ]);
    f.extend(extra.iter().cloned());
    f
}

fn bits(l: &StepLog) -> (u64, u64, u64, u64) {
    (
        l.step,
        l.loss.to_bits(),
        l.lr.to_bits(),
        l.grad_norm.to_bits(),
    )
}

/// The JSONL lines without `tokens_per_s` (timings differ run to run).
fn log_without_timing(path: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            assert!(v["tokens_per_s"].as_f64().unwrap() > 0.0);
            v.as_object_mut().unwrap().remove("tokens_per_s");
            v
        })
        .collect()
}

#[test]
fn resume_continues_bit_identically_and_checkpoints_load_as_model() {
    let s = Scratch::new("resume");
    let ck = s.path("ck").display().to_string();
    let log_a = s.path("a.jsonl").display().to_string();
    let full = run_tiny(&flags(
        "6",
        &strs(&[
            "--checkpoint-dir",
            &ck,
            "--save-every",
            "3",
            "--log",
            &log_a,
        ]),
    ))
    .unwrap();
    let mut saved: Vec<String> = std::fs::read_dir(s.path("ck"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    saved.sort();
    assert_eq!(
        saved,
        ["step_3", "step_6"],
        "no temporary directory is left behind"
    );
    for f in [
        "model.safetensors",
        "config.json",
        "optimizer.safetensors",
        "trainer.json",
    ] {
        assert!(s.path("ck/step_3").join(f).is_file(), "{f}");
    }

    let ck2 = s.path("ck2").display().to_string();
    let log_b = s.path("b.jsonl").display().to_string();
    let resume = s.path("ck/step_3").display().to_string();
    let resumed = run_tiny(&flags(
        "6",
        &strs(&[
            "--resume",
            &resume,
            "--checkpoint-dir",
            &ck2,
            "--save-every",
            "3",
            "--log",
            &log_b,
        ]),
    ))
    .unwrap();
    assert_eq!(
        resumed.iter().map(bits).collect::<Vec<_>>(),
        full[3..].iter().map(bits).collect::<Vec<_>>()
    );
    assert_eq!(
        log_without_timing(s.path("b.jsonl").as_path()),
        log_without_timing(s.path("a.jsonl").as_path())[3..]
    );
    for f in [
        "model.safetensors",
        "optimizer.safetensors",
        "trainer.json",
        "config.json",
    ] {
        let a = std::fs::read(s.path("ck/step_6").join(f)).unwrap();
        let b = std::fs::read(s.path("ck2/step_6").join(f)).unwrap();
        assert!(
            a == b,
            "step_6/{f} differs between the resumed and the uninterrupted run"
        );
    }

    // The model part is a model: as a directory and as the .safetensors file (names without
    // the `transformer.` prefix, no buffers), and it trains on from the saved weights.
    let data = data_dir().join("tokens.bin");
    for model in [s.path("ck/step_6"), s.path("ck/step_6/model.safetensors")] {
        let a = args_with(
            &model,
            &data,
            &strs(&["--seq", "16", "--batch", "4", "--steps", "1"]),
        );
        let r = run(&a).unwrap();
        assert!(r[0].loss.is_finite() && r[0].loss != full[0].loss);
    }
}

#[test]
fn a_second_save_of_a_step_replaces_it_whole() {
    let s = Scratch::new("resave");
    let ck = s.path("ck").display().to_string();
    for _ in 0..2 {
        run_tiny(&flags(
            "2",
            &strs(&["--checkpoint-dir", &ck, "--save-every", "2"]),
        ))
        .unwrap();
    }
    let names: Vec<_> = std::fs::read_dir(s.path("ck"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["step_2"]);
}

#[test]
fn mixed_precision_resume_is_bit_identical() {
    // f16 starts from a scale that overflows, so the loss scaler's state (scale, clean-step
    // counter) is part of what the checkpoint must carry.
    for (dtype, extra) in [
        ("bf16", &[][..]),
        (
            "f16",
            &["--scale-init", "16777216", "--scale-window", "2"][..],
        ),
    ] {
        let s = Scratch::new(dtype);
        let common = strs(&["--dtype", dtype, "--save-every", "3", "--checkpoint-dir"]);
        let with = |dir: &str, log: &str, more: &[String]| {
            let mut f = common.clone();
            f.extend(strs(&[dir, "--log", log]));
            f.extend(strs(extra));
            f.extend(more.iter().cloned());
            flags("6", &f)
        };
        let (ck, ck2) = (
            s.path("ck").display().to_string(),
            s.path("ck2").display().to_string(),
        );
        let (log_a, log_b) = (
            s.path("a.jsonl").display().to_string(),
            s.path("b.jsonl").display().to_string(),
        );
        run_tiny(&with(&ck, &log_a, &[])).unwrap();
        let resume = s.path("ck/step_3").display().to_string();
        run_tiny(&with(&ck2, &log_b, &strs(&["--resume", &resume]))).unwrap();
        let (a, b) = (
            log_without_timing(&s.path("a.jsonl")),
            log_without_timing(&s.path("b.jsonl")),
        );
        assert_eq!(b, a[3..], "{dtype}");
        for f in ["model.safetensors", "optimizer.safetensors", "trainer.json"] {
            let x = std::fs::read(s.path("ck/step_6").join(f)).unwrap();
            let y = std::fs::read(s.path("ck2/step_6").join(f)).unwrap();
            assert!(x == y, "{dtype}: step_6/{f} differs");
        }
    }
}
