//! The figures of the report per kernel and hot loop, serialisable as the JSON baseline.

use super::asm::Kernel;
use super::mca;
use super::occupancy::{occupancy, Occupancy};
use super::region::{
    blocking_waits, count, regions, weighted_instrs, RegionError, CYCLES_PER_ISSUE, LATENCY_LDS,
    LATENCY_SMEM, LATENCY_VMEM,
};
use serde::{Deserialize, Serialize};

/// Every figure is labelled with this.
pub const LABEL: &str = "static ISA figures (gfx906, hipcc 5.2), not measurements";

/// LDS bytes per lane-FMA at which LDS bandwidth (128 B/clk/CU: 32 banks × 4 B) equals the FMA
/// rate of a CU (4 SIMDs × 16 lanes = 64 lane-FMAs/clk).
pub const LDS_BYTES_PER_FMA_AT_PEAK: f64 = 2.0;
/// At most this many instructions of different types issue per SIMD per issue cycle, one per
/// wave (GCN: VALU, SALU, VMEM, LDS, branch, ...).
pub const ISSUE_PER_CYCLE: f64 = 5.0;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Report {
    pub label: String,
    pub arch: String,
    pub compiler: String,
    pub assumptions: Vec<String>,
    pub kernels: Vec<KernelFigures>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct KernelFigures {
    pub kernel: String,
    pub source: String,
    pub dtype: String,
    pub vgprs: u32,
    pub sgprs: u32,
    pub lds_bytes: u32,
    pub scratch_bytes: u32,
    pub vgpr_spills: u32,
    pub sgpr_spills: u32,
    pub occupancy: Occupancy,
    pub compiler_occupancy: Option<u32>,
    pub loops: Vec<LoopFigures>,
    /// Global bytes per element summed over the loops of one `group` (e.g. the passes of a row).
    pub bytes: Vec<GroupBytes>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct GroupBytes {
    pub group: String,
    pub bytes_per_elem: f64,
    pub min_bytes_per_elem: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LoopFigures {
    pub name: String,
    /// Chosen automatically (no markers in the kernel): the innermost loop with most FMAs.
    pub auto: bool,
    pub inner_loops: usize,
    pub inner_trip: f64,
    pub instructions: f64,
    pub valu: f64,
    pub valu_issue: f64,
    pub fmas: f64,
    /// FMA-class instructions ÷ VALU instructions, % (issue-weighted).
    pub math_per_valu_pct: f64,
    pub salu: f64,
    pub smem: f64,
    pub vmem: f64,
    pub lds_ops: f64,
    pub branches: f64,
    pub waits: f64,
    pub blocking_waits: f64,
    pub blocking: Vec<String>,
    pub lds_read_bytes: f64,
    pub lds_bytes_per_fma: Option<f64>,
    pub global_bytes: f64,
    pub elems: Option<f64>,
    pub bytes_per_elem: Option<f64>,
    pub scratch_ops: f64,
    /// Issue slots per iteration per wave (see `estimate`).
    pub issue_slots: f64,
    /// Issue-bound % of the FMA peak: FMA-class instructions per VALU issue slot (a dot2 or
    /// packed FMA at full rate is the f16 peak, twice the f32 one). None for `kind=memory`.
    pub est_pct_fma_peak: Option<f64>,
    /// The same with every blocking wait's uncovered latency added (all waves stalled).
    pub est_pct_with_stalls: Option<f64>,
    pub mca_cycles_per_iter: Option<f64>,
    pub mca_block_rthroughput: Option<f64>,
}

/// Storage size of the dtype a kernel name ends with.
pub fn dtype_of(kernel: &str) -> (&'static str, f64) {
    if kernel.ends_with("_bf16") {
        ("bf16", 2.0)
    } else if kernel.ends_with("_f16") {
        ("f16", 2.0)
    } else if kernel.ends_with("_f32") {
        ("f32", 4.0)
    } else {
        ("-", 4.0)
    }
}

/// Options of one analysis run.
pub struct Options<'a> {
    pub arch: &'a str,
    pub mca: Option<&'a str>,
}

/// Figures of every kernel of one source's assembly.
pub fn analyse(
    source: &str,
    kernels: &[Kernel],
    opts: &Options,
) -> Result<Vec<KernelFigures>, RegionError> {
    let mut out = Vec::new();
    for k in kernels {
        let regs = regions(k)?;
        let (dtype, tsize) = dtype_of(&k.name);
        let block = regs
            .iter()
            .find_map(|r| r.key_f64("block"))
            .map(|b| b as u32)
            .unwrap_or(k.res.max_block);
        let occ = occupancy(k.res.vgprs, k.res.sgprs, k.res.lds_bytes, block);
        let waves = f64::from(occ.waves_per_simd.max(1));
        let mut figs = Vec::new();
        let mut groups: Vec<GroupBytes> = Vec::new();
        for r in &regs {
            let instrs = weighted_instrs(k, r);
            let c = count(&instrs, 64.0);
            let waits = blocking_waits(&instrs, waves);
            let stall_slots: f64 = waits
                .iter()
                .map(|w| {
                    ((w.latency - CYCLES_PER_ISSUE * waves * w.distance)
                        / (CYCLES_PER_ISSUE * waves))
                        .max(0.0)
                })
                .sum();
            let issue_slots = [
                c.valu_issue,
                c.salu,
                c.vmem,
                c.lds,
                c.smem,
                c.branch,
                c.instructions / waves.min(ISSUE_PER_CYCLE),
            ]
            .into_iter()
            .fold(0.0, f64::max);
            let lds_per_fma = (c.fmas > 0.0).then(|| c.lds_read_bytes / c.fmas);
            let memory = r.keys.get("kind").is_some_and(|v| v == "memory");
            // LDS bandwidth bound, per FMA-class instruction (a dot2 needs the same bytes per
            // issue as an FMA to run at its own peak).
            let lds_bound = if c.fma_instrs > 0.0 && c.lds_read_bytes > 0.0 {
                (LDS_BYTES_PER_FMA_AT_PEAK / (c.lds_read_bytes / c.fma_instrs)).min(1.0)
            } else {
                1.0
            };
            let est = (!memory && c.fma_instrs > 0.0)
                .then(|| 100.0 * (c.fma_instrs / issue_slots).min(lds_bound));
            let est_stalls = (!memory && c.fma_instrs > 0.0)
                .then(|| 100.0 * (c.fma_instrs / (issue_slots + stall_slots)).min(lds_bound));
            let elems = r.key_f64("elems");
            let bpe = elems.map(|e| c.global_bytes / e);
            if let Some(b) = bpe {
                let g = r
                    .keys
                    .get("group")
                    .cloned()
                    .unwrap_or_else(|| r.name.clone());
                let min = match (r.key_f64("min_t"), r.key_f64("min_f32")) {
                    (None, None) => None,
                    (t, f) => Some(t.unwrap_or(0.0) * tsize + f.unwrap_or(0.0) * 4.0),
                };
                match groups.iter_mut().find(|x| x.group == g) {
                    Some(x) => {
                        x.bytes_per_elem += b;
                        x.min_bytes_per_elem = x.min_bytes_per_elem.or(min);
                    }
                    None => groups.push(GroupBytes {
                        group: g,
                        bytes_per_elem: b,
                        min_bytes_per_elem: min,
                    }),
                }
            }
            let m = match opts.mca {
                Some(tool) => {
                    let plain: Vec<(&str, &str)> = instrs.iter().map(|&(m, o, _)| (m, o)).collect();
                    mca::run(tool, opts.arch, &plain).ok()
                }
                None => None,
            };
            figs.push(LoopFigures {
                name: r.name.clone(),
                auto: r.auto,
                inner_loops: r.inner,
                inner_trip: r.key_f64("inner_trip").unwrap_or(1.0),
                instructions: c.instructions,
                valu: c.valu,
                valu_issue: c.valu_issue,
                fmas: c.fmas,
                math_per_valu_pct: if c.valu_issue > 0.0 {
                    100.0 * c.fma_instrs / c.valu_issue
                } else {
                    0.0
                },
                salu: c.salu,
                smem: c.smem,
                vmem: c.vmem,
                lds_ops: c.lds,
                branches: c.branch,
                waits: c.waits,
                blocking_waits: waits.len() as f64,
                blocking: dedup(
                    waits
                        .iter()
                        .map(|w| format!("{} (d = {})", w.text, w.distance)),
                ),
                lds_read_bytes: c.lds_read_bytes,
                lds_bytes_per_fma: lds_per_fma,
                global_bytes: c.global_bytes,
                elems,
                bytes_per_elem: bpe,
                scratch_ops: c.scratch_ops,
                issue_slots,
                est_pct_fma_peak: est,
                est_pct_with_stalls: est_stalls,
                mca_cycles_per_iter: m.map(|m| m.cycles_per_iter),
                mca_block_rthroughput: m.map(|m| m.block_rthroughput),
            });
        }
        out.push(KernelFigures {
            kernel: k.name.clone(),
            source: source.to_string(),
            dtype: dtype.to_string(),
            vgprs: k.res.vgprs,
            sgprs: k.res.sgprs,
            lds_bytes: k.res.lds_bytes,
            scratch_bytes: k.res.scratch_bytes,
            vgpr_spills: k.res.vgpr_spills,
            sgpr_spills: k.res.sgpr_spills,
            occupancy: occ,
            compiler_occupancy: k.res.compiler_occupancy,
            loops: figs,
            bytes: groups,
        });
    }
    Ok(out)
}

/// Distinct strings in first-seen order, repeated ones suffixed with `×n`.
fn dedup(items: impl Iterator<Item = String>) -> Vec<String> {
    let mut seen: Vec<(String, usize)> = Vec::new();
    for it in items {
        match seen.iter_mut().find(|(s, _)| *s == it) {
            Some((_, n)) => *n += 1,
            None => seen.push((it, 1)),
        }
    }
    seen.into_iter()
        .map(|(s, n)| if n > 1 { format!("{s} ×{n}") } else { s })
        .collect()
}

/// The assumptions every report states.
pub fn assumptions() -> Vec<String> {
    vec![
        LABEL.to_string(),
        "counts are static, per iteration of the hot loop (per wave for instructions, per lane for bytes); inner loops count inner_trip times".to_string(),
        "math/VALU = FMA-class VALU instructions (fma/fmac/mac/mad/mix/pk_fma/dot2) ÷ VALU issue; FMAs per lane count packed f16 and dot2 as 2 (quarter-rate: transcendentals, 32-bit int mul; half-rate: f64)".to_string(),
        format!("blocking wait: s_waitcnt whose newest awaited memory op is d instructions back with 4·W·d < L (W = waves/SIMD allowed; L assumed: LDS {LATENCY_LDS}, SMEM {LATENCY_SMEM}, VMEM {LATENCY_VMEM} cycles)"),
        format!("issue-bound estimate: FMA-class instructions ÷ max(VALU issue, SALU, VMEM, LDS, SMEM, branch, all/min(W, {ISSUE_PER_CYCLE})), capped by LDS bandwidth (at most {LDS_BYTES_PER_FMA_AT_PEAK} B read per lane per FMA-class instruction at peak: 128 B/clk/CU); latencies assumed, not measured; caches, bank conflicts, clocks not modelled"),
        "llvm-mca-15 -mcpu=gfx906: single-wave, register-dependency cycles per iteration in LLVM 15's model (s_waitcnt and other waves not modelled)".to_string(),
        "occupancy: waves/SIMD from VGPRs (256, granule 4), SGPRs (800, granule 16), LDS (64 KiB/CU, granule 512 B) at the launch bound's block size, max 10".to_string(),
    ]
}
