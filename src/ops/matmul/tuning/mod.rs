//! GEMM tuning: the fastest correct GEMM per shape, measured on the device once and remembered
//! in a results file (in the spirit of PyTorch's TunableOp).
//!
//! [`crate::ops::matmul()`] runs this crate's kernel (the tile [`super::MatmulPlan::new`] picks)
//! unless tuning is on. A [`GemmTuner`] knows several *candidates* per call (this crate's two
//! tiles, hipBLAS when it is loaded and the operands are packed) and works in one of three
//! [`GemmTuningMode`]s:
//! - **off** (the default): this crate's kernel, no file.
//! - **tune**: the first call of a shape runs every candidate once into scratch memory, checks
//!   each result against the first candidate's (a candidate that disagrees is never chosen),
//!   times the rest ([`TuningConfig::warmup`] warm-up runs, then
//!   [`TuningConfig::repetitions`] timed runs through the [`TuningClock`]), runs the fastest on
//!   the caller's buffers and rewrites the results file. Later calls of that shape run the
//!   winner directly. These first calls wait for the device.
//! - **use**: the results file is read once and never written; shapes it lacks run the default.
//!
//! A "shape" is exact: dtype, transposes, batch, m, n, k and whether the operands are packed
//! ([`ShapeKey`]); alpha and beta are not part of it. Training repeats a handful of shapes, so
//! exact keys cost a few tunings per run.
//!
//! The results file ([`ResultsFile`], human-readable) carries the key of the machine it was
//! measured on ([`MachineKey`]: arch, CU count, HIP runtime, BLAS library, this crate's
//! version). A file whose key differs from the device's is ignored with a warning, never
//! trusted (in tune mode it is replaced by this machine's results). A malformed file is
//! [`TuningError::Corrupt`], naming the line. Writes go to a temporary file renamed over the old.
//!
//! The process-wide tuner that [`crate::ops::matmul()`] consults comes from the environment on
//! first use (`HIPK_GEMM_TUNING=off|tune|use`, `HIPK_GEMM_TUNING_FILE=<path>`, see
//! [`TuningConfig::from_env`]) or from [`set_gemm_tuner`]. Warnings go to stderr and to
//! [`TuningStats::warnings`].
//!
//! Timings on hip-emu are meaningless (it is a CPU): its tests inject a [`TuningClock`].

mod candidates;
mod file;
mod skinny;
mod tuner;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hip_rt::{Event, EventOptions, Stream};

pub use file::{Entry, MachineKey, ResultsFile, ShapeKey, Timing, MAGIC};
pub use skinny::lora_rule;
pub use tuner::{GemmTuner, TuningStats};

use super::Matmul;
use crate::ops::OpError;
use crate::params::{DeviceElement, OnDevice};

/// The environment variable selecting the mode: `off`, `tune` or `use`.
pub const ENV_MODE: &str = "HIPK_GEMM_TUNING";
/// The environment variable naming the results file (default [`DEFAULT_FILE`]).
pub const ENV_FILE: &str = "HIPK_GEMM_TUNING_FILE";
/// This crate's version (part of the results file's [`MachineKey`]).
pub const HIP_KERNELS_VERSION: &str = env!("CARGO_PKG_VERSION");
/// The results file when [`ENV_FILE`] is not set (in the working directory).
pub const DEFAULT_FILE: &str = "hipk-gemm-tuning.txt";

/// How [`GemmTuner`] picks a GEMM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemmTuningMode {
    /// This crate's kernel; no file is read or written.
    Off,
    /// Time the candidates on the first call of each shape, keep the fastest, write the file.
    Tune,
    /// Read the file; never time, never write.
    UseFile,
}

impl GemmTuningMode {
    /// Parse `off`, `tune` or `use` (also `0`, `1`, `use-file`), as [`ENV_MODE`] takes them.
    pub fn parse(value: &str) -> Option<GemmTuningMode> {
        match value.trim().to_ascii_lowercase().as_str() {
            "" | "off" | "0" => Some(GemmTuningMode::Off),
            "tune" | "1" => Some(GemmTuningMode::Tune),
            "use" | "use-file" | "read" => Some(GemmTuningMode::UseFile),
            _ => None,
        }
    }
}

