//! Tests of the trainer on the tiny GPT-2 of tests/data/train_gpt2 (tools/gen_tiny_gpt2.py):
//! losses against the checked-in PyTorch float64 figures (tools/train_ref.py), gradient
//! accumulation, bit-identical resume, and the bad-input errors.

mod bad_input;
mod corrupt_checkpoint;
#[cfg(feature = "device")]
mod device;
#[cfg(feature = "device")]
mod faults;
mod files_on_disk;
#[cfg(feature = "device")]
mod glm_device;
mod glm_lora;
mod glm_sft;
mod glm_train;
mod grad_checkpoint;
#[cfg(feature = "device")]
mod graph;
mod interrupted_save;
#[cfg(feature = "device")]
mod llama_device;
mod llama_files;
mod llama_lora;
mod llama_train;
mod lora;
mod mixed;
mod offload;
mod parallel;
mod peft;
mod reference;
mod resume;
mod sft_train;

use crate::cli::Args;
use crate::error::TrainError;
use crate::train::{run, StepLog};
use clap::Parser;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The test data directory.
fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/train_gpt2")
}

/// The checked-in common and per-variant flags (tests/data/train_gpt2/variants.json).
fn variant_flags(name: &str) -> Vec<String> {
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(data_dir().join("variants.json")).unwrap()).unwrap();
    let strings = |x: &serde_json::Value| -> Vec<String> {
        x.as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap().to_string())
            .collect()
    };
    let mut flags = strings(&v["common"]);
    flags.extend(strings(&v["variants"][name]));
    flags
}

/// Args for the tiny model and data plus `extra` flags.
fn args_with(model: &Path, data: &Path, extra: &[String]) -> Args {
    // Every run of the tests is built here: set hip-emu up before any of them starts it.
    emu_setup();
    let mut argv: Vec<String> = ["train_gpt2", "--model"].map(String::from).to_vec();
    argv.push(model.display().to_string());
    argv.push("--data".into());
    argv.push(data.display().to_string());
    argv.extend(extra.iter().cloned());
    Args::try_parse_from(argv).unwrap()
}

/// One run on several emulated devices at a time, across every module of these tests: hip-emu's
/// devices, queues and emulated RCCL are shared by the whole test process, and two such runs
/// beside each other would share (and stall) their collectives.
#[cfg(feature = "device")]
static SEVERAL_DEVICES: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Take [`SEVERAL_DEVICES`] (a test that failed while holding it does not poison it for others).
#[cfg(feature = "device")]
fn serial() -> std::sync::MutexGuard<'static, ()> {
    SEVERAL_DEVICES.lock().unwrap_or_else(|e| e.into_inner())
}

/// Set in the child of [`alone`] to the name of the test it runs.
#[cfg(feature = "device")]
const ALONE: &str = "HIPK_TRAIN_TEST_ALONE";

/// Run test `name` (its full path, as `cargo test` prints it) again in a child process of this
/// test binary, alone: for a test that asserts device memory, which the tests running beside it
/// in this process would change (hip-emu's devices and their caching allocators are shared by
/// the whole process). Returns true in the parent once the child passed (the caller returns),
/// false in the child (the caller runs its body).
#[cfg(feature = "device")]
fn alone(name: &str) -> bool {
    if std::env::var(ALONE).as_deref() == Ok(name) {
        return false;
    }
    emu_setup();
    // No other run on several devices beside it either: under load, a rank of the child could
    // fall behind hip-emu's collective watchdog.
    let _s = serial();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--test-threads=1", "--nocapture"])
        .env(ALONE, name)
        .output()
        .expect("start this test binary again");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    println!("{text}");
    assert!(
        out.status.success(),
        "{name} failed in its own process:\n{text}"
    );
    // A misspelt name would pass by running nothing.
    assert!(
        text.contains("1 passed"),
        "{name} did not run in its own process:\n{text}"
    );
    true
}

