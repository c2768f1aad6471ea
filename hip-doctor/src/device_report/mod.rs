//! `hip-doctor --report DIR`: the first run on a DCU in one command. On device 0 it runs every
//! kernel family at GPT-2 124M's training shapes (bf16 activations, f32 optimizer), the GEMMs
//! beside hipBLAS on the same shapes, bandwidth-bound ops against the device's peak bandwidth,
//! attention against the static estimate of `docs/isa-baseline.json`, then tunes GPT-2's plain
//! GEMM shapes (`hip_kernels::ops::matmul::tuning`), and writes `DIR/device-report.json`,
//! `DIR/device-report.md` and the tuning results `DIR/gemm-tuning.txt`.
//!
//! Every output is written whole or not at all ([`hip_kernels::files::write_atomic`]: a
//! temporary beside it, renamed over it, so a symlink planted at an output's name is replaced,
//! never followed, and a full disk leaves the previous report as it was). Tuning writes into a
//! scratch directory inside DIR; its results replace `gemm-tuning.txt` only at the end, so an
//! interrupted run keeps the previous results. A failed write is named in
//! [`Outcome::write_errors`] (the binary exits 1).
//!
//! On an emulated device (hip-emu) it runs the same code on small shapes, and every figure is
//! labelled emulated. Budget on a DCU: a few seconds per row; the whole report well under ten
//! minutes (no row has run on a DCU yet).

mod benches;
mod render;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hip_kernels::ops::matmul::tuning::{ShapeKey, Timing};
use hip_kernels::ops::{GemmTuner, GemmTuningMode, Matmul, TuningConfig};
use hip_kernels::params::{DType, OnDevice};
use hip_rt::{Blas, Device, DeviceBuffer, Stream, StreamOptions};
use serde::Serialize;

pub use benches::{attention_flops, plain_gemms, GemmShape};

/// Model dimensions the report runs at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Dims {
    /// Name shown in the report.
    pub name: &'static str,
    pub batch: usize,
    pub seq: usize,
    pub channels: usize,
    pub heads: usize,
    pub vocab: usize,
    pub padded_vocab: usize,
    /// Parameters updated by AdamW.
    pub parameters: usize,
}

impl Dims {
    /// Rows of the activations (`batch · seq`).
    pub fn rows(&self) -> usize {
        self.batch * self.seq
    }
}

/// GPT-2 124M at llm.c's default micro-batch (B = 4, T = 1024).
pub const GPT2_124M: Dims = Dims {
    name: "GPT-2 124M (B=4, T=1024, C=768, H=12, V=50257)",
    batch: 4,
    seq: 1024,
    channels: 768,
    heads: 12,
    vocab: 50257,
    padded_vocab: 50304,
    parameters: 124_475_904,
};

/// Small shapes for emulated devices (the same code paths; hip-emu runs GPU threads on the CPU).
pub const SMALL: Dims = Dims {
    name: "small smoke shapes (B=1, T=64, C=64, H=2, V=500)",
    batch: 1,
    seq: 64,
    channels: 64,
    heads: 2,
    vocab: 500,
    padded_vocab: 512,
    parameters: 65_536,
};

/// Warm-up and timed runs per row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Effort {
    pub warmup: usize,
    pub runs: usize,
}

/// A measured row.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    /// `emulated — not a performance figure` on hip-emu, else `measured`.
    pub label: &'static str,
    pub op: String,
    pub shape: String,
    pub dtype: String,
    /// Median time of one call (µs); absent when the row failed.
    pub time_us: Option<f64>,
    /// GB/s or TFLOPS.
    pub rate: Option<f64>,
    pub unit: &'static str,
    /// `rate` ÷ the device's peak (bandwidth or f32 FMA rate).
    pub fraction_of_peak: Option<f64>,
    /// hipBLAS's time on the comparable work (µs), and what that work is.
    pub hipblas_time_us: Option<f64>,
    pub hipblas_note: Option<String>,
    /// hipBLAS time ÷ ours: above 1, ours is faster.
    pub speedup_vs_hipblas: Option<f64>,
    /// The static ISA estimate (% of FMA peak) and the TFLOPS it implies on this device.
    pub static_estimate_pct: Option<f64>,
    pub static_estimate_tflops: Option<f64>,
    pub error: Option<String>,
}

