//! [`GemmTuner`]: looks a shape up, tunes it when the mode says so, runs the chosen candidate.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use hip_rt::memory::buffer::{DeviceView, DeviceViewMut};
use hip_rt::{Blas, Device, DeviceBuffer, Stream};

use super::candidates::{by_name, candidates, Applicability, Context};
use super::file::{Entry, MachineKey, ResultsFile, ShapeKey, Timing};
use super::{EventClock, GemmTuningMode, TuningClock, TuningConfig, TuningError};
use crate::ops::launch::ptr;
use crate::ops::matmul::{launch_gemm, Matmul, MatmulKernel, MatmulParams};
use crate::ops::OpError;
use crate::params::{DeviceElement, OnDevice};
use crate::tolerance::{tolerance, Rule, Tolerance};

/// What a [`GemmTuner`] has done so far.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TuningStats {
    /// Candidates timed (one per candidate per tuned shape).
    pub timings: u64,
    /// Shapes tuned.
    pub tuned_shapes: u64,
    /// Calls that ran a winner recorded in the results file (or tuned earlier in this process).
    pub tuned_runs: u64,
    /// Calls that ran this crate's default kernel (no entry for the shape in use mode, or an
    /// entry whose winner cannot run here).
    pub default_runs: u64,
    /// Every warning given (also printed to stderr).
    pub warnings: Vec<String>,
}

/// One device's view of the results: its key, its BLAS handle, whether the results apply.
struct DeviceState {
    key: MachineKey,
    blas: Option<Blas>,
    /// The results in `State::results` were measured on this key.
    usable: bool,
}

struct State {
    /// The machine the results belong to (the file's, once a device matched it or tuned).
    results_key: Option<MachineKey>,
    /// The file as loaded (its key is checked against each device on first use).
    loaded: Option<ResultsFile>,
    results: BTreeMap<ShapeKey, Entry>,
    devices: HashMap<i32, DeviceState>,
    stats: TuningStats,
}

/// Picks, per GEMM shape, the fastest of several correct implementations (module docs of
/// [`super`]). `Sync`: calls from several threads take turns.
pub struct GemmTuner {
    config: TuningConfig,
    clock: Arc<dyn TuningClock>,
    state: Mutex<State>,
}