/// The ZeRO 2 tests of `parallel` and `offload` (memory per rank, so each alone in a process):
/// together in one, sharing their plain and `--zero 2` runs.
#[cfg(feature = "device")]
const ZERO_2_GROUP: [&str; 2] = [
    "tests::offload::on_device::zero_2_with_offload_follows_zero_2_and_keeps_only_the_gradient_shard",
    "tests::parallel::on_devices::zero_2_gives_the_steps_of_the_plain_run_with_a_share_of_the_gradients",
];

/// [`alone`] for a group of tests that compare the same runs: the first of them to start runs
/// every test of `group` (full paths, `name` among them) in one child process, one after
/// another, so that [`ranks_once`] computes their shared runs once; the others take that
/// child's verdict. Returns true in the parent, false in the child (the caller runs its body).
#[cfg(feature = "device")]
fn alone_with(name: &str, group: &[&str]) -> bool {
    assert!(
        group.contains(&name),
        "{name} is not in its group {group:?}"
    );
    let joined = group.join(" ");
    if std::env::var(ALONE).as_deref() == Ok(joined.as_str()) {
        return false;
    }
    emu_setup();
    let _s = serial();
    static VERDICTS: std::sync::Mutex<Vec<(String, Result<String, String>)>> =
        std::sync::Mutex::new(Vec::new());
    let mut verdicts = VERDICTS.lock().unwrap_or_else(|e| e.into_inner());
    if !verdicts.iter().any(|(g, _)| *g == joined) {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(group)
            .args(["--exact", "--test-threads=1", "--nocapture"])
            .env(ALONE, &joined)
            .output()
            .expect("start this test binary again");
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        // A misspelt name would pass by running nothing.
        let ran = text.contains(&format!("{} passed", group.len()));
        let verdict = match out.status.success() && ran {
            true => Ok(text),
            false => Err(text),
        };
        verdicts.push((joined.clone(), verdict));
    }
    let (_, verdict) = verdicts.iter().find(|(g, _)| *g == joined).unwrap();
    match verdict {
        Ok(text) => println!("{text}"),
        Err(text) => panic!("{group:?} failed or did not run in their own process:\n{text}"),
    }
    true
}

/// `run_devices(args, list, true)`, computed once per process for the same args and devices:
/// for the runs that tests of one [`alone_with`] group both compare with.
#[cfg(feature = "device")]
fn ranks_once(args: &Args, list: &[usize]) -> Vec<crate::train::RankOutcome> {
    type Runs = Vec<(String, Vec<crate::train::RankOutcome>)>;
    static RUNS: std::sync::Mutex<Runs> = std::sync::Mutex::new(Vec::new());
    let key = format!("{list:?} {args:?}");
    let mut runs = RUNS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, outs)) = runs.iter().find(|(k, _)| *k == key) {
        return outs.clone();
    }
    let outs = crate::parallel::run_devices(args, list, true).unwrap();
    runs.push((key, outs.clone()));
    outs
}

/// On hip-emu (`HIPK_HIP_LIBRARY` names libhip_emu.so): four emulated devices and hip-emu's
/// emulated RCCL, unless set otherwise. Called before any device is touched (hip-emu reads
/// `HIPK_EMU_DEVICES` once, when it starts).
fn emu_setup() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let hip = std::env::var("HIPK_HIP_LIBRARY").unwrap_or_default();
        if hip.ends_with("libhip_emu.so") {
            if std::env::var_os("HIPK_EMU_DEVICES").is_none() {
                std::env::set_var("HIPK_EMU_DEVICES", "4");
            }
            if std::env::var_os("HIPK_RCCL_LIBRARY").is_none() {
                std::env::set_var("HIPK_RCCL_LIBRARY", &hip);
            }
        }
    });
}

/// Run the tiny model with `extra` flags.
fn run_tiny(extra: &[String]) -> Result<Vec<StepLog>, TrainError> {
    emu_setup();
    let d = data_dir();
    run(&args_with(&d.join("model"), &d.join("tokens.bin"), extra))
}

fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// A fresh, empty scratch directory (removed by [`Scratch::drop`]).
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "train_gpt2-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.0.join(rel)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