impl Row {
    fn new(op: &str, shape: &str, dtype: &str, unit: &'static str) -> Row {
        Row {
            label: "measured",
            op: op.into(),
            shape: shape.into(),
            dtype: dtype.into(),
            time_us: None,
            rate: None,
            unit,
            fraction_of_peak: None,
            hipblas_time_us: None,
            hipblas_note: None,
            speedup_vs_hipblas: None,
            static_estimate_pct: None,
            static_estimate_tflops: None,
            error: None,
        }
    }

    /// A compute row: `flops` per call.
    pub fn compute(op: &str, shape: &str, dtype: &str, t: Duration, flops: f64) -> Row {
        let s = t.as_secs_f64().max(1e-9);
        Row {
            time_us: Some(s * 1e6),
            rate: Some(flops / s / 1e12),
            ..Row::new(op, shape, dtype, "TFLOPS")
        }
    }

    /// A bandwidth row: `bytes` moved per call.
    pub fn bandwidth(op: &str, shape: &str, dtype: &str, t: Duration, bytes: f64) -> Row {
        let s = t.as_secs_f64().max(1e-9);
        Row {
            time_us: Some(s * 1e6),
            rate: Some(bytes / s / 1e9),
            ..Row::new(op, shape, dtype, "GB/s")
        }
    }

    /// A row whose run failed.
    pub fn failed(op: &str, shape: &str, dtype: &str, error: String) -> Row {
        Row {
            error: Some(error),
            ..Row::new(op, shape, dtype, "")
        }
    }

    /// With hipBLAS's time on the comparable work.
    pub fn with_blas(mut self, t: Option<Duration>, note: &str) -> Row {
        if let (Some(t), Some(ours)) = (t, self.time_us) {
            let us = t.as_secs_f64() * 1e6;
            self.hipblas_time_us = Some(us);
            self.hipblas_note = Some(note.into());
            self.speedup_vs_hipblas = Some(us / ours.max(1e-9));
        }
        self
    }
}

/// The device and its peaks, from its properties.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceFacts {
    pub name: String,
    pub arch: String,
    pub compute_units: u32,
    pub clock_mhz: f64,
    pub memory_clock_mhz: f64,
    pub memory_bus_width_bits: i32,
    /// 2 (double data rate) × memory clock × bus width ÷ 8.
    pub peak_bandwidth_gbs: f64,
    /// CUs × 64 lanes × 2 FLOPs (one FMA) × clock.
    pub peak_fp32_tflops: f64,
    pub emulated: bool,
    /// The HIP runtime's version and flavour (DTK or ROCm).
    pub hip_runtime: String,
    /// The BLAS library the hipBLAS figures come from, or why there is none.
    pub blas: String,
}

impl DeviceFacts {
    fn of(device: &Device) -> DeviceFacts {
        let p = device.props();
        let clock_mhz = f64::from(device.clock_rate_khz().max(0)) / 1e3;
        let memory_clock_mhz = f64::from(p.memory_clock_rate_khz.max(0)) / 1e3;
        let bus = p.memory_bus_width_bits.max(0);
        DeviceFacts {
            name: device.name().to_string(),
            arch: device.gcn_arch_name().to_string(),
            compute_units: device.compute_units(),
            clock_mhz,
            memory_clock_mhz,
            memory_bus_width_bits: bus,
            peak_bandwidth_gbs: peak_bandwidth_gbs(memory_clock_mhz, bus),
            peak_fp32_tflops: peak_fp32_tflops(device.compute_units(), clock_mhz),
            emulated: device.is_emulated(),
            hip_runtime: match hip_sys::hip().and_then(|h| Ok((h.runtime_version()?, h.flavour())))
            {
                Ok((v, flavour)) => format!("{v} ({flavour})"),
                Err(e) => format!("unknown: {e}"),
            },
            blas: String::new(),
        }
    }
}