impl std::fmt::Debug for GemmTuner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GemmTuner")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl GemmTuner {
    /// A tuner for `config`, timing with HIP events ([`EventClock`]). Reads the results file
    /// now (except in off mode): a malformed file is [`TuningError::Corrupt`]; a missing one
    /// is empty (with a warning in use mode).
    pub fn new(config: TuningConfig) -> Result<GemmTuner, TuningError> {
        let mut stats = TuningStats::default();
        let loaded = match config.mode {
            GemmTuningMode::Off => None,
            _ => ResultsFile::load(&config.file)?,
        };
        if loaded.is_none() && config.mode == GemmTuningMode::UseFile {
            warn(
                &mut stats,
                format!(
                    "GEMM tuning results {} not found: every shape runs the default kernel \
                     (HIPK_GEMM_TUNING=tune writes the file)",
                    config.file.display()
                ),
            );
        }
        Ok(GemmTuner {
            config,
            clock: Arc::new(EventClock),
            state: Mutex::new(State {
                results_key: None,
                loaded,
                results: BTreeMap::new(),
                devices: HashMap::new(),
                stats,
            }),
        })
    }

    /// The same tuner timing with `clock` (tests on hip-emu inject one).
    pub fn with_clock(mut self, clock: Arc<dyn TuningClock>) -> GemmTuner {
        self.clock = clock;
        self
    }

    /// The mode.
    pub fn mode(&self) -> GemmTuningMode {
        self.config.mode
    }

    /// The config.
    pub fn config(&self) -> &TuningConfig {
        &self.config
    }

    /// What it has done so far.
    pub fn stats(&self) -> TuningStats {
        self.lock().stats.clone()
    }

    /// The winner recorded for `shape` in `dtype` (from the file or tuned in this process),
    /// as far as a device has been seen whose key matches the results.
    pub fn winner(&self, key: &ShapeKey) -> Option<String> {
        self.entry(key).map(|e| e.winner)
    }

    /// The whole entry for `key` (winner and every candidate's timing), as [`Self::winner`].
    pub fn entry(&self, key: &ShapeKey) -> Option<Entry> {
        self.lock().results.get(key).cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Every update of State is a single assignment or insert; a panic elsewhere while the
        // lock was held leaves it consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// [`crate::ops::matmul()`] with the GEMM this tuner picks for the shape.
    ///
    /// # Host sync
    /// In tune mode the first call of each shape waits for the device (verification copies and
    /// the timing events); every other call only queues work.
    pub fn matmul<T: DeviceElement>(
        &self,
        stream: &Stream,
        args: Matmul<'_, OnDevice, T>,
    ) -> Result<(), OpError> {
        args.validate()?;
        if self.config.mode == GemmTuningMode::Off {
            return run_default(stream, args);
        }
        let params = args.params;
        if params.m == 0 || params.n == 0 || params.batch == 0 || params.k == 0 {
            // Nothing to choose between: no product (k = 0 only scales C).
            return run_default(stream, args);
        }
        let shape = ShapeKey::of(&params, T::DTYPE);
        let mut guard = self.lock();
        let st = &mut *guard;
        let device = stream.device();
        if !st.devices.contains_key(&device.ordinal()) {
            let d = self.first_use(st, device)?;
            st.devices.insert(device.ordinal(), d);
        }
        let Some(dev) = st.devices.get(&device.ordinal()) else {
            return run_default(stream, args);
        };
        let cx = Context {
            stream,
            blas: dev.blas.as_ref(),
        };
        let applies = Applicability {
            params: &params,
            has_blas: dev.blas.is_some(),
            arch: device.arch(),
        };
        if !dev.usable {
            st.stats.default_runs += 1;
            return run_default(stream, args);
        }
        if let Some(entry) = st.results.get(&shape) {
            match by_name::<T>(&entry.winner).filter(|c| (c.applies)(&applies)) {
                Some(c) => {
                    st.stats.tuned_runs += 1;
                    return (c.run)(&cx, &params, args.a, args.b, args.out);
                }
                None => {
                    let msg = format!(
                        "GEMM tuning: the recorded winner {:?} for {shape} cannot run here; \
                         running the default kernel",
                        entry.winner
                    );
                    warn(&mut st.stats, msg);
                    st.results.remove(&shape);
                }
            }
        }
        if self.config.mode != GemmTuningMode::Tune {
            st.stats.default_runs += 1;
            return run_default(stream, args);
        }
        let (a, b, out) = (args.a, args.b, args.out);
        let entry = self.tune(&mut st.stats, &cx, &applies, &shape, a, b, &mut *out)?;
        let winner = by_name::<T>(&entry.winner).ok_or_else(|| TuningError::NoCandidate {
            shape: shape.to_string(),
            failures: format!("the winner {:?} vanished", entry.winner),
        })?;
        (winner.run)(&cx, &params, a, b, out)?;
        st.results.insert(shape, entry);
        st.stats.tuned_shapes += 1;
        st.stats.tuned_runs += 1;
        let key = st.results_key.clone().unwrap_or_else(|| dev.key.clone());
        let file = ResultsFile {
            key,
            entries: st.results.clone(),
        };
        file.save(&self.config.file)?;
        Ok(())
    }

    /// The device's key and BLAS handle; decides whether the loaded results apply to it.
    fn first_use(&self, st: &mut State, device: &Device) -> Result<DeviceState, TuningError> {
        let (blas, blas_id) = match Blas::new(Arc::new(Stream::null(device))) {
            Ok(b) => {
                let id = blas_id(&b);
                (Some(b), id)
            }
            Err(e) => {
                warn(
                    &mut st.stats,
                    format!(
                        "GEMM tuning: no hipBLAS candidate on device {}: {e}",
                        device.ordinal()
                    ),
                );
                (None, "none".to_string())
            }
        };
        let key = MachineKey {
            arch: device.gcn_arch_name().to_string(),
            compute_units: device.compute_units(),
            hip_runtime: runtime_id()?,
            blas: blas_id,
            hip_kernels: super::HIP_KERNELS_VERSION.to_string(),
        };
        let usable = match (&st.results_key, st.loaded.take()) {
            (Some(results_key), _) => {
                let diff = results_key.differences(&key);
                if !diff.is_empty() {
                    warn(
                        &mut st.stats,
                        format!(
                            "GEMM tuning: device {} differs from the device the results are for \
                             ({}): it runs the default kernel",
                            device.ordinal(),
                            diff.join("; ")
                        ),
                    );
                }
                diff.is_empty()
            }
            (None, Some(file)) => {
                let diff = file.key.differences(&key);
                if diff.is_empty() {
                    st.results = file.entries;
                } else {
                    let fate = match self.config.mode {
                        GemmTuningMode::Tune => "it will be replaced by this machine's results",
                        _ => "every shape runs the default kernel",
                    };
                    warn(
                        &mut st.stats,
                        format!(
                            "GEMM tuning results {} ignored: written on another machine or \
                             version ({}); {fate}",
                            self.config.file.display(),
                            diff.join("; ")
                        ),
                    );
                }
                st.results_key = Some(key.clone());
                true
            }
            (None, None) => {
                st.results_key = Some(key.clone());
                true
            }
        };
        Ok(DeviceState { key, blas, usable })
    }

    /// Time every applicable candidate on `shape`, verified against the first that runs.
    #[allow(clippy::too_many_arguments)]
    fn tune<T: DeviceElement>(
        &self,
        stats: &mut TuningStats,
        cx: &Context<'_>,
        applies: &Applicability<'_>,
        shape: &ShapeKey,
        a: &dyn DeviceView<T>,
        b: &dyn DeviceView<T>,
        out: &mut dyn DeviceViewMut<T>,
    ) -> Result<Entry, OpError> {
        let params = applies.params;
        let stream = cx.stream;
        let mut scratch = DeviceBuffer::<T>::alloc(stream, out.len())?;
        let tol = verify_tolerance(params, T::DTYPE);
        let mut reference: Option<Vec<T>> = None;
        let mut timings = Vec::new();
        let mut failures = Vec::new();
        for c in candidates::<T>()
            .into_iter()
            .filter(|c| (c.applies)(applies))
        {
            let once = |scratch: &mut DeviceBuffer<T>| -> Result<Vec<T>, OpError> {
                if params.beta != 0.0 {
                    stream.copy_dtod(&*out, scratch)?;
                }
                (c.run)(cx, params, a, b, scratch)?;
                let mut host = vec![T::from_f32(0.0); scratch.len()];
                stream.copy_dtoh(&*scratch, &mut host)?;
                Ok(host)
            };
            let got = match once(&mut scratch) {
                Ok(got) => got,
                Err(e) => {
                    warn(
                        stats,
                        format!("GEMM tuning: {} failed on {shape}: {e}", c.name),
                    );
                    failures.push(format!("{}: {e}", c.name));
                    timings.push((c.name.to_string(), Timing::Failed));
                    continue;
                }
            };
            match &reference {
                None => reference = Some(got),
                Some(r) => {
                    if let Some(i) = first_mismatch(r, &got, tol) {
                        warn(
                            stats,
                            format!(
                                "GEMM tuning: {} disagrees with {} on {shape} at element {i} \
                                 ({:?} vs {:?}): never chosen",
                                c.name,
                                timings.first().map_or("", |(n, _): &(String, Timing)| n),
                                got[i],
                                r[i]
                            ),
                        );
                        timings.push((c.name.to_string(), Timing::Wrong));
                        continue;
                    }
                }
            }
            let mut run = || (c.run)(cx, params, a, b, &mut scratch);
            let measured = (0..self.config.warmup)
                .try_for_each(|_| run())
                .and_then(|()| {
                    self.clock
                        .measure(stream, c.name, self.config.repetitions, &mut run)
                });
            match measured {
                Ok(d) => {
                    stats.timings += 1;
                    timings.push((c.name.to_string(), Timing::Micros(d.as_secs_f64() * 1e6)));
                }
                Err(e) => {
                    warn(
                        stats,
                        format!("GEMM tuning: timing {} on {shape} failed: {e}", c.name),
                    );
                    failures.push(format!("{}: {e}", c.name));
                    timings.push((c.name.to_string(), Timing::Failed));
                }
            }
        }
        let winner = timings
            .iter()
            .filter_map(|(n, t)| match t {
                Timing::Micros(us) => Some((n, *us)),
                _ => None,
            })
            .min_by(|x, y| x.1.total_cmp(&y.1))
            .map(|(n, _)| n.clone())
            .ok_or_else(|| TuningError::NoCandidate {
                shape: shape.to_string(),
                failures: failures.join("; "),
            })?;
        Ok(Entry { winner, timings })
    }
}

