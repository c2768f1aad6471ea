//! The human table of the report and the `--check` comparison against a baseline.

use super::figures::{KernelFigures, LoopFigures, Report};
use std::fmt::Write;

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map(|x| format!("{x:.digits$}"))
        .unwrap_or_else(|| "-".to_string())
}

/// Markdown tables: resources and occupancy per kernel, then the hot loops.
pub fn markdown(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "**{}** — {}, {}\n", r.label, r.arch, r.compiler);
    s.push_str("Assumptions (latencies assumed, not measured):\n\n");
    for a in r.assumptions.iter().skip(1) {
        let _ = writeln!(s, "- {a}");
    }
    s.push('\n');
    s.push_str("| kernel | VGPRs | SGPRs | LDS B | scratch | spills | waves/SIMD (vgpr, sgpr, lds @ block) | compiler |\n");
    s.push_str("|---|---:|---:|---:|---:|---:|---|---:|\n");
    for k in &r.kernels {
        let o = &k.occupancy;
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | **{}** ({}, {}, {} @ {}) | {} |",
            k.kernel,
            k.vgprs,
            k.sgprs,
            k.lds_bytes,
            k.scratch_bytes,
            k.vgpr_spills + k.sgpr_spills,
            o.waves_per_simd,
            o.by_vgpr,
            o.by_sgpr,
            o.by_lds,
            o.block,
            k.compiler_occupancy
                .map(|c| c.to_string())
                .unwrap_or_else(|| "-".into())
        );
    }
    let with_bytes: Vec<&KernelFigures> =
        r.kernels.iter().filter(|k| !k.bytes.is_empty()).collect();
    if !with_bytes.is_empty() {
        s.push_str(
            "\nGlobal bytes per element (per lane, summed over the hot loops of a group):\n\n",
        );
        s.push_str("| kernel | group | B/elem | op minimum |\n|---|---|---:|---:|\n");
        for k in with_bytes {
            for g in &k.bytes {
                let _ = writeln!(
                    s,
                    "| {} | {} | {:.2} | {} |",
                    k.kernel,
                    g.group,
                    g.bytes_per_elem,
                    opt(g.min_bytes_per_elem, 0)
                );
            }
        }
    }
    s.push_str("\nHot loops, per iteration (instructions per wave, bytes per lane):\n\n");
    s.push_str("| kernel | loop | instr | VALU issue | FMAs | math/VALU % | waits (blocking) | LDS B/FMA | global B/elem | est. % FMA peak (with stalls) | mca cyc/iter |\n");
    s.push_str("|---|---|---:|---:|---:|---:|---|---:|---|---|---:|\n");
    for k in &r.kernels {
        for l in &k.loops {
            let bytes = bytes_cell(k, l);
            let est = match (l.est_pct_fma_peak, l.est_pct_with_stalls) {
                (Some(a), Some(b)) => format!("{a:.1} ({b:.1})"),
                _ => "-".to_string(),
            };
            let _ = writeln!(
                s,
                "| {} | {}{} | {:.0} | {:.0} | {:.0} | {:.1} | {:.0} ({:.0}) | {} | {} | {} | {} |",
                k.kernel,
                l.name,
                if l.inner_loops > 0 {
                    format!(" ({} inner ×{})", l.inner_loops, l.inner_trip)
                } else {
                    String::new()
                },
                l.instructions,
                l.valu_issue,
                l.fmas,
                l.math_per_valu_pct,
                l.waits,
                l.blocking_waits,
                opt(l.lds_bytes_per_fma, 2),
                bytes,
                est,
                opt(l.mca_cycles_per_iter, 1)
            );
        }
    }
    s
}

fn bytes_cell(_k: &KernelFigures, l: &LoopFigures) -> String {
    opt(l.bytes_per_elem, 2)
}

/// Thresholds of `--check` (documented in docs/ISA-REPORT.md).
pub const POINTS: f64 = 2.0;
pub const BYTES_PER_ELEM_SLACK: f64 = 0.5;
pub const LDS_PER_FMA_SLACK: f64 = 0.1;

