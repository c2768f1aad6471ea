//! The device report as Markdown.

use std::fmt::Write as _;

use super::{DeviceReport, Row};

/// Three significant digits, in scientific notation below 0.01 (emulated rates are tiny).
fn sig(x: f64) -> String {
    if x == 0.0 || !x.is_finite() || x.abs() >= 0.01 {
        format!("{x:.3}")
    } else {
        format!("{x:.2e}")
    }
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "–".to_string(), |x| format!("{x:.digits$}"))
}

fn rate(v: Option<f64>) -> String {
    v.map_or_else(|| "–".to_string(), sig)
}

fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "–".to_string(), |x| format!("{} %", sig(100.0 * x)))
}

fn row_line(r: &Row) -> String {
    if let Some(e) = &r.error {
        return format!(
            "| {} | {} | {} | FAILED: {} | | | | | |",
            r.op,
            r.shape,
            r.dtype,
            e.replace('|', "/")
        );
    }
    let stat = match (r.static_estimate_pct, r.static_estimate_tflops) {
        (Some(p), Some(t)) => format!("{p:.1} % of FMA peak = {t:.2} TFLOPS (static)"),
        _ => "–".into(),
    };
    format!(
        "| {} | {} | {} | {} | {} {} | {} | {} | {} | {} |",
        r.op,
        r.shape,
        r.dtype,
        opt(r.time_us, 1),
        rate(r.rate),
        r.unit,
        pct(r.fraction_of_peak),
        opt(r.hipblas_time_us, 1),
        opt(r.speedup_vs_hipblas, 2),
        stat
    )
}

/// The report as one Markdown document.
pub fn markdown(r: &DeviceReport) -> String {
    let mut s = String::new();
    let d = &r.device;
    let emu = d.emulated;
    let _ = writeln!(s, "# Device report: {} ({})\n", d.name, d.arch);
    if emu {
        let _ = writeln!(
            s,
            "**Every figure below is {}**: the device is hip-emu, which runs the GPU threads on \
             the CPU. This report shows that the command runs end to end and what it prints; \
             none of its times, rates or tuning winners says anything about a GPU.\n",
            r.label
        );
    }
    let _ = writeln!(
        s,
        "Written by `hip-doctor --report` (hip-kernels {}) in {:.1} s. Shapes: {}. Each row: \
         mean of {} back-to-back calls after {} warm-up calls, timed with HIP events.\n",
        r.hip_kernels_version, r.elapsed_s, r.dims.name, r.effort.runs, r.effort.warmup
    );
    let _ = writeln!(s, "## Device\n");
    let _ = writeln!(s, "| property | value |\n|---|---|");
    let _ = writeln!(s, "| HIP runtime | {} |", d.hip_runtime);
    let _ = writeln!(s, "| BLAS | {} |", d.blas.replace('|', "/"));
    let _ = writeln!(s, "| compute units | {} |", d.compute_units);
    let _ = writeln!(s, "| clock | {:.0} MHz |", d.clock_mhz);
    let _ = writeln!(
        s,
        "| memory clock × bus width | {:.0} MHz × {} bits |",
        d.memory_clock_mhz, d.memory_bus_width_bits
    );
    let _ = writeln!(
        s,
        "| peak bandwidth (2 × memory clock × bus width ÷ 8) | {:.1} GB/s{} |",
        d.peak_bandwidth_gbs,
        if emu {
            " (emulated device's properties)"
        } else {
            ""
        }
    );
    let _ = writeln!(
        s,
        "| peak f32 FMA rate (CUs × 64 lanes × 2 × clock) | {:.2} TFLOPS{} |\n",
        d.peak_fp32_tflops,
        if emu {
            " (emulated device's properties)"
        } else {
            ""
        }
    );
    let _ = writeln!(s, "## Kernels [{}]\n", r.label);
    let _ = writeln!(
        s,
        "`% of peak`: GB/s against the peak bandwidth, TFLOPS against the f32 FMA peak. \
         `hipBLAS ÷ ours`: hipBLAS's time over ours on the comparable work (above 1: ours is \
         faster); what hipBLAS ran is in the notes. Static estimates come from {}.\n",
        r.static_source
    );
    let _ = writeln!(
        s,
        "| op | shape | dtype | time (µs) | rate | % of peak | hipBLAS (µs) | hipBLAS ÷ ours | static estimate |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|");
    for row in &r.rows {
        let _ = writeln!(s, "{}", row_line(row));
    }
    let mut notes: Vec<&str> = r
        .rows
        .iter()
        .filter_map(|x| x.hipblas_note.as_deref())
        .collect();
    notes.sort_unstable();
    notes.dedup();
    if !notes.is_empty() {
        let _ = writeln!(s, "\nWhat hipBLAS ran:\n");
        for n in notes {
            let _ = writeln!(s, "- {n}");
        }
    }
    let t = &r.tuning;
    let _ = writeln!(s, "\n## GEMM tuning [{}]\n", r.label);
    let _ = writeln!(
        s,
        "Every plain GEMM of a training step, tuned with `HIPK_GEMM_TUNING=tune` semantics (each \
         candidate verified against the first, then timed with HIP events); {} candidates \
         timed. Results file: `{}` (use it with `HIPK_GEMM_TUNING=use \
         HIPK_GEMM_TUNING_FILE=<that file>` on this machine type).\n",
        t.timings,
        t.file.file_name().map_or_else(
            || t.file.display().to_string(),
            |n| n.to_string_lossy().into_owned()
        )
    );
    let _ = writeln!(
        s,
        "| GEMM | shape | winner | candidates |\n|---|---|---|---|"
    );
    for sh in &t.shapes {
        let cands: Vec<String> = sh
            .candidates
            .iter()
            .map(|(n, v)| format!("{n} {v}"))
            .collect();
        let winner = match (&sh.winner, &sh.error) {
            (_, Some(e)) => format!("FAILED: {}", e.replace('|', "/")),
            (Some(w), None) => w.clone(),
            (None, None) => "–".into(),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} |",
            sh.name,
            sh.shape,
            winner,
            cands.join(", ")
        );
    }
    if !t.warnings.is_empty() {
        let _ = writeln!(s, "\nWarnings:\n");
        for w in &t.warnings {
            let _ = writeln!(s, "- {w}");
        }
    }
    s
}
