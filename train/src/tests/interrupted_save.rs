//! A save killed between moving the old `step_<s>` aside and renaming the new one in loses
//! neither (the next run, or a `--resume` of it, moves the old one back), and a temporary is
//! removed only when its owner provably ended (its lock is free), never by a pid alone: a pid
//! names no process of another PID namespace. Resume files that are FIFOs or devices are
//! refused at once, naming them.

use super::bad_input::assert_says;
use super::lora::lora_flags;
use super::{run_tiny, strs, Scratch};
use crate::checkpoint::KILL_AFTER_ASIDE;
use hip_kernels::files::Owner;
use std::path::{Path, PathBuf};

/// Flags of a run of `steps` steps saving every `every` into `ck`.
fn saving(ck: &Path, steps: &str, every: &str) -> Vec<String> {
    let mut f = strs(&["--seq", "16", "--batch", "4", "--steps", steps]);
    f.extend(strs(&["--save-every", every, "--checkpoint-dir"]));
    f.push(ck.display().to_string());
    f
}

/// A process id that no process of this namespace has (pids are below pid_max).
fn dead_pid() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(4_194_304)
}

/// An owner file of a run that ended (this host and boot, a pid that no longer runs, unlocked).
fn dead_owner(dir: &Path) {
    let o = Owner {
        pid: dead_pid(),
        ..Owner::this()
    };
    std::fs::write(dir.join(".owner"), o.record()).unwrap();
}

/// The on-disk state a kill between the two renames of a second save of step 1 leaves: the old
/// `step_1` inside `.step_1.old.*`, the new one complete in `.step_1.tmp.*`, no `step_1`.
fn killed_between_renames(ck: &Path) -> (PathBuf, PathBuf) {
    let dead = dead_pid();
    let (old, tmp) = (
        ck.join(format!(".step_1.old.{dead}.aB3dE9")),
        ck.join(format!(".step_1.tmp.{dead}.xY7zQ1")),
    );
    std::fs::create_dir(&old).unwrap();
    std::fs::rename(ck.join("step_1"), old.join("step_1")).unwrap();
    std::fs::create_dir(&tmp).unwrap();
    std::fs::write(tmp.join("model.safetensors"), b"new").unwrap();
    dead_owner(&old);
    dead_owner(&tmp);
    (old, tmp)
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

#[test]
fn a_kill_between_the_renames_keeps_the_old_checkpoint_for_the_next_run() {
    let s = Scratch::new("killed-save");
    let ck = s.path("ck");
    run_tiny(&saving(&ck, "1", "1")).unwrap();
    let model = std::fs::read(ck.join("step_1/model.safetensors")).unwrap();
    killed_between_renames(&ck);
    // The next run saves step 2 only; step 1 comes back as it was.
    run_tiny(&saving(&ck, "2", "2")).unwrap();
    assert_eq!(names(&ck), ["step_1", "step_2"]);
    assert!(std::fs::read(ck.join("step_1/model.safetensors")).unwrap() == model);
    assert_eq!(names(&ck.join("step_1")).len(), 4, "{:?}", names(&ck));
}

#[test]
fn a_resume_of_a_step_whose_save_was_killed_restores_it_first() {
    let s = Scratch::new("killed-resume");
    let ck = s.path("ck");
    run_tiny(&saving(&ck, "1", "1")).unwrap();
    killed_between_renames(&ck);
    let mut f = strs(&["--seq", "16", "--batch", "4", "--steps", "2", "--resume"]);
    f.push(ck.join("step_1").display().to_string());
    let logs = run_tiny(&f).unwrap();
    assert_eq!(logs.last().map(|l| l.step), Some(2));
    assert!(ck.join("step_1/trainer.json").is_file());
}

#[test]
fn the_real_save_killed_between_the_renames_is_recovered() {
    let s = Scratch::new("killed-hook");
    let ck = s.path("ck");
    run_tiny(&saving(&ck, "1", "1")).unwrap();
    let model = std::fs::read(ck.join("step_1/model.safetensors")).unwrap();
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            KILL_AFTER_ASIDE.with(|k| k.set(false));
        }
    }
    let reset = Reset;
    KILL_AFTER_ASIDE.with(|k| k.set(true));
    let e = run_tiny(&saving(&ck, "1", "1")).unwrap_err();
    drop(reset);
    assert!(e.to_string().contains("killed"), "{e}");
    assert!(!ck.join("step_1").exists(), "{:?}", names(&ck));
    run_tiny(&saving(&ck, "2", "2")).unwrap();
    assert_eq!(names(&ck), ["step_1", "step_2"]);
    assert!(std::fs::read(ck.join("step_1/model.safetensors")).unwrap() == model);
    // LoRA checkpoints are saved the same way.
    let lck = s.path("lck").display().to_string();
    let lora = |steps: &str, every: &str| {
        lora_flags(
            true,
            &[
                "--steps",
                steps,
                "--checkpoint-dir",
                &lck,
                "--save-every",
                every,
            ],
        )
    };
    run_tiny(&lora("1", "1")).unwrap();
    let reset = Reset;
    KILL_AFTER_ASIDE.with(|k| k.set(true));
    assert!(run_tiny(&lora("1", "1")).is_err());
    drop(reset);
    let mut resume = lora("2", "2");
    let i = resume.iter().position(|a| a == "--lora-init").unwrap();
    resume.drain(i..i + 2);
    resume.extend(["--resume".into(), format!("{lck}/step_1")]);
    run_tiny(&resume).unwrap();
    assert!(Path::new(&lck)
        .join("step_1/adapter_model.safetensors")
        .is_file());
}