fn file_name(p: &Path) -> String {
    p.file_name().map_or_else(
        || p.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// Peak memory bandwidth (GB/s): 2 transfers per clock × memory clock × bus width ÷ 8.
pub fn peak_bandwidth_gbs(memory_clock_mhz: f64, bus_width_bits: i32) -> f64 {
    2.0 * memory_clock_mhz * 1e6 * f64::from(bus_width_bits.max(0)) / 8.0 / 1e9
}

/// Peak f32 FMA rate (TFLOPS): CUs × 64 lanes × 2 FLOPs × clock.
pub fn peak_fp32_tflops(compute_units: u32, clock_mhz: f64) -> f64 {
    f64::from(compute_units) * 64.0 * 2.0 * clock_mhz * 1e6 / 1e12
}

/// One tuned GEMM shape.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TunedShape {
    pub name: String,
    pub shape: String,
    pub winner: Option<String>,
    /// Each candidate's mean time (µs), or `failed` / `wrong`.
    pub candidates: Vec<(String, String)>,
    pub error: Option<String>,
}

/// Part of the report on GEMM tuning.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TuningPart {
    /// As [`Row::label`].
    pub label: &'static str,
    pub file: PathBuf,
    pub shapes: Vec<TunedShape>,
    pub timings: u64,
    pub warnings: Vec<String>,
}

/// The whole report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceReport {
    /// "emulated — not a performance figure" on hip-emu, else "measured".
    pub label: String,
    pub hip_kernels_version: String,
    pub device: DeviceFacts,
    pub dims: Dims,
    pub effort: Effort,
    pub rows: Vec<Row>,
    pub tuning: TuningPart,
    /// Where the static estimates come from.
    pub static_source: String,
    pub elapsed_s: f64,
}

impl DeviceReport {
    /// Whether every row and every tuned shape ran.
    pub fn all_ran(&self) -> bool {
        self.rows.iter().all(|r| r.error.is_none())
            && self.tuning.shapes.iter().all(|s| s.error.is_none())
    }
}

/// What [`run`] did.
#[derive(Debug)]
pub struct Outcome {
    /// The report.
    pub report: DeviceReport,
    /// The files written, whole.
    pub written: Vec<PathBuf>,
    /// Each write that failed, naming its file (the previous file, if any, is left as it was).
    pub write_errors: Vec<String>,
}

/// The names of the outputs in DIR.
pub const JSON_FILE: &str = "device-report.json";
/// See [`JSON_FILE`].
pub const MD_FILE: &str = "device-report.md";
/// See [`JSON_FILE`].
pub const TUNING_FILE: &str = "gemm-tuning.txt";