/// What a [`GemmTuner`] does and where it keeps its results.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TuningConfig {
    /// The mode.
    pub mode: GemmTuningMode,
    /// The results file.
    pub file: PathBuf,
    /// Untimed runs of each candidate before timing it (after the verification run).
    pub warmup: usize,
    /// Timed runs of each candidate; the mean is kept.
    pub repetitions: usize,
}

impl Default for TuningConfig {
    fn default() -> Self {
        TuningConfig {
            mode: GemmTuningMode::Off,
            file: PathBuf::from(DEFAULT_FILE),
            warmup: 3,
            repetitions: 10,
        }
    }
}

impl TuningConfig {
    /// A config for `mode` with the file at `file` and the default repetitions.
    pub fn new(mode: GemmTuningMode, file: impl Into<PathBuf>) -> TuningConfig {
        TuningConfig {
            mode,
            file: file.into(),
            ..TuningConfig::default()
        }
    }

    /// The config [`ENV_MODE`] and [`ENV_FILE`] describe (unset: off, [`DEFAULT_FILE`]).
    pub fn from_env() -> Result<TuningConfig, TuningError> {
        Self::from_values(
            std::env::var(ENV_MODE).ok().as_deref(),
            std::env::var_os(ENV_FILE).map(PathBuf::from),
        )
    }

    /// [`TuningConfig::from_env`] on given values.
    pub fn from_values(
        mode: Option<&str>,
        file: Option<PathBuf>,
    ) -> Result<TuningConfig, TuningError> {
        let mode = match mode {
            None => GemmTuningMode::Off,
            Some(v) => GemmTuningMode::parse(v).ok_or_else(|| TuningError::Env {
                var: ENV_MODE,
                value: v.to_string(),
                reason: "expected off, tune or use",
            })?,
        };
        let file = match file {
            Some(f) if f.as_os_str().is_empty() => {
                return Err(TuningError::Env {
                    var: ENV_FILE,
                    value: String::new(),
                    reason: "the results file's path is empty; unset it for the default",
                })
            }
            Some(f) => f,
            None => PathBuf::from(DEFAULT_FILE),
        };
        Ok(TuningConfig {
            mode,
            file,
            ..TuningConfig::default()
        })
    }
}

/// Why GEMM tuning could not do what its mode asks.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TuningError {
    /// An environment variable has a value the tuner does not understand.
    #[error("{var}={value:?}: {reason}")]
    Env {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What is wrong and what it takes.
        reason: &'static str,
    },
    /// A line of the results file is malformed.
    #[error(
        "{}:{line}: corrupt GEMM tuning results ({reason}): {text:?}; fix the line, or delete \
         the file and tune again (HIPK_GEMM_TUNING=tune)",
        path.display()
    )]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The line's text.
        text: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Reading or writing the results file failed.
    #[error("{action} {}: {message}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done.
        action: &'static str,
        /// The OS error.
        message: String,
    },
    /// The machine's key (runtime version) could not be read.
    #[error("GEMM tuning cannot identify this machine: {0}")]
    Machine(String),
    /// Every candidate failed on a shape.
    #[error("GEMM tuning: no candidate ran {shape}: {failures}")]
    NoCandidate {
        /// The shape.
        shape: String,
        /// Each candidate's error.
        failures: String,
    },
}

/// Measures how long a candidate takes. The tuner runs the candidate once for verification and
/// [`TuningConfig::warmup`] times before calling this.
pub trait TuningClock: Send + Sync {
    /// Queue `run` `repetitions` times on `stream` (at least once) and return the mean time of
    /// one run. `candidate` is the candidate's name (a test clock may script times by it).
    fn measure(
        &self,
        stream: &Stream,
        candidate: &str,
        repetitions: usize,
        run: &mut dyn FnMut() -> Result<(), OpError>,
    ) -> Result<Duration, OpError>;
}

/// The real clock: HIP events recorded around the runs on the stream.
///
/// # Host sync
/// [`TuningClock::measure`] waits for the end event.
#[derive(Debug, Clone, Copy, Default)]
pub struct EventClock;