#[test]
fn a_temporary_whose_owner_holds_its_lock_is_kept_whatever_its_pid() {
    let s = Scratch::new("live-owner");
    let ck = s.path("ck");
    std::fs::create_dir_all(&ck).unwrap();
    let dead = dead_pid();
    // A run in another PID namespace (a container, another node on NFS): its pid is not ours.
    let live = ck.join(format!(".step_3.tmp.{dead}.q1W2e3"));
    std::fs::create_dir(&live).unwrap();
    std::fs::write(live.join("model.safetensors"), b"being written").unwrap();
    let lock = Owner::claim(&live.join(".owner")).unwrap();
    let record = "host another-node\nboot_id 0000\npid 12\n";
    std::fs::write(live.join(".owner"), record).unwrap();
    let probe = ck.join(format!(".write-probe.{dead}.r4T5y6"));
    let probe_lock = Owner::claim(&probe).unwrap();
    // One of an ended run, and one with no owner record (kept: nothing proves it ended).
    let ended = ck.join(format!(".step_4.tmp.{dead}.u7I8o9"));
    std::fs::create_dir(&ended).unwrap();
    dead_owner(&ended);
    let unknown = ck.join(format!(".step_5.tmp.{dead}.p0A1s2"));
    std::fs::create_dir(&unknown).unwrap();

    run_tiny(&saving(&ck, "1", "1")).unwrap();
    let want = [
        format!(".step_3.tmp.{dead}.q1W2e3"),
        format!(".step_5.tmp.{dead}.p0A1s2"),
        format!(".write-probe.{dead}.r4T5y6"),
        "step_1".into(),
    ];
    assert_eq!(names(&ck), want);
    assert_eq!(
        std::fs::read(live.join("model.safetensors")).unwrap(),
        b"being written"
    );
    // Once its owner ends, the next run clears it.
    drop((lock, probe_lock));
    run_tiny(&saving(&ck, "1", "1")).unwrap();
    assert_eq!(
        names(&ck),
        [format!(".step_5.tmp.{dead}.p0A1s2"), "step_1".into()]
    );
}

#[test]
fn resume_files_that_are_fifos_or_devices_are_refused_at_once() {
    let s = Scratch::new("fifo-resume");
    let ck = s.path("ck");
    run_tiny(&saving(&ck, "1", "1")).unwrap();
    for file in [
        "trainer.json",
        "config.json",
        "model.safetensors",
        "optimizer.safetensors",
    ] {
        let bad = s.path(&format!("bad-{file}"));
        super::corrupt_checkpoint::copy_dir(&ck.join("step_1"), &bad);
        std::fs::remove_file(bad.join(file)).unwrap();
        assert!(std::process::Command::new("mkfifo")
            .arg(bad.join(file))
            .status()
            .unwrap()
            .success());
        let mut f = strs(&["--seq", "16", "--batch", "4", "--steps", "2", "--resume"]);
        f.push(bad.display().to_string());
        let t = std::time::Instant::now();
        let e = run_tiny(&f).unwrap_err();
        assert_says(&e, 1, &[file, "FIFO"]);
        assert!(t.elapsed().as_secs() < 10, "{file}: waited on the FIFO");
    }
}

#[test]
fn lora_resume_files_that_are_fifos_are_refused_at_once() {
    let s = Scratch::new("fifo-lora");
    let ck = s.path("ck").display().to_string();
    let flags = |steps: &str| {
        lora_flags(
            true,
            &[
                "--steps",
                steps,
                "--checkpoint-dir",
                &ck,
                "--save-every",
                "1",
            ],
        )
    };
    run_tiny(&flags("1")).unwrap();
    for file in [
        "adapter_config.json",
        "base_model.json",
        "trainer.json",
        "adapter_model.safetensors",
        "optimizer.safetensors",
    ] {
        let bad = s.path(&format!("bad-{file}"));
        super::corrupt_checkpoint::copy_dir(&s.path("ck/step_1"), &bad);
        std::fs::remove_file(bad.join(file)).unwrap();
        assert!(std::process::Command::new("mkfifo")
            .arg(bad.join(file))
            .status()
            .unwrap()
            .success());
        let mut f = flags("2");
        let i = f.iter().position(|a| a == "--lora-init").unwrap();
        f.drain(i..i + 2);
        f.extend(["--resume".into(), bad.display().to_string()]);
        let t = std::time::Instant::now();
        let e = run_tiny(&f).unwrap_err();
        assert_says(&e, 1, &[file, "FIFO"]);
        assert!(t.elapsed().as_secs() < 10, "{file}: waited on the FIFO");
    }
}
