//! A checkpoint with a corrupt number or optimizer state is refused on resume, with an error
//! naming the file and the key or tensor, before anything is trained or written.

use super::bad_input::{assert_says, tokens};
use super::{args_with, data_dir, strs, Scratch};
use crate::error::TrainError;
use crate::train::run;
use crate::weights::{read_f32_tensors, to_safetensors, HostTensor};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Copy the files of directory `src` into a new directory `dst`.
pub(super) fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
}

/// Train the tiny model one step (`dtype`) and save it: returns `ck/step_1`.
fn one_step_checkpoint(s: &Scratch, dtype: &str) -> PathBuf {
    let ck = s.path("ck");
    let mut f = strs(&[
        "--seq",
        "16",
        "--batch",
        "4",
        "--steps",
        "1",
        "--dtype",
        dtype,
        "--save-every",
        "1",
        "--checkpoint-dir",
    ]);
    f.push(ck.display().to_string());
    run(&args_with(&data_dir().join("model"), &tokens(), &f)).unwrap();
    ck.join("step_1")
}

/// A copy of checkpoint `src` named `name`, with trainer.json's `key` set to `value`.
fn with_state(s: &Scratch, src: &Path, name: &str, key: &str, value: &Value) -> PathBuf {
    let dst = s.path(name);
    copy_dir(src, &dst);
    let p = dst.join("trainer.json");
    let mut v: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    v[key] = value.clone();
    std::fs::write(&p, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    dst
}

/// Resume from `ckpt` to step 3 and return the error, checking that nothing was written.
fn resume_error(s: &Scratch, ckpt: &Path, dtype: &str) -> TrainError {
    let (out, log) = (s.path("out"), s.path("resumed.jsonl"));
    let mut f = strs(&[
        "--seq",
        "16",
        "--batch",
        "4",
        "--steps",
        "3",
        "--dtype",
        dtype,
        "--save-every",
        "1",
        "--checkpoint-dir",
    ]);
    f.extend([out.display().to_string(), "--log".into()]);
    f.extend([log.display().to_string(), "--resume".into()]);
    f.push(ckpt.display().to_string());
    let e = run(&args_with(&data_dir().join("model"), &tokens(), &f)).unwrap_err();
    assert!(!out.exists() && !log.exists(), "written before: {e}");
    e
}

#[test]
fn corrupt_numbers_in_trainer_json_are_named_never_a_panic() {
    let s = Scratch::new("counters");
    let ck = one_step_checkpoint(&s, "f32");
    let cases = [
        // The probe's reproduction: a step counter at u64::MAX overflowed the step addition.
        ("adam_steps", json!(u64::MAX)),
        ("adam_steps", json!(2)),
        ("adam_steps", json!(1.5)),
        ("scale_clean_steps", json!(u64::MAX)),
        ("step", json!(0)),
        ("loader_pos", json!(u64::MAX)),
        ("data_tokens", json!(-1)),
        ("warmup", Value::Null),
        ("lr", json!(-1.0)),
        ("lr_min", json!("small")),
        ("adamw", json!([0.9, 2.0, 1e-8, 0.0, 0.0])),
        ("adamw", json!([0.9, 0.999])),
        ("loss_scale", json!(5.0)),
        ("steps", json!(0)),
    ];
    for (i, (key, value)) in cases.iter().enumerate() {
        let c = with_state(&s, &ck, &format!("c{i}"), key, value);
        let e = resume_error(&s, &c, "f32");
        assert_says(&e, 1, &["trainer.json", &format!("`{key}`")]);
    }
}

#[test]
fn a_bad_loss_scale_names_trainer_json_and_the_key() {
    let s = Scratch::new("scale");
    let ck = one_step_checkpoint(&s, "f16");
    // null is how serde_json writes a NaN.
    for (i, v) in [json!(0.0), json!(-4.0), json!(1e300), Value::Null]
        .iter()
        .enumerate()
    {
        let c = with_state(&s, &ck, &format!("c{i}"), "loss_scale", v);
        let e = resume_error(&s, &c, "f16");
        assert_says(&e, 1, &["trainer.json", "`loss_scale`"]);
        assert!(!e.to_string().contains("grad_scale"), "{e}");
    }
    let e = run(&args_with(
        &data_dir().join("model"),
        &tokens(),
        &strs(&["--dtype", "f16", "--scale-init", "1e300", "--seq", "16"]),
    ))
    .unwrap_err();
    assert_says(&e, 2, &["--scale-init 1e300"]);
}

fn write_tensors(path: &Path, t: &BTreeMap<String, HostTensor>) {
    let list: Vec<_> = t
        .iter()
        .map(|(n, (shape, v))| (n.clone(), shape.clone(), v.as_slice()))
        .collect();
    std::fs::write(path, to_safetensors(&list).unwrap()).unwrap();
}

#[test]
fn corrupt_optimizer_state_is_refused_naming_file_and_tensor() {
    let s = Scratch::new("optim");
    let ck = one_step_checkpoint(&s, "f32");
    let cases = [
        ("exp_avg_sq.h.0.ln_1.weight", 2, -1.0, "-1"),
        ("exp_avg.wte.weight", 7, f32::NAN, "NaN"),
        ("exp_avg_sq.ln_f.bias", 0, f32::INFINITY, "inf"),
    ];
    for (i, (name, index, value, says)) in cases.into_iter().enumerate() {
        let c = s.path(&format!("c{i}"));
        copy_dir(&ck, &c);
        let p = c.join("optimizer.safetensors");
        let mut t = read_f32_tensors(&p).unwrap();
        t.get_mut(name).unwrap().1[index] = value;
        write_tensors(&p, &t);
        let e = resume_error(&s, &c, "f32");
        assert_says(
            &e,
            1,
            &[
                "optimizer.safetensors",
                &format!("`{name}`"),
                &format!("index {index}"),
                says,
            ],
        );
    }
}