/// Regressions of `now` against `base`; empty when none.
pub fn check(base: &Report, now: &Report) -> Vec<String> {
    let mut bad = Vec::new();
    for k in &now.kernels {
        if k.scratch_bytes > 0 || k.vgpr_spills + k.sgpr_spills > 0 {
            bad.push(format!(
                "{}: scratch {} B, spills {} VGPR + {} SGPR (must be 0)",
                k.kernel, k.scratch_bytes, k.vgpr_spills, k.sgpr_spills
            ));
        }
    }
    for b in &base.kernels {
        let Some(k) = now.kernels.iter().find(|k| k.kernel == b.kernel) else {
            bad.push(format!("{}: kernel missing from the build", b.kernel));
            continue;
        };
        if k.occupancy.waves_per_simd < b.occupancy.waves_per_simd {
            bad.push(format!(
                "{}: occupancy {} waves/SIMD < baseline {}",
                k.kernel, k.occupancy.waves_per_simd, b.occupancy.waves_per_simd
            ));
        }
        for g in &b.bytes {
            if let Some(n) = k.bytes.iter().find(|x| x.group == g.group) {
                if n.bytes_per_elem > g.bytes_per_elem + BYTES_PER_ELEM_SLACK {
                    bad.push(format!(
                        "{} {}: {:.2} global B/elem > baseline {:.2} + {BYTES_PER_ELEM_SLACK}",
                        k.kernel, g.group, n.bytes_per_elem, g.bytes_per_elem
                    ));
                }
            }
        }
        for bl in &b.loops {
            let Some(l) = k.loops.iter().find(|l| l.name == bl.name) else {
                bad.push(format!(
                    "{}: hot loop `{}` of the baseline not found (marker removed or loop gone)",
                    k.kernel, bl.name
                ));
                continue;
            };
            let tag = format!("{} {}", k.kernel, l.name);
            if l.math_per_valu_pct < bl.math_per_valu_pct - POINTS {
                bad.push(format!(
                    "{tag}: math/VALU {:.1} % < baseline {:.1} − {POINTS}",
                    l.math_per_valu_pct, bl.math_per_valu_pct
                ));
            }
            if let (Some(n), Some(o)) = (l.est_pct_fma_peak, bl.est_pct_fma_peak) {
                if n < o - POINTS {
                    bad.push(format!(
                        "{tag}: estimate {n:.1} % of FMA peak < baseline {o:.1} − {POINTS}"
                    ));
                }
            }
            if l.blocking_waits > bl.blocking_waits {
                bad.push(format!(
                    "{tag}: {} blocking waits per iteration > baseline {}",
                    l.blocking_waits, bl.blocking_waits
                ));
            }
            if let (Some(n), Some(o)) = (l.lds_bytes_per_fma, bl.lds_bytes_per_fma) {
                if n > o + LDS_PER_FMA_SLACK {
                    bad.push(format!(
                        "{tag}: {n:.2} LDS B/FMA > baseline {o:.2} + {LDS_PER_FMA_SLACK}"
                    ));
                }
            }
            if let (Some(n), Some(o)) = (l.bytes_per_elem, bl.bytes_per_elem) {
                if n > o + BYTES_PER_ELEM_SLACK {
                    bad.push(format!(
                        "{tag}: {n:.2} global B/elem > baseline {o:.2} + {BYTES_PER_ELEM_SLACK}"
                    ));
                }
            }
        }
    }
    bad
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::isa::figures::{GroupBytes, KernelFigures, LoopFigures};
    use crate::isa::occupancy::occupancy;

    fn loop_fig(est: f64, waits: f64) -> LoopFigures {
        LoopFigures {
            name: "k".into(),
            auto: false,
            inner_loops: 0,
            inner_trip: 1.0,
            instructions: 10.0,
            valu: 8.0,
            valu_issue: 8.0,
            fmas: 7.0,
            math_per_valu_pct: 87.5,
            salu: 1.0,
            smem: 0.0,
            vmem: 0.0,
            lds_ops: 1.0,
            branches: 1.0,
            waits,
            blocking_waits: waits,
            blocking: vec![],
            lds_read_bytes: 4.0,
            lds_bytes_per_fma: Some(4.0 / 7.0),
            global_bytes: 0.0,
            elems: None,
            bytes_per_elem: None,
            scratch_ops: 0.0,
            issue_slots: 8.0,
            est_pct_fma_peak: Some(est),
            est_pct_with_stalls: Some(est),
            mca_cycles_per_iter: None,
            mca_block_rthroughput: None,
        }
    }

    pub(crate) fn report(vgprs: u32, est: f64, waits: f64, spills: u32) -> Report {
        Report {
            label: "l".into(),
            arch: "gfx906".into(),
            compiler: "c".into(),
            assumptions: vec![],
            kernels: vec![KernelFigures {
                kernel: "k_f32".into(),
                source: "k".into(),
                dtype: "f32".into(),
                vgprs,
                sgprs: 20,
                lds_bytes: 0,
                scratch_bytes: 0,
                vgpr_spills: spills,
                sgpr_spills: 0,
                occupancy: occupancy(vgprs, 20, 0, 256),
                compiler_occupancy: None,
                loops: vec![loop_fig(est, waits)],
                bytes: vec![GroupBytes {
                    group: "k".into(),
                    bytes_per_elem: 12.0,
                    min_bytes_per_elem: Some(12.0),
                }],
            }],
        }
    }

    #[test]
    fn passes_on_equal_and_small_changes_and_fails_on_each_regression() {
        let base = report(64, 80.0, 0.0, 0);
        assert!(check(&base, &base).is_empty());
        assert!(
            check(&base, &report(64, 78.5, 0.0, 0)).is_empty(),
            "within 2 points"
        );
        let bad = check(&base, &report(64, 77.0, 0.0, 0));
        assert!(bad.len() == 1 && bad[0].contains("estimate"), "{bad:?}");
        let bad = check(&base, &report(68, 80.0, 0.0, 0));
        assert!(bad.iter().any(|b| b.contains("occupancy")), "{bad:?}");
        let bad = check(&base, &report(64, 80.0, 1.0, 0));
        assert!(bad.iter().any(|b| b.contains("blocking")), "{bad:?}");
        let bad = check(&base, &report(64, 80.0, 0.0, 2));
        assert!(bad.iter().any(|b| b.contains("spills")), "{bad:?}");
        let mut gone = report(64, 80.0, 0.0, 0);
        gone.kernels[0].loops.clear();
        assert!(check(&base, &gone)[0].contains("not found"));
    }
}