/// This crate's kernel, as [`crate::ops::matmul()`] runs it with tuning off.
pub(crate) fn run_default<T: DeviceElement>(
    stream: &Stream,
    args: Matmul<'_, OnDevice, T>,
) -> Result<(), OpError> {
    let ptrs = [
        ptr(stream, "a", args.a)?,
        ptr(stream, "b", args.b)?,
        ptr(stream, "out", args.out)?,
    ];
    launch_gemm::<T>(stream, &args.params, ptrs, None, MatmulKernel::Auto)
}

/// Two f32-accumulating GEMMs may each be off by the reduction rule's tolerance from the exact
/// result, so their difference is held to twice it.
fn verify_tolerance(params: &MatmulParams, dtype: crate::params::DType) -> Tolerance {
    let t = tolerance(Rule::Reduction, "out", dtype, dtype, params.k);
    Tolerance {
        rtol: 2.0 * t.rtol,
        atol: 2.0 * t.atol,
    }
}

/// The first index where `got` and `reference` differ beyond `tol`, scaled by the reference's
/// largest magnitude (the inputs are the caller's, not N(0, 1)).
fn first_mismatch<T: DeviceElement>(reference: &[T], got: &[T], tol: Tolerance) -> Option<usize> {
    let scale = reference
        .iter()
        .map(|v| v.to_f64().abs())
        .filter(|v| v.is_finite())
        .fold(1.0f64, f64::max);
    let tol = Tolerance {
        rtol: tol.rtol,
        atol: tol.atol * scale,
    };
    reference
        .iter()
        .zip(got)
        .position(|(r, g)| !tol.allows(g.to_f64(), r.to_f64()))
}