/// Checks done before anything runs: `dir` is UTF-8 (the report records its paths as text),
/// is a directory or can be made one, and can be written; no output name in it is a directory.
pub fn check_dir(dir: &Path) -> Result<(), String> {
    if dir.to_str().is_none() {
        return Err(format!(
            "--report {}: the directory's name is not UTF-8 text; choose a name in UTF-8",
            dir.display()
        ));
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    for name in [JSON_FILE, MD_FILE, TUNING_FILE] {
        let p = dir.join(name);
        if p.symlink_metadata().is_ok_and(|m| m.is_dir()) {
            return Err(format!(
                "{} is a directory: the report cannot write its {name} there; move it away",
                p.display()
            ));
        }
    }
    hip_kernels::files::write_atomic(&dir.join(".hip-doctor-write-probe"), b"probe")
        .and_then(|()| std::fs::remove_file(dir.join(".hip-doctor-write-probe")))
        .map_err(|e| format!("{} is not writable: {e}", dir.display()))
}

/// Write the report's files into `dir`, each whole or not at all; `tuned`: the tuning results
/// made in a scratch directory (moved over `dir/gemm-tuning.txt`), `None` when tuning wrote
/// nothing (the previous file stays).
pub fn write_outputs(
    dir: &Path,
    json: &str,
    md: &str,
    tuned: Option<&Path>,
) -> (Vec<PathBuf>, Vec<String>) {
    let (mut written, mut errors) = (Vec::new(), Vec::new());
    for (name, text) in [(JSON_FILE, json), (MD_FILE, md)] {
        let p = dir.join(name);
        match hip_kernels::files::write_atomic(&p, text.as_bytes()) {
            Ok(()) => written.push(p),
            Err(e) => errors.push(format!("writing {}: {e}", p.display())),
        }
    }
    let p = dir.join(TUNING_FILE);
    let keep_mode = |t: &Path| -> std::io::Result<()> {
        // A shared results file keeps its permission bits (not those of the scratch file).
        if let Some(m) = p.symlink_metadata().ok().filter(std::fs::Metadata::is_file) {
            std::fs::set_permissions(t, m.permissions())?;
        }
        std::fs::rename(t, &p)
    };
    match tuned.map(keep_mode) {
        Some(Ok(())) => written.push(p),
        Some(Err(e)) => errors.push(format!(
            "writing {}: {e}; the tuning results are not saved",
            p.display()
        )),
        None => errors.push(format!(
            "{}: tuning saved no results (see the report's tuning warnings); the previous file, \
             if any, is unchanged",
            p.display()
        )),
    }
    (written, errors)
}

/// Runs the report on device 0 and writes it into `dir` (created if missing); `small` forces
/// the small shapes on a real device too. An error before the report ran (the directory, the
/// device) is `Err`; a failed write after it is in [`Outcome::write_errors`].
pub fn run(dir: &Path, small: bool) -> Result<Outcome, String> {
    let started = Instant::now();
    check_dir(dir)?;
    let device = Device::get(0).map_err(|e| format!("device 0: {e}"))?;
    let facts = DeviceFacts::of(&device);
    let emulated = facts.emulated;
    let (dims, effort) = if emulated || small {
        (SMALL, Effort { warmup: 1, runs: 2 })
    } else {
        (
            GPT2_124M,
            Effort {
                warmup: 3,
                runs: 10,
            },
        )
    };
    let stream =
        Arc::new(Stream::new(&device, StreamOptions::default()).map_err(|e| e.to_string())?);
    let blas = Blas::new(stream.clone());
    let mut facts = facts;
    facts.blas = match &blas {
        Ok(b) => {
            let path = match b.backend() {
                hip_rt::BlasBackend::HipBlas => {
                    hip_sys::blas::hipblas().map(|l| file_name(l.loaded_path()))
                }
                hip_rt::BlasBackend::RocBlas => {
                    hip_sys::blas::rocblas().map(|l| file_name(l.loaded_path()))
                }
            };
            format!("{:?} {}", b.backend(), path.unwrap_or_default())
        }
        Err(e) => format!("none (no hipBLAS figures): {e}"),
    };
    let blas = blas.ok();
    let s = &*stream;
    let mut rows = benches::bandwidth_rows(s, &dims, effort);
    rows.extend(benches::matmul_bias_rows(s, blas.as_ref(), &dims, effort));
    rows.extend(
        plain_gemms(&dims)
            .iter()
            .map(|g| benches::gemm_row(s, blas.as_ref(), g, effort)),
    );
    rows.extend(benches::attention_rows(s, blas.as_ref(), &dims, effort));
    for r in &mut rows {
        if let Some(rate) = r.rate {
            let peak = if r.unit == "GB/s" {
                facts.peak_bandwidth_gbs
            } else {
                facts.peak_fp32_tflops
            };
            r.fraction_of_peak = (peak > 0.0).then(|| rate / peak);
        }
        let head_dim = dims.channels / dims.heads;
        if let Some(pct) = static_estimate(&r.op, head_dim) {
            r.static_estimate_pct = Some(pct);
            r.static_estimate_tflops = Some(pct / 100.0 * facts.peak_fp32_tflops);
        }
    }
    let scratch = tempfile::Builder::new()
        .prefix(".gemm-tuning.")
        .tempdir_in(dir)
        .map_err(|e| format!("creating a scratch directory in {}: {e}", dir.display()))?;
    let scratch_file = scratch.path().join(TUNING_FILE);
    let mut tuning = tune(s, &dims, effort, &scratch_file);
    tuning.file = dir.join(TUNING_FILE);
    let label = if emulated {
        hip_rt::EMULATED_FIGURE_LABEL
    } else {
        "measured"
    };
    for r in &mut rows {
        r.label = label;
    }
    tuning.label = label;
    let report = DeviceReport {
        label: label.to_string(),
        hip_kernels_version: hip_kernels::ops::matmul::tuning::HIP_KERNELS_VERSION.to_string(),
        device: facts,
        dims,
        effort,
        rows,
        tuning,
        static_source:
            "docs/isa-baseline.json (static ISA figures for gfx906, hipcc 5.2; not measurements)"
                .into(),
        elapsed_s: started.elapsed().as_secs_f64(),
    };
    let json = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
    let md = render::markdown(&report);
    let tuned = scratch_file.is_file().then_some(scratch_file.as_path());
    let (written, write_errors) = write_outputs(dir, &(json + "\n"), &md, tuned);
    Ok(Outcome {
        report,
        written,
        write_errors,
    })
}

/// The static ISA estimate (% of FMA peak) of the attention kernels at `head_dim` (bf16), from
/// the committed baseline: the forward's hot loop, the mean of the backward's dq and dkdv.
pub fn static_estimate(op: &str, head_dim: usize) -> Option<f64> {
    const BASELINE: &str = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/isa-baseline.json"
    ));
    let v: serde_json::Value = serde_json::from_str(BASELINE).ok()?;
    let bucket = [32, 64, 96, 128].into_iter().find(|&b| head_dim <= b)?;
    let pct = |kernel: String| -> Option<f64> {
        v["kernels"]
            .as_array()?
            .iter()
            .find(|k| k["kernel"] == kernel.as_str())?["loops"][0]["est_pct_fma_peak"]
            .as_f64()
    };
    match op {
        "attention_forward" => pct(format!("attention_fwd_d{bucket}_bf16")),
        "attention_backward" => {
            let (dq, dkdv) = (
                pct(format!("attention_bwd_dq_d{bucket}_bf16"))?,
                pct(format!("attention_bwd_dkdv_d{bucket}_bf16"))?,
            );
            Some((dq + dkdv) / 2.0)
        }
        _ => None,
    }
}

