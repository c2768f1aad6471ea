//! What the trainer does to the file system: a failed save leaves no temporary, stale
//! temporaries of its own naming are cleared at start (nothing else), planted symlinks are not
//! followed, and no output flag may name one of the inputs.

use super::bad_input::{assert_says, tokens};
use super::corrupt_checkpoint::copy_dir;
use super::{args_with, data_dir, run_tiny, strs, Scratch};
use crate::checkpoint::WRITE_FAULT;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

/// Sorted entry names of `dir`.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

/// Flags of a short run saving every step into `ck`.
fn saving(ck: &Path, steps: &str) -> Vec<String> {
    let mut f = strs(&[
        "--seq",
        "16",
        "--batch",
        "4",
        "--steps",
        steps,
        "--save-every",
        "1",
        "--checkpoint-dir",
    ]);
    f.push(ck.display().to_string());
    f
}

/// Clears [`WRITE_FAULT`] when dropped (also when the test panics).
struct NoFaultAfter;

impl Drop for NoFaultAfter {
    fn drop(&mut self) {
        WRITE_FAULT.with(|f| *f.borrow_mut() = None);
    }
}

#[test]
fn a_failed_save_removes_its_temporary_and_keeps_earlier_checkpoints() {
    let s = Scratch::new("fullsave");
    let ck = s.path("ck");
    let _reset = NoFaultAfter;
    WRITE_FAULT.with(|f| {
        *f.borrow_mut() = Some(Box::new(|p: &Path| {
            let in_step_2 = p
                .parent()
                .and_then(Path::file_name)
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(".step_2."));
            if in_step_2 && p.ends_with("optimizer.safetensors") {
                Err(std::io::Error::other("No space left on device (injected)"))
            } else {
                Ok(())
            }
        }))
    });
    let e = run_tiny(&saving(&ck, "3")).unwrap_err();
    assert_says(&e, 1, &["optimizer.safetensors", "No space left on device"]);
    assert_eq!(names(&ck), ["step_1"], "after: {e}");
}

/// A process id that no process has: pids are below the kernel's pid_max.
fn dead_pid() -> u64 {
    std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(4_194_304)
}