impl TuningClock for EventClock {
    fn measure(
        &self,
        stream: &Stream,
        _candidate: &str,
        repetitions: usize,
        run: &mut dyn FnMut() -> Result<(), OpError>,
    ) -> Result<Duration, OpError> {
        let device = stream.device();
        let start = Event::new(device, EventOptions::TIMING)?;
        let end = Event::new(device, EventOptions::TIMING)?;
        let reps = repetitions.max(1);
        start.record(stream)?;
        for _ in 0..reps {
            run()?;
        }
        end.record(stream)?;
        end.synchronize()?;
        let ms = start.elapsed_ms(&end)?;
        Ok(Duration::from_secs_f64(
            f64::from(ms.max(0.0)) / 1e3 / reps as f64,
        ))
    }
}

// The process-wide tuner: UNSET until the first matmul reads the environment (or
// set_gemm_tuner runs), then OFF or ON. The atomic keeps the default path free of locks.
const UNSET: u8 = 0;
const OFF: u8 = 1;
const ON: u8 = 2;
static STATE: AtomicU8 = AtomicU8::new(UNSET);
static GLOBAL: Mutex<Option<Arc<GemmTuner>>> = Mutex::new(None);

fn global_lock() -> std::sync::MutexGuard<'static, Option<Arc<GemmTuner>>> {
    // A panic while holding the lock cannot leave the Option half-written.
    GLOBAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Install `tuner` as the one [`crate::ops::matmul()`] consults (`None`: off), replacing the
/// environment's; returns the previous one.
pub fn set_gemm_tuner(tuner: Option<GemmTuner>) -> Option<Arc<GemmTuner>> {
    let mut g = global_lock();
    let on = tuner
        .as_ref()
        .is_some_and(|t| t.mode() != GemmTuningMode::Off);
    let previous = std::mem::replace(&mut *g, tuner.map(Arc::new));
    STATE.store(if on { ON } else { OFF }, Ordering::Release);
    previous
}

/// The tuner [`crate::ops::matmul()`] consults (reading the environment if no call did yet);
/// `None` when tuning is off.
pub fn gemm_tuner() -> Result<Option<Arc<GemmTuner>>, TuningError> {
    if STATE.load(Ordering::Acquire) == UNSET {
        init_from_env()?;
    }
    Ok(global_lock().clone())
}

fn init_from_env() -> Result<(), TuningError> {
    let mut g = global_lock();
    if STATE.load(Ordering::Acquire) != UNSET {
        return Ok(());
    }
    let config = TuningConfig::from_env()?;
    if config.mode == GemmTuningMode::Off {
        STATE.store(OFF, Ordering::Release);
        return Ok(());
    }
    *g = Some(Arc::new(GemmTuner::new(config)?));
    STATE.store(ON, Ordering::Release);
    Ok(())
}

/// Whether [`crate::ops::matmul()`] goes through the process-wide tuner.
pub(crate) fn global_active() -> Result<bool, TuningError> {
    match STATE.load(Ordering::Acquire) {
        OFF => Ok(false),
        ON => Ok(true),
        _ => {
            init_from_env()?;
            Ok(STATE.load(Ordering::Acquire) == ON)
        }
    }
}

/// [`crate::ops::matmul()`] through the process-wide tuner.
pub(crate) fn global_matmul<T: DeviceElement>(
    stream: &Stream,
    args: Matmul<'_, OnDevice, T>,
) -> Result<(), OpError> {
    let tuner = global_lock().clone();
    match tuner {
        Some(t) => t.matmul(stream, args),
        None => tuner::run_default(stream, args),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_and_files_come_from_the_environment_values() {
        let c = TuningConfig::from_values(None, None).unwrap();
        assert_eq!(
            (c.mode, c.file.to_str()),
            (GemmTuningMode::Off, Some(DEFAULT_FILE))
        );
        let c = TuningConfig::from_values(Some("Tune"), Some("/tmp/t.txt".into())).unwrap();
        assert_eq!(
            (c.mode, c.file.to_str()),
            (GemmTuningMode::Tune, Some("/tmp/t.txt"))
        );
        assert_eq!(GemmTuningMode::parse("use"), Some(GemmTuningMode::UseFile));
        let e = TuningConfig::from_values(Some("fast"), None).unwrap_err();
        assert!(e.to_string().contains("HIPK_GEMM_TUNING=\"fast\""), "{e}");
        let e = TuningConfig::from_values(Some("use"), Some(PathBuf::new())).unwrap_err();
        assert!(matches!(e, TuningError::Env { var: ENV_FILE, .. }), "{e}");
    }
}