/// Tunes every plain GEMM shape of the model into `file` (a new file in a scratch directory),
/// with HIP events.
fn tune(s: &Stream, dims: &Dims, effort: Effort, file: &Path) -> TuningPart {
    let config = TuningConfig {
        warmup: effort.warmup,
        repetitions: effort.runs,
        ..TuningConfig::new(GemmTuningMode::Tune, file)
    };
    let tuner = match GemmTuner::new(config) {
        Ok(t) => t,
        Err(e) => {
            return TuningPart {
                label: "measured",
                file: file.into(),
                shapes: Vec::new(),
                timings: 0,
                warnings: vec![e.to_string()],
            }
        }
    };
    let shapes = plain_gemms(dims)
        .iter()
        .map(|g| {
            let p = g.params;
            let shape = ShapeKey::of(&p, DType::BF16).to_string();
            let run = || -> Result<(), String> {
                let b16 = |len: Result<usize, _>| -> Result<DeviceBuffer<half::bf16>, String> {
                    let len = len.map_err(|e: hip_kernels::params::ShapeError| e.to_string())?;
                    DeviceBuffer::from_slice(s, &vec![half::bf16::from_f32(0.01); len])
                        .map_err(|e| e.to_string())
                };
                let (a, b, mut out) = (b16(p.a_len())?, b16(p.b_len())?, b16(p.out_len())?);
                tuner
                    .matmul(
                        s,
                        Matmul::<OnDevice, half::bf16> {
                            params: p,
                            a: &a,
                            b: &b,
                            out: &mut out,
                        },
                    )
                    .map_err(|e| e.to_string())?;
                s.synchronize().map_err(|e| e.to_string())
            };
            let error = run().err();
            let key = ShapeKey::of(&p, DType::BF16);
            let entry = tuner.entry(&key);
            TunedShape {
                name: g.name.to_string(),
                shape,
                winner: entry.as_ref().map(|e| e.winner.clone()),
                candidates: entry
                    .map(|e| {
                        e.timings
                            .iter()
                            .map(|(n, t)| (n.clone(), timing_text(t)))
                            .collect()
                    })
                    .unwrap_or_default(),
                error,
            }
        })
        .collect();
    let stats = tuner.stats();
    TuningPart {
        label: "measured",
        file: file.into(),
        shapes,
        timings: stats.timings,
        warnings: stats.warnings,
    }
}

