//! Bad input: each case fails with a clear error naming the file, tensor or value, the right exit
//! status, and leaves what is on disk untouched (an existing `--log` file keeps its bytes, no
//! checkpoint directory appears).

use super::{args_with, data_dir, strs, Scratch};
use crate::error::TrainError;
use crate::train::run;
use crate::weights::{read_f32_tensors, to_safetensors, HostTensor};
use clap::Parser;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const SENTINEL: &[u8] = b"{\"step\": 1, \"precious\": true}\n";

/// Run with `extra` flags (plus a sentinel `--log` and a `--checkpoint-dir` under `s`) and return
/// the error, after checking that nothing on disk changed.
fn expect_error(s: &Scratch, model: &Path, data: &Path, extra: &[&str]) -> TrainError {
    let log = s.path("sentinel.jsonl");
    std::fs::write(&log, SENTINEL).unwrap();
    let ck = s.path("never-created");
    let mut flags = strs(&["--seq", "16", "--batch", "4", "--steps", "2", "--log"]);
    flags.push(log.display().to_string());
    if !extra.contains(&"--checkpoint-dir") {
        flags.extend(strs(&["--save-every", "1", "--checkpoint-dir"]));
        flags.push(ck.display().to_string());
    }
    flags.extend(strs(extra));
    let err = run(&args_with(model, data, &flags)).unwrap_err();
    assert_eq!(
        std::fs::read(&log).unwrap(),
        SENTINEL,
        "the log file was touched: {err}"
    );
    assert!(!ck.exists(), "a checkpoint directory was created: {err}");
    err
}

pub(super) fn tiny_tensors() -> BTreeMap<String, HostTensor> {
    read_f32_tensors(&data_dir().join("model/model.safetensors")).unwrap()
}

pub(super) fn tiny_config() -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(data_dir().join("model/config.json")).unwrap()).unwrap()
}