#[test]
fn stale_temporaries_of_our_naming_are_cleared_at_start_and_nothing_else() {
    let s = Scratch::new("stale");
    let ck = s.path("ck");
    std::fs::create_dir_all(&ck).unwrap();
    let dead = dead_pid();
    // Each with the unlocked owner record of a run that ended (see `interrupted_save` for
    // temporaries without one, or whose owner holds its lock).
    let ended = hip_kernels::files::Owner {
        pid: dead as u32,
        ..hip_kernels::files::Owner::this()
    };
    for n in [
        format!(".step_6.tmp.{dead}"),
        format!(".step_6.old.{dead}"),
        format!(".step_9.tmp.{dead}.a1B2c3"),
    ] {
        std::fs::create_dir(ck.join(&n)).unwrap();
        std::fs::write(ck.join(&n).join("model.safetensors"), b"half").unwrap();
        std::fs::write(ck.join(n).join(".owner"), ended.record()).unwrap();
    }
    std::fs::write(ck.join(format!(".write-probe.{dead}")), ended.record()).unwrap();
    // Kept: a temporary without an owner record, names outside the scheme, a symlink.
    let kept_dirs = [
        ".step_6.tmp.1".to_string(),
        ".step_6.tmp.notes".into(),
        "step_6.tmp.7".into(),
        format!(".step_x.tmp.{dead}"),
    ];
    for n in &kept_dirs {
        std::fs::create_dir(ck.join(n)).unwrap();
        std::fs::write(ck.join(n).join("keep"), b"k").unwrap();
    }
    std::fs::write(ck.join("notes.txt"), b"mine").unwrap();
    let outside = s.path("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("precious"), b"x").unwrap();
    let link = format!(".step_7.tmp.{dead}");
    symlink(&outside, ck.join(&link)).unwrap();

    run_tiny(&saving(&ck, "1")).unwrap();
    let mut want: Vec<String> = kept_dirs.to_vec();
    want.extend([link, "notes.txt".into(), "step_1".into()]);
    want.sort();
    assert_eq!(names(&ck), want);
    assert_eq!(names(&outside), ["precious"]);
    for n in &kept_dirs {
        assert_eq!(names(&ck.join(n)), ["keep"], "{n}");
    }
}

#[test]
fn a_symlink_planted_at_a_predictable_name_is_not_followed() {
    let s = Scratch::new("planted");
    let ck = s.path("ck");
    std::fs::create_dir_all(&ck).unwrap();
    let pid = std::process::id();
    let victim = s.path("victim.txt");
    std::fs::write(&victim, b"precious").unwrap();
    symlink(&victim, ck.join(format!(".write-probe.{pid}"))).unwrap();
    let victim_dir = s.path("victim-dir");
    std::fs::create_dir(&victim_dir).unwrap();
    std::fs::write(victim_dir.join("keep"), b"k").unwrap();
    symlink(&victim_dir, ck.join(format!(".step_1.tmp.{pid}"))).unwrap();

    run_tiny(&saving(&ck, "1")).unwrap();
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    assert_eq!(names(&victim_dir), ["keep"]);
    assert_eq!(std::fs::read(victim_dir.join("keep")).unwrap(), b"k");
    assert!(ck.join("step_1/model.safetensors").is_file());
}

#[test]
fn an_output_that_is_an_input_is_refused_before_anything_is_written() {
    let s = Scratch::new("clobber");
    // Copies: a failure of this test must not destroy the repository's files.
    let model = s.path("model");
    copy_dir(&data_dir().join("model"), &model);
    let data = s.path("d.bin");
    std::fs::copy(tokens(), &data).unwrap();
    let (hard, soft) = (s.path("hard.bin"), s.path("soft.bin"));
    std::fs::hard_link(&data, &hard).unwrap();
    symlink(&data, &soft).unwrap();
    let ck = s.path("ck");
    super::run(&args_with(&model, &data, &saving(&ck, "1"))).unwrap();
    let step1 = ck.join("step_1");

    let inputs: Vec<PathBuf> = [
        data.clone(),
        model.join("model.safetensors"),
        model.join("config.json"),
    ]
    .into_iter()
    .chain(["model.safetensors", "optimizer.safetensors", "trainer.json"].map(|f| step1.join(f)))
    .collect();
    let before: Vec<Vec<u8>> = inputs.iter().map(|p| std::fs::read(p).unwrap()).collect();
    let p = |p: &Path| p.display().to_string();
    let resume = |log: &Path| {
        vec![
            "--log".into(),
            p(log),
            "--resume".into(),
            p(&step1),
            "--steps".into(),
            "3".into(),
        ]
    };
    let cases: Vec<(Vec<String>, &[&str])> = vec![
        (vec!["--log".into(), p(&data)], &["--log", "--data"]),
        (vec!["--log".into(), p(&hard)], &["--log", "--data"]),
        (vec!["--log".into(), p(&soft)], &["--log", "--data"]),
        (
            vec!["--log".into(), p(&s.path("model/../d.bin"))],
            &["--log", "--data"],
        ),
        (
            vec!["--log".into(), p(&model.join("model.safetensors"))],
            &["--log", "--model"],
        ),
        (
            vec!["--log".into(), p(&model.join("config.json"))],
            &["--log", "--model"],
        ),
        (resume(&step1.join("trainer.json")), &["--log", "--resume"]),
        (
            resume(&step1.join("optimizer.safetensors")),
            &["--log", "--resume"],
        ),
    ];
    for (extra, says) in cases {
        let mut flags = strs(&["--seq", "16", "--batch", "4", "--steps", "1"]);
        flags.extend(extra.iter().cloned());
        let e = super::run(&args_with(&model, &data, &flags)).unwrap_err();
        assert_says(&e, 2, says);
        for (f, b) in inputs.iter().zip(&before) {
            assert!(std::fs::read(f).unwrap() == *b, "{extra:?} changed {f:?}");
        }
    }
    // The checkpoint directory would replace the checkpoint used as --model (step_1 is saved
    // again) or as --resume.
    let mut flags = saving(&ck, "2");
    flags.extend(["--model".into(), p(&step1)]);
    let e = super::run(&args_with(&model, &data, &flags)).unwrap_err();
    assert_says(&e, 2, &["--checkpoint-dir", "--model"]);
    assert_eq!(names(&ck), ["step_1"]);
}

#[test]
fn the_temporary_naming_scheme_is_recognised_exactly() {
    use crate::checkpoint::temporary_pid;
    for (name, want) in [
        (".step_6.tmp.42", Some(42)),
        (".step_16.old.42.aB3dE9", Some(42)),
        (".write-probe.7", Some(7)),
        (".write-probe.7.x1Y2z3", Some(7)),
        (".step_6.tmp.42.", None),
        (".step_6.tmp.42.a-b", None),
        (".step_6.tmp.42.ab.cd", None),
        (".step_.tmp.42", None),
        (".step_6.new.42", None),
        ("step_6.tmp.42", None),
        (".step_6.tmp.", None),
        (".step_6.tmp.x", None),
        (".write-probe.", None),
        (".step_6.tmp.99999999999", None),
    ] {
        assert_eq!(temporary_pid(name), want, "{name}");
    }
}