fn timing_text(t: &Timing) -> String {
    match t {
        Timing::Micros(us) => format!("{us:.1} µs"),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod files_tests;
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peaks_follow_the_properties() {
        // MI50 / Z100-class: 1000 MHz HBM2 on a 4096-bit bus, 60 CUs at 1725 MHz.
        assert!((peak_bandwidth_gbs(1000.0, 4096) - 1024.0).abs() < 1e-9);
        assert!((peak_fp32_tflops(60, 1725.0) - 13.248).abs() < 1e-9);
        assert_eq!(peak_bandwidth_gbs(1000.0, -1), 0.0);
    }

    #[test]
    fn static_estimates_come_from_the_committed_baseline() {
        let fwd = static_estimate("attention_forward", 64).expect("d64 forward in the baseline");
        let bwd = static_estimate("attention_backward", 64).expect("d64 backward in the baseline");
        assert!(
            fwd > 0.0 && fwd <= 100.0 && bwd > 0.0 && bwd <= 100.0,
            "{fwd} {bwd}"
        );
        // Head dims round up to the kernels' buckets; other ops have no estimate.
        assert_eq!(
            static_estimate("attention_forward", 50),
            static_estimate("attention_forward", 64)
        );
        assert_eq!(static_estimate("attention_forward", 129), None);
        assert_eq!(static_estimate("layernorm_forward", 64), None);
    }

    #[test]
    fn gpt2_gemms_are_the_trainers_shapes() {
        let g = plain_gemms(&GPT2_124M);
        assert_eq!(g.len(), 11);
        let lm = g[0].params;
        assert_eq!((lm.m, lm.n, lm.k, lm.trans_b), (4096, 50257, 768, true));
        let dw = g.iter().find(|s| s.name == "fc dW").unwrap().params;
        assert_eq!(
            (dw.m, dw.n, dw.k, dw.trans_a, dw.beta),
            (768, 3072, 4096, true, 1.0)
        );
        let p = benches::attention_params(&GPT2_124M);
        assert_eq!((p.heads, p.head_dim, p.causal), (12, 64, true));
        // Causal forward: half of 4·B·H·T²·D.
        assert_eq!(
            attention_flops(&p, false),
            2.0 * 48.0 * 1024.0 * 1024.0 * 64.0
        );
    }

    #[test]
    fn failed_rows_and_emulated_labels_reach_the_markdown() {
        let mut facts = DeviceFacts {
            name: "x".into(),
            arch: "gfx906".into(),
            compute_units: 1,
            clock_mhz: 1.0,
            memory_clock_mhz: 1.0,
            memory_bus_width_bits: 8,
            peak_bandwidth_gbs: 0.0,
            peak_fp32_tflops: 0.0,
            emulated: true,
            hip_runtime: "5.2.0 (ROCm)".into(),
            blas: "HipBlas x".into(),
        };
        facts.peak_bandwidth_gbs = peak_bandwidth_gbs(facts.memory_clock_mhz, 8);
        let report = DeviceReport {
            label: hip_rt::EMULATED_FIGURE_LABEL.into(),
            hip_kernels_version: "0".into(),
            device: facts,
            dims: SMALL,
            effort: Effort { warmup: 0, runs: 1 },
            rows: vec![
                Row::failed("gelu_backward", "[1]", "bf16", "boom | here".into()),
                Row::bandwidth("adamw", "1", "f32", Duration::from_micros(5), 1e3),
            ],
            tuning: TuningPart {
                label: "measured",
                file: "t.txt".into(),
                shapes: Vec::new(),
                timings: 0,
                warnings: vec!["w1".into()],
            },
            static_source: "s".into(),
            elapsed_s: 0.0,
        };
        assert!(!report.all_ran());
        let md = render::markdown(&report);
        assert!(md.contains("FAILED: boom / here"), "{md}");
        assert!(
            md.contains("Every figure below is emulated — not a performance figure"),
            "{md}"
        );
        assert!(
            md.contains("| adamw | 1 | f32 | 5.0 | 0.200 GB/s |"),
            "{md}"
        );
        assert!(md.contains("- w1"), "{md}");
    }
}