/// Write a model directory `name` under `s` from a config and tensors.
pub(super) fn write_model(
    s: &Scratch,
    name: &str,
    config: &serde_json::Value,
    tensors: &BTreeMap<String, HostTensor>,
) -> PathBuf {
    let dir = s.path(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.json"), serde_json::to_vec(config).unwrap()).unwrap();
    let list: Vec<_> = tensors
        .iter()
        .map(|(n, (shape, v))| (n.clone(), shape.clone(), v.as_slice()))
        .collect();
    std::fs::write(
        dir.join("model.safetensors"),
        to_safetensors(&list).unwrap(),
    )
    .unwrap();
    dir
}

fn tokens_file(s: &Scratch, name: &str, header: [i32; 3], ids: &[u16]) -> PathBuf {
    let mut bytes = Vec::new();
    let mut h = [0i32; 256];
    h[..3].copy_from_slice(&header);
    for w in h {
        bytes.extend(w.to_le_bytes());
    }
    for t in ids {
        bytes.extend(t.to_le_bytes());
    }
    let p = s.path(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

pub(super) fn assert_says(err: &TrainError, code: u8, parts: &[&str]) {
    let msg = err.to_string();
    assert_eq!(err.exit_code(), code, "{msg}");
    for p in parts {
        assert!(msg.contains(p), "`{msg}` does not mention `{p}`");
    }
}

pub(super) fn tokens() -> PathBuf {
    data_dir().join("tokens.bin")
}

#[test]
fn missing_unexpected_misshapen_and_untied_tensors_are_named() {
    let s = Scratch::new("tensors");
    let cfg = tiny_config();
    let mut t = tiny_tensors();
    t.remove("transformer.h.1.mlp.c_fc.bias");
    let m = write_model(&s, "missing", &cfg, &t);
    let e = expect_error(&s, &m, &tokens(), &[]);
    assert_says(
        &e,
        1,
        &["model.safetensors", "`h.1.mlp.c_fc.bias`", "missing"],
    );

    let mut t = tiny_tensors();
    t.insert("transformer.h.0.mlp.extra".into(), (vec![2], vec![0.0; 2]));
    let m = write_model(&s, "unexpected", &cfg, &t);
    assert_says(
        &expect_error(&s, &m, &tokens(), &[]),
        1,
        &["unexpected tensor `h.0.mlp.extra`"],
    );

    let mut t = tiny_tensors();
    t.insert(
        "transformer.h.0.attn.c_attn.weight".into(),
        (vec![32, 95], vec![0.0; 32 * 95]),
    );
    let m = write_model(&s, "shape", &cfg, &t);
    assert_says(
        &expect_error(&s, &m, &tokens(), &[]),
        1,
        &[
            "`transformer.h.0.attn.c_attn.weight`",
            "[32, 95]",
            "[32, 96]",
        ],
    );

    let mut t = tiny_tensors();
    let mut wte = t["transformer.wte.weight"].clone();
    wte.1[5] += 1.0;
    t.insert("lm_head.weight".into(), wte);
    let m = write_model(&s, "untied", &cfg, &t);
    assert_says(
        &expect_error(&s, &m, &tokens(), &[]),
        1,
        &["lm_head.weight", "wte.weight"],
    );

    let mut t = tiny_tensors();
    t.get_mut("transformer.ln_f.bias").unwrap().1[3] = f32::NAN;
    let m = write_model(&s, "nan", &cfg, &t);
    assert_says(
        &expect_error(&s, &m, &tokens(), &[]),
        1,
        &["ln_f.bias", "NaN", "index 3"],
    );
}

#[test]
fn config_disagreeing_with_the_weights_or_the_flags() {
    let s = Scratch::new("config");
    let mut cfg = tiny_config();
    cfg["n_embd"] = 48.into();
    let m = write_model(&s, "wide", &cfg, &tiny_tensors());
    assert_says(
        &expect_error(&s, &m, &tokens(), &[]),
        1,
        &["`transformer.wte.weight`", "[96, 32]", "[96, 48]"],
    );
    let mut cfg = tiny_config();
    cfg["activation_function"] = "relu".into();
    let m = write_model(&s, "relu", &cfg, &tiny_tensors());
    assert_says(
        &expect_error(&s, &m, &tokens(), &[]),
        1,
        &["config.json", "activation_function", "relu"],
    );
    let mut cfg = tiny_config();
    cfg["n_head"] = 5.into();
    let m = write_model(&s, "heads", &cfg, &tiny_tensors());
    assert_says(
        &expect_error(&s, &m, &tokens(), &[]),
        1,
        &["n_embd` = 32", "n_head` = 5"],
    );
    let tiny = data_dir().join("model");
    let e = expect_error(&s, &tiny, &tokens(), &["--seq", "33"]);
    assert_says(&e, 1, &["--seq 33", "n_positions = 32"]);
}

#[test]
fn bad_token_files() {
    let s = Scratch::new("tokens");
    let tiny = data_dir().join("model");
    let mut ids: Vec<u16> = (0..200).map(|i| (i % 96) as u16).collect();
    ids[150] = 96;
    let f = tokens_file(&s, "vocab.bin", [20240520, 1, 200], &ids);
    assert_says(
        &expect_error(&s, &tiny, &f, &[]),
        1,
        &["vocab.bin", "token 150 has id 96", "vocab_size is 96"],
    );
    let f = tokens_file(&s, "short.bin", [20240520, 1, 64], &[1; 64]);
    assert_says(
        &expect_error(&s, &tiny, &f, &[]),
        1,
        &["short.bin", "holds 64 tokens", "= 65"],
    );
    let f = tokens_file(&s, "count.bin", [20240520, 1, 1000], &[1; 100]);
    assert_says(
        &expect_error(&s, &tiny, &f, &[]),
        1,
        &["count.bin", "header says 1000 tokens"],
    );
    let f = tokens_file(&s, "magic.bin", [20240521, 1, 100], &[1; 100]);
    assert_says(
        &expect_error(&s, &tiny, &f, &[]),
        1,
        &["magic.bin", "20240521"],
    );
    let f = s.path("tiny.bin");
    std::fs::write(&f, [0u8; 10]).unwrap();
    assert_says(
        &expect_error(&s, &tiny, &f, &[]),
        1,
        &["tiny.bin", "shorter than the 1024-byte header"],
    );
    assert_says(
        &expect_error(&s, &tiny, &s.path("absent.bin"), &[]),
        1,
        &["absent.bin"],
    );
}

#[test]
fn resume_from_another_model_or_with_other_flags() {
    let s = Scratch::new("other");
    // A one-layer model: the tiny config with n_layer = 1 and only layer 0's tensors.
    let mut cfg = tiny_config();
    cfg["n_layer"] = 1.into();
    let mut t = tiny_tensors();
    t.retain(|k, _| !k.starts_with("transformer.h.1."));
    let one = write_model(&s, "one-layer", &cfg, &t);
    let ck = s.path("ck");
    let mut flags = strs(&[
        "--seq",
        "16",
        "--batch",
        "4",
        "--steps",
        "1",
        "--save-every",
        "1",
        "--checkpoint-dir",
    ]);
    flags.push(ck.display().to_string());
    run(&args_with(&one, &tokens(), &flags)).unwrap();
    let step1 = ck.join("step_1").display().to_string();
    let tiny = data_dir().join("model");
    let e = expect_error(&s, &tiny, &tokens(), &["--resume", &step1, "--steps", "3"]);
    assert_says(
        &e,
        1,
        &["step_1", "another model", "n_layer=1", "n_layer=2"],
    );
    let e = expect_error(
        &s,
        &one,
        &tokens(),
        &["--resume", &step1, "--steps", "3", "--batch", "2"],
    );
    assert_says(&e, 1, &["--batch 4", "same flags"]);
    let e = expect_error(
        &s,
        &one,
        &tokens(),
        &["--resume", &s.path("nowhere").display().to_string()],
    );
    assert_says(&e, 1, &["nowhere", "checkpoint directory"]);
}

#[test]
fn unwritable_checkpoint_directory_fails_before_training() {
    let s = Scratch::new("unwritable");
    let file = s.path("a-file");
    std::fs::write(&file, b"x").unwrap();
    let dir = file.join("ck").display().to_string();
    let tiny = data_dir().join("model");
    let e = expect_error(
        &s,
        &tiny,
        &tokens(),
        &["--checkpoint-dir", &dir, "--save-every", "1"],
    );
    assert_says(&e, 1, &["a-file/ck"]);
    assert_eq!(std::fs::read(&file).unwrap(), b"x");
}

#[test]
fn bad_usage_exits_2() {
    let s = Scratch::new("usage");
    let tiny = data_dir().join("model");
    for extra in [&["--batch", "0"][..], &["--beta2", "1"], &["--lr", "inf"]] {
        let e = expect_error(&s, &tiny, &tokens(), extra);
        assert_says(&e, 2, &[extra[0]]);
    }
    let e = run(&args_with(&tiny, &tokens(), &strs(&["--save-every", "2"]))).unwrap_err();
    assert_says(&e, 2, &["--save-every 2 needs --checkpoint-dir"]);
    for argv in [
        &["train_gpt2", "--data", "x"][..],
        &[
            "train_gpt2",
            "--model",
            "m",
            "--data",
            "x",
            "--batch",
            "four",
        ],
        &[
            "train_gpt2",
            "--model",
            "m",
            "--data",
            "x",
            "--device",
            "gpu",
        ],
        &["train_gpt2", "--model", "m", "--data", "x", "--frobnicate"],
    ] {
        assert_eq!(
            crate::cli::Args::try_parse_from(argv)
                .unwrap_err()
                .exit_code(),
            2,
            "{argv:?}"
        );
    }
}

#[test]
fn bf16_and_f16_files_are_widened_on_load() {
    use safetensors::tensor::{Dtype, TensorView};
    let s = Scratch::new("half");
    let t = tiny_tensors();
    for (dtype, name) in [(Dtype::BF16, "bf16"), (Dtype::F16, "f16")] {
        let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = t
            .iter()
            .map(|(n, (shape, v))| {
                let b: Vec<u8> = match dtype {
                    Dtype::BF16 => v
                        .iter()
                        .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
                        .collect(),
                    _ => v
                        .iter()
                        .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
                        .collect(),
                };
                (n.clone(), shape.clone(), b)
            })
            .collect();
        let views: Vec<_> = bytes
            .iter()
            .map(|(n, shape, b)| (n.clone(), TensorView::new(dtype, shape.clone(), b).unwrap()))
            .collect();
        let dir = s.path(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(
            data_dir().join("model/config.json"),
            dir.join("config.json"),
        )
        .unwrap();
        safetensors::serialize_to_file(views, &None, &dir.join("model.safetensors")).unwrap();
        let cfg = crate::config::GptConfig::load(&dir.join("config.json")).unwrap();
        let p = crate::weights::load_params(&dir.join("model.safetensors"), &cfg).unwrap();
        let wte = &t["transformer.wte.weight"].1;
        let want: Vec<f32> = match dtype {
            Dtype::BF16 => wte
                .iter()
                .map(|x| half::bf16::from_f32(*x).to_f32())
                .collect(),
            _ => wte
                .iter()
                .map(|x| half::f16::from_f32(*x).to_f32())
                .collect(),
        };
        assert_eq!(p.wte, want, "{name}");
        assert_ne!(
            p.wte, *wte,
            "{name}: rounding must be visible in the test data"
        );
    }
}

#[test]
fn a_device_that_does_not_exist_is_a_run_time_error_naming_it() {
    // 4096: no machine has that many devices, with or without a HIP runtime (hip-emu included).
    let e = run(&args_with(
        &data_dir().join("model"),
        &tokens(),
        &strs(&["--device", "4096", "--steps", "1", "--seq", "16"]),
    ))
    .unwrap_err();
    assert!(matches!(e, TrainError::Device(_)), "{e:?}");
    assert_says(&e, 1, &["--device 4096"]);
}

#[test]
fn a_layer_count_the_weights_do_not_hold_fails_fast_naming_the_key_and_the_file() {
    // 16777216 is inside config.json's accepted range: the claim must cost O(file), never a
    // name table of 12 · n_layer entries.
    let s = Scratch::new("layers");
    for n in [16_777_216u64, 3, 1] {
        let mut cfg = tiny_config();
        cfg["n_layer"] = n.into();
        let m = write_model(&s, &format!("l{n}"), &cfg, &tiny_tensors());
        let t0 = std::time::Instant::now();
        let e = expect_error(&s, &m, &tokens(), &[]);
        let took = t0.elapsed();
        assert!(
            took < std::time::Duration::from_millis(500),
            "n_layer {n}: {took:?} to fail: {e}"
        );
        assert_says(
            &e,
            1,
            &[
                "config.json",
                &format!("`n_layer` = {n}"),
                "model.safetensors",
                "2 layers",
            ],
        );
    }
    // The header decides, before the tensors are read: a file cut short after its header still
    // reports the layer count, not the truncation.
    let mut cfg = tiny_config();
    cfg["n_layer"] = 16_777_216.into();
    let m = write_model(&s, "cut", &cfg, &tiny_tensors());
    let w = m.join("model.safetensors");
    let bytes = std::fs::read(&w).unwrap();
    std::fs::write(&w, &bytes[..bytes.len() - 1000]).unwrap();
    assert_says(
        &expect_error(&s, &m, &tokens(), &[]),
        1,
        &["`n_layer` = 16777216", "2 layers"],
    );
}

#[test]
fn non_utf8_arguments_are_usage_errors_or_paths_never_a_panic() {
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt;
    let bad = || OsString::from_vec(vec![0xff, b'x']);
    let argv = |tail: Vec<OsString>| {
        let mut v: Vec<OsString> = ["train_gpt2", "--model", "m", "--data", "d"]
            .map(OsString::from)
            .to_vec();
        v.extend(tail);
        v
    };
    for flag in [
        "--batch",
        "--seq",
        "--steps",
        "--lr",
        "--device",
        "--dtype",
        "--scale-init",
    ] {
        let e = crate::cli::Args::try_parse_from(argv(vec![flag.into(), bad()])).unwrap_err();
        // clap's own message: the flag and the value as far as it can be shown.
        assert_eq!(e.exit_code(), 2, "{flag}: {e}");
        assert!(e.to_string().starts_with("error: invalid"), "{flag}: {e}");
    }
    let e = crate::cli::Args::try_parse_from(argv(vec![bad()])).unwrap_err();
    assert_eq!(e.exit_code(), 2, "{e}");
    // A path may be any bytes on Unix: it parses, and a missing one is a run-time error naming it.
    let mut v = argv(vec!["--seq".into(), "16".into()]);
    v[4] = bad();
    v[2] = data_dir().join("model").into_os_string();
    let a = crate::cli::Args::try_parse_from(v).unwrap();
    assert_says(&run(&a).unwrap_err(), 1, &["\u{fffd}x"]);
}
