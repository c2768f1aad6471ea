//! GEMM tuning on the device (`--features device`; run on hip-emu, never on a GPU). Timings on
//! hip-emu are meaningless, so every tuner here times with a scripted clock: the winners are
//! the ones the script makes fastest, and the clock counts how often it was asked.
//!
//! - tune mode writes the results file; the same shape again is not re-timed; a second process
//!   (this test binary, started again with `HIPK_GEMM_TUNING=use`) runs the tuned winners
//!   through plain `ops::matmul` without timing anything;
//! - a file from another arch or crate version is ignored with a warning (use mode: default
//!   kernel; tune mode: tuned again and replaced);
//! - a corrupt file is an error naming its line (also from plain `ops::matmul` in a second
//!   process whose environment names the file), and so is a bad `HIPK_GEMM_TUNING` value;
//! - every result (our tiles, hipBLAS on hip-emu) matches the CPU reference.
#![cfg(feature = "device")]

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use half::bf16;
use hip_kernels::cpu;
use hip_kernels::ops::matmul::tuning::{ResultsFile, ShapeKey, ENV_FILE, ENV_MODE};
use hip_kernels::ops::{
    self, DeviceElement, GemmTuner, GemmTuningMode, Matmul, MatmulParams, OpError, TuningClock,
    TuningConfig, TuningError,
};
use hip_kernels::params::{Host, OnDevice};
use hip_kernels::tolerance::Rule;
use hip_rt::Stream;

mod device_common;

use device_common::*;

/// Returns each candidate's scripted time; runs the candidate as asked (so the work is real).
struct ScriptedClock {
    micros: Mutex<HashMap<&'static str, f64>>,
    calls: AtomicUsize,
}