fn warn(stats: &mut TuningStats, message: String) {
    eprintln!("hip-kernels: warning: {message}");
    stats.warnings.push(message);
}

/// `hipblas <file name>` or `rocblas <file name>` of the library behind `blas`.
fn blas_id(blas: &Blas) -> String {
    let file = |p: &std::path::Path| {
        std::fs::canonicalize(p)
            .unwrap_or_else(|_| p.to_path_buf())
            .file_name()
            .map_or_else(
                || p.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            )
    };
    match blas.backend() {
        hip_rt::BlasBackend::HipBlas => match hip_sys::blas::hipblas() {
            Ok(lib) => format!("hipblas {}", file(lib.loaded_path())),
            Err(_) => "hipblas unknown".to_string(),
        },
        hip_rt::BlasBackend::RocBlas => match hip_sys::blas::rocblas() {
            Ok(lib) => format!("rocblas {}", file(lib.loaded_path())),
            Err(_) => "rocblas unknown".to_string(),
        },
    }
}

/// The HIP runtime's version and flavour, plus DTK's version file when the runtime has one.
fn runtime_id() -> Result<String, TuningError> {
    let hip = hip_sys::hip().map_err(|e| TuningError::Machine(e.to_string()))?;
    let version = hip
        .runtime_version()
        .map_err(|e| TuningError::Machine(e.to_string()))?;
    let mut id = format!("{version} {}", hip.flavour());
    if let Some(path) = &hip.flavour_evidence().dtk_version_file {
        if let Ok(text) = std::fs::read_to_string(path) {
            let v = text.split_whitespace().collect::<Vec<_>>().join("_");
            if !v.is_empty() {
                id.push_str(" dtk ");
                id.push_str(&v);
            }
        }
    }
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::DType;

    #[test]
    fn mismatches_are_found_relative_to_the_largest_value() {
        let p = MatmulParams::new(2, 2, 64);
        let tol = verify_tolerance(&p, DType::F32);
        let r = [100.0f32, 1.0, -3.0, 0.0];
        assert_eq!(first_mismatch(&r, &r, tol), None);
        // 1e-3 absolute on values up to 100 is within 2·(1e-5 + 4u·64)·100 ≈ 2.3e-3.
        assert_eq!(first_mismatch(&r, &[100.0, 1.001, -3.0, 0.0], tol), None);
        assert_eq!(first_mismatch(&r, &[100.0, 1.0, -3.1, 0.0], tol), Some(2));
        assert_eq!(
            first_mismatch(&r, &[100.0, 1.0, -3.0, f32::NAN], tol),
            Some(3)
        );
    }
}