impl ScriptedClock {
    fn new(script: &[(&'static str, f64)]) -> Arc<ScriptedClock> {
        Arc::new(ScriptedClock {
            micros: Mutex::new(script.iter().copied().collect()),
            calls: AtomicUsize::new(0),
        })
    }

    fn script(&self, script: &[(&'static str, f64)]) {
        *self.micros.lock().unwrap() = script.iter().copied().collect();
    }
}

impl TuningClock for ScriptedClock {
    fn measure(
        &self,
        _stream: &Stream,
        candidate: &str,
        repetitions: usize,
        run: &mut dyn FnMut() -> Result<(), OpError>,
    ) -> Result<Duration, OpError> {
        for _ in 0..repetitions.max(1) {
            run()?;
        }
        self.calls.fetch_add(1, Ordering::SeqCst);
        let us = self
            .micros
            .lock()
            .unwrap()
            .get(candidate)
            .copied()
            .unwrap_or(1e6);
        Ok(Duration::from_secs_f64(us / 1e6))
    }
}

fn tuner(mode: GemmTuningMode, file: &Path, clock: &Arc<ScriptedClock>) -> GemmTuner {
    let config = TuningConfig {
        warmup: 1,
        repetitions: 2,
        ..TuningConfig::new(mode, file)
    };
    GemmTuner::new(config)
        .expect("results file readable")
        .with_clock(clock.clone())
}

/// Shape A: f32, beta ≠ 0 (the tuner must not accumulate into the caller's C while timing).
fn shape_a() -> MatmulParams {
    MatmulParams {
        beta: 0.5,
        alpha: 1.5,
        ..MatmulParams::new(40, 72, 33)
    }
}

/// Shape B: bf16, b transposed, two batch items.
fn shape_b() -> MatmulParams {
    MatmulParams {
        batch: 2,
        trans_b: true,
        ..MatmulParams::new(65, 48, 24)
    }
}

/// A way to run one matmul (a tuner's, or plain `ops::matmul`).
type RunMatmul<'f, T> = &'f dyn Fn(&Stream, Matmul<'_, OnDevice, T>) -> Result<(), OpError>;

/// One matmul of `shape` through `run` (a tuner, or plain `ops::matmul`), checked against the
/// CPU reference.
fn check<T: DeviceElement>(s: &Stream, shape: MatmulParams, seed: u64, run: RunMatmul<'_, T>) {
    let mut rng = Rng(seed);
    let a = rng.vec::<T>(shape.a_len().unwrap(), 1.0);
    let b = rng.vec::<T>(shape.b_len().unwrap(), 1.0);
    let c = rng.vec::<T>(shape.out_len().unwrap(), 1.0);
    let mut want = c.clone();
    cpu::matmul(Matmul::<Host, T> {
        params: shape,
        a: &a,
        b: &b,
        out: &mut want,
    })
    .unwrap();
    let (da, db, mut dout) = (upload(s, &a), upload(s, &b), upload(s, &c));
    run(
        s,
        Matmul::<OnDevice, T> {
            params: shape,
            a: &da,
            b: &db,
            out: &mut dout,
        },
    )
    .unwrap();
    let got = download(s, &dout);
    assert_close("out", Rule::Reduction, T::DTYPE, shape.k, &got, &want);
}

fn with(t: &GemmTuner) -> impl Fn(&Stream, Matmul<'_, OnDevice, f32>) -> Result<(), OpError> + '_ {
    move |s, args| t.matmul(s, args)
}

fn with_bf16(
    t: &GemmTuner,
) -> impl Fn(&Stream, Matmul<'_, OnDevice, bf16>) -> Result<(), OpError> + '_ {
    move |s, args| t.matmul(s, args)
}

/// Tune shapes A and B into `file` with hipBLAS fastest on A and our small tile on B.
fn tune_both(s: &Stream, file: &Path) -> (GemmTuner, Arc<ScriptedClock>) {
    let clock = ScriptedClock::new(&[("hipk-big", 30.0), ("hipk-small", 20.0), ("hipblas", 10.0)]);
    let t = tuner(GemmTuningMode::Tune, file, &clock);
    check::<f32>(s, shape_a(), 1, &with(&t));
    clock.script(&[("hipk-big", 30.0), ("hipk-small", 5.0), ("hipblas", 10.0)]);
    check::<bf16>(s, shape_b(), 2, &with_bf16(&t));
    (t, clock)
}

const CHILD: &str = "HIPK_TEST_GEMM_TUNING_CHILD";

/// The second process: plain `ops::matmul`, the tuner from the environment (use mode).
fn child_body() {
    let s = stream();
    check::<f32>(&s, shape_a(), 3, &|s, args| ops::matmul(s, args));
    check::<bf16>(&s, shape_b(), 4, &|s, args| ops::matmul(s, args));
    let t = ops::gemm_tuner()
        .unwrap()
        .expect("HIPK_GEMM_TUNING=use installs a tuner");
    assert_eq!(t.mode(), GemmTuningMode::UseFile);
    let stats = t.stats();
    assert_eq!(stats.timings, 0, "{stats:?}");
    assert_eq!((stats.tuned_runs, stats.default_runs), (2, 0), "{stats:?}");
    assert!(stats.warnings.is_empty(), "{stats:?}");
    let key = ShapeKey::of(&shape_a(), hip_kernels::params::DType::F32);
    assert_eq!(t.winner(&key).as_deref(), Some("hipblas"));
    println!("child: {stats:?}");
}

/// Runs this test binary again with only `test` selected and `env` set (plus [`CHILD`]), and
/// returns its stdout after checking that it passed.
fn run_child(test: &str, env: &[(&str, &std::ffi::OsStr)]) -> String {
    let me = std::env::current_exe().unwrap();
    let mut cmd = std::process::Command::new(me);
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CHILD, "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success() && stdout.contains("1 passed") && stdout.contains("child: "),
        "second process failed:\n{stdout}\n{stderr}"
    );
    stdout.into_owned()
}

/// The error `ops::matmul` returns with the environment the parent set.
fn child_error() -> String {
    let s = stream();
    let p = MatmulParams::new(4, 4, 4);
    let (a, b, mut out) = (
        upload(&s, &[1.0f32; 16]),
        upload(&s, &[1.0f32; 16]),
        upload(&s, &[0.0f32; 16]),
    );
    let e = ops::matmul(
        &s,
        Matmul::<OnDevice, f32> {
            params: p,
            a: &a,
            b: &b,
            out: &mut out,
        },
    )
    .expect_err("the environment is bad");
    assert!(matches!(e, OpError::Tuning(_)), "{e}");
    e.to_string()
}

#[test]
fn a_bad_mode_in_the_environment_is_an_error_from_ops_matmul() {
    if std::env::var_os(CHILD).is_some() {
        let e = child_error();
        assert!(
            e.contains("HIPK_GEMM_TUNING=\"fast\"") && e.contains("off, tune or use"),
            "{e}"
        );
        println!("child: {e}");
        return;
    }
    run_child(
        "a_bad_mode_in_the_environment_is_an_error_from_ops_matmul",
        &[(ENV_MODE, "fast".as_ref())],
    );
}

#[test]
fn a_corrupt_file_named_in_the_environment_is_an_error_naming_the_line() {
    if let Some(line) = std::env::var_os(CHILD).and(std::env::var_os("HIPK_TEST_LINE")) {
        let e = child_error();
        let line = line.to_string_lossy();
        assert!(
            e.contains(&format!("bad.txt:{line}: corrupt GEMM tuning results")),
            "{e}"
        );
        println!("child: {e}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.txt");
    std::fs::write(&file, "# comment\nhipk-gemm-tuning 1\nkey arch\n").unwrap();
    run_child(
        "a_corrupt_file_named_in_the_environment_is_an_error_naming_the_line",
        &[
            (ENV_MODE, "use".as_ref()),
            (ENV_FILE, file.as_os_str()),
            ("HIPK_TEST_LINE", "3".as_ref()),
        ],
    );
}

#[test]
fn a_tuned_file_is_written_and_a_second_process_uses_it_without_timing() {
    if std::env::var_os(CHILD).is_some() {
        return child_body();
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tuning.txt");
    let s = stream();
    let (t, clock) = tune_both(&s, &file);
    let stats = t.stats();
    assert_eq!((stats.timings, stats.tuned_shapes), (6, 2), "{stats:?}");
    assert_eq!(clock.calls.load(Ordering::SeqCst), 6);
    // The same shape again: the winner runs, nothing is timed.
    check::<f32>(&s, shape_a(), 5, &with(&t));
    assert_eq!(t.stats().timings, 6);
    assert_eq!(t.stats().tuned_runs, 3);

    let text = std::fs::read_to_string(&file).unwrap();
    let parsed = ResultsFile::parse(&file, &text).unwrap();
    let winners: Vec<(String, String)> = parsed
        .entries
        .iter()
        .map(|(k, e)| (k.to_string(), e.winner.clone()))
        .collect();
    assert_eq!(
        winners,
        [
            (
                "f32 nn batch=1 m=40 n=72 k=33 packed".to_string(),
                "hipblas".to_string()
            ),
            (
                "bf16 nt batch=2 m=65 n=48 k=24 packed".to_string(),
                "hipk-small".to_string()
            ),
        ],
        "{text}"
    );
    assert!(
        text.contains("hipk-big=30.000 hipk-small=20.000 hipblas=10.000"),
        "{text}"
    );
    assert!(
        text.contains(&format!("key hip_kernels {}", env!("CARGO_PKG_VERSION"))),
        "{text}"
    );
    println!("{text}");

    run_child(
        "a_tuned_file_is_written_and_a_second_process_uses_it_without_timing",
        &[(ENV_MODE, "use".as_ref()), (ENV_FILE, file.as_os_str())],
    );
}

#[test]
fn a_file_from_another_arch_or_version_is_ignored_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tuning.txt");
    let s = stream();
    tune_both(&s, &file);
    let good = std::fs::read_to_string(&file).unwrap();
    let replace_line = |prefix: &str, with: &str| -> String {
        good.lines()
            .map(|l| if l.starts_with(prefix) { with } else { l })
            .collect::<Vec<_>>()
            .join("\n")
    };

    // Another arch, use mode: nothing from the file runs, nothing is timed.
    std::fs::write(&file, replace_line("key arch ", "key arch gfx928")).unwrap();
    let clock = ScriptedClock::new(&[]);
    let t = tuner(GemmTuningMode::UseFile, &file, &clock);
    check::<f32>(&s, shape_a(), 6, &with(&t));
    let stats = t.stats();
    assert_eq!(
        (stats.timings, stats.tuned_runs, stats.default_runs),
        (0, 0, 1),
        "{stats:?}"
    );
    assert_eq!(stats.warnings.len(), 1, "{stats:?}");
    let w = &stats.warnings[0];
    assert!(
        w.contains("ignored") && w.contains("arch: file \"gfx928\""),
        "{w}"
    );

    // Another crate version, tune mode: tuned again, the file now holds this machine's key.
    std::fs::write(
        &file,
        replace_line("key hip_kernels ", "key hip_kernels 0.0.0-old"),
    )
    .unwrap();
    let clock = ScriptedClock::new(&[("hipk-big", 1.0), ("hipk-small", 2.0), ("hipblas", 3.0)]);
    let t = tuner(GemmTuningMode::Tune, &file, &clock);
    check::<f32>(&s, shape_a(), 7, &with(&t));
    let stats = t.stats();
    assert_eq!((stats.timings, stats.tuned_shapes), (3, 1), "{stats:?}");
    assert!(
        stats
            .warnings
            .iter()
            .any(|w| w.contains("hip_kernels: file \"0.0.0-old\"") && w.contains("replaced")),
        "{stats:?}"
    );
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(!text.contains("0.0.0-old"), "{text}");
    let parsed = ResultsFile::parse(&file, &text).unwrap();
    assert_eq!(parsed.entries.len(), 1, "{text}");
    assert!(text.contains("winner=hipk-big"), "{text}");
}

#[test]
fn a_corrupt_file_is_an_error_naming_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tuning.txt");
    let s = stream();
    tune_both(&s, &file);
    let good = std::fs::read_to_string(&file).unwrap();
    let line = good.lines().position(|l| l.starts_with("gemm")).unwrap() + 1;
    let bad = good.replacen("hipblas=10.000", "hipblas=ten", 1);
    std::fs::write(&file, &bad).unwrap();
    for mode in [GemmTuningMode::UseFile, GemmTuningMode::Tune] {
        let e = GemmTuner::new(TuningConfig::new(mode, &file)).unwrap_err();
        match &e {
            TuningError::Corrupt { line: l, .. } => assert_eq!(*l, line, "{e}"),
            other => panic!("{other}"),
        }
        let shown = OpError::from(e).to_string();
        assert!(
            shown.contains(&format!("tuning.txt:{line}")) && shown.contains("ten"),
            "{shown}"
        );
    }
}
