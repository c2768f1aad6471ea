//! The hot loops of a kernel and their per-iteration figures.
//!
//! A hot loop is the outermost loop inside a marked region (`HIPK_HOT_LOOP_BEGIN/END` in the
//! source; see `docs/ISA-REPORT.md`). Kernels without markers get one automatic region: the
//! innermost loop with the most FMA instructions, if any loop has one. Counts are per lane
//! (bytes) or per wave (instructions) for one iteration of that loop; instructions of loops
//! nested inside it count `inner_trip` times (a marker key, default 1).

use super::asm::{Item, Kernel};
use super::classify::{classify, waitcnt_operands, Unit};
use std::collections::BTreeMap;

/// Assumed latencies (cycles) used to decide whether a wait blocks; not measured.
pub const LATENCY_LDS: f64 = 64.0;
pub const LATENCY_VMEM: f64 = 500.0;
pub const LATENCY_SMEM: f64 = 200.0;
/// Cycles a SIMD takes to issue one full-rate wave64 VALU instruction.
pub const CYCLES_PER_ISSUE: f64 = 4.0;

/// A marked (or automatic) region and the loop it designates.
#[derive(Debug, Clone)]
pub struct Region {
    pub name: String,
    pub auto: bool,
    pub keys: BTreeMap<String, String>,
    /// Header id of the hot loop (`BB3_7`).
    pub hot: String,
    /// Its instructions' item indices in layout order starting at the header (blocks laid out
    /// before the header follow at the end), with their nesting depth below the hot loop.
    pub members: Vec<(usize, u32)>,
    /// Loops nested inside the hot loop.
    pub inner: usize,
}

impl Region {
    pub fn key_f64(&self, k: &str) -> Option<f64> {
        self.keys.get(k).and_then(|v| v.parse().ok())
    }
}

/// Why a kernel's markers cannot be used.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum RegionError {
    #[error("{kernel}: no loop follows marker `{name}` at its nesting level (put HIPK_HOT_LOOP_BEGIN right before the loop statement)")]
    NoLoop { kernel: String, name: String },
}

/// `name key=value key=value` -> (name, keys).
fn marker_fields(text: &str) -> (String, BTreeMap<String, String>) {
    let mut words = text.split_whitespace();
    let name = words.next().unwrap_or("hot").to_string();
    let keys = words
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    (name, keys)
}

/// Instructions of loop `id` (and of loops inside it), rotated to start at its header.
pub fn members(k: &Kernel, id: &str) -> Vec<(usize, u32)> {
    let Some(info) = k.loop_info(id) else {
        return Vec::new();
    };
    let mut before = Vec::new();
    let mut after = Vec::new();
    let mut chain: Vec<&str> = Vec::new();
    for (i, it) in k.items.iter().enumerate() {
        if matches!(it, Item::Block { .. }) {
            chain = k.chain_at(i);
        }
        if !matches!(it, Item::Instr { .. }) {
            continue;
        }
        if let Some(pos) = chain.iter().position(|c| *c == id) {
            let depth = pos as u32;
            if i >= info.head {
                after.push((i, depth));
            } else {
                before.push((i, depth));
            }
        }
    }
    after.extend(before);
    after
}

/// The regions of a kernel, in layout order; duplicate names get `#2`, `#3`, ...
///
/// The hot loop of a region is the loop that begins after the begin marker at the marker's
/// nesting level: among the loops whose parent is the loop holding the marker (or top-level
/// loops), the first whose header follows the marker in layout, else the last before it.
pub fn regions(k: &Kernel) -> Result<Vec<Region>, RegionError> {
    let mut out: Vec<Region> = Vec::new();
    for (i, item) in k.items.iter().enumerate() {
        let Item::Marker { begin: true, text } = item else {
            continue;
        };
        let (name, keys) = marker_fields(text);
        let parent = k.chain_at(i).first().map(|s| s.to_string());
        let siblings: Vec<_> = k.loops.iter().filter(|l| l.parent == parent).collect();
        let hot = siblings
            .iter()
            .filter(|l| l.head > i)
            .min_by_key(|l| l.head)
            .or_else(|| {
                siblings
                    .iter()
                    .filter(|l| l.head < i)
                    .max_by_key(|l| l.head)
            })
            .map(|l| l.id.clone())
            .ok_or_else(|| RegionError::NoLoop {
                kernel: k.name.clone(),
                name: name.clone(),
            })?;
        let inner = k
            .loops
            .iter()
            .filter(|l| l.id != hot && k.chain_at(l.head).contains(&hot.as_str()))
            .count();
        let seen = out
            .iter()
            .filter(|r| r.name == name || r.name.starts_with(&format!("{name}#")))
            .count();
        let name = if seen == 0 {
            name
        } else {
            format!("{name}#{}", seen + 1)
        };
        out.push(Region {
            name,
            auto: false,
            keys,
            members: members(k, &hot),
            hot,
            inner,
        });
    }
    if out.is_empty() {
        if let Some(r) = auto_region(k) {
            out.push(r);
        }
    }
    Ok(out)
}

/// Innermost loop with the most FMAs (ties: the first in layout).
fn auto_region(k: &Kernel) -> Option<Region> {
    let mut best: Option<(f64, String)> = None;
    for l in &k.loops {
        if k.loops
            .iter()
            .any(|o| o.parent.as_deref() == Some(l.id.as_str()))
        {
            continue;
        }
        let fmas: f64 = members(k, &l.id)
            .iter()
            .map(|&(i, _)| match &k.items[i] {
                Item::Instr { mnemonic, .. } => classify(mnemonic).fmas,
                _ => 0.0,
            })
            .sum();
        if fmas > 0.0 && best.as_ref().is_none_or(|(b, _)| fmas > *b) {
            best = Some((fmas, l.id.clone()));
        }
    }
    best.map(|(_, hot)| Region {
        name: "auto".to_string(),
        auto: true,
        keys: BTreeMap::new(),
        members: members(k, &hot),
        hot,
        inner: 0,
    })
}

/// Per-iteration figures of one region's hot loop.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counts {
    pub instructions: f64,
    pub valu: f64,
    /// VALU issue in full-rate units (quarter-rate ops count 4).
    pub valu_issue: f64,
    pub fmas: f64,
    /// FMA-class instructions (a packed or dot2 instruction counts 1).
    pub fma_instrs: f64,
    pub salu: f64,
    pub smem: f64,
    pub vmem: f64,
    pub lds: f64,
    pub branch: f64,
    pub internal: f64,
    pub waits: f64,
    pub lds_read_bytes: f64,
    pub lds_write_bytes: f64,
    /// Global bytes per lane (VMEM) plus scalar bytes per wave / 64.
    pub global_bytes: f64,
    pub scratch_ops: f64,
}

/// The instructions of the hot loop with their weight (inner loops: `inner_trip` per level).
pub fn weighted_instrs<'a>(k: &'a Kernel, r: &Region) -> Vec<(&'a str, &'a str, f64)> {
    let trip = r.key_f64("inner_trip").unwrap_or(1.0);
    r.members
        .iter()
        .filter_map(|&(i, depth)| match &k.items[i] {
            Item::Instr { mnemonic, operands } => Some((
                mnemonic.as_str(),
                operands.as_str(),
                trip.powi(depth as i32),
            )),
            _ => None,
        })
        .collect()
}

pub fn count(instrs: &[(&str, &str, f64)], wave: f64) -> Counts {
    let mut c = Counts::default();
    for &(m, _, w) in instrs {
        let cl = classify(m);
        c.instructions += w;
        match cl.unit {
            Unit::Valu => {
                c.valu += w;
                c.valu_issue += w * cl.valu_weight;
            }
            Unit::Salu => c.salu += w,
            Unit::Smem => c.smem += w,
            Unit::Vmem => c.vmem += w,
            Unit::Lds => c.lds += w,
            Unit::Branch => c.branch += w,
            Unit::Internal => c.internal += w,
        }
        if m.starts_with("s_waitcnt") {
            c.waits += w;
        }
        c.fmas += w * cl.fmas;
        if cl.fmas > 0.0 {
            c.fma_instrs += w;
        }
        c.lds_read_bytes += w * f64::from(cl.lds_read);
        c.lds_write_bytes += w * f64::from(cl.lds_write);
        c.global_bytes += w * (f64::from(cl.global) + f64::from(cl.smem) / wave);
        if cl.scratch {
            c.scratch_ops += w;
        }
    }
    c
}

/// One blocking wait: where, on what, and how much work covered it.
#[derive(Debug, Clone, PartialEq)]
pub struct Wait {
    pub text: String,
    /// Instructions this wave issued between the newest awaited memory instruction and the wait.
    pub distance: f64,
    pub counter: &'static str,
    /// The latency assumed for it (cycles).
    pub latency: f64,
}

/// The waits of the hot loop that block in steady state (second pass over the body, so loads
/// issued in the previous iteration count).
///
/// A `s_waitcnt` blocks when it waits for a memory instruction (vmcnt: in-order VMEM; lgkmcnt:
/// LDS/SMEM, treated as in order) and the instructions the wave issued since that memory
/// instruction, `d`, times the waves sharing the SIMD, `W`, times 4 cycles per issue cannot
/// cover the assumed latency L: `4 · W · d < L` (L = 64 LDS, 200 SMEM, 500 VMEM cycles).
pub fn blocking_waits(instrs: &[(&str, &str, f64)], waves: f64) -> Vec<Wait> {
    struct Out {
        pos: f64,
        smem: bool,
    }
    let mut vm: Vec<f64> = Vec::new();
    let mut lgkm: Vec<Out> = Vec::new();
    let mut pos = 0.0;
    let mut found = Vec::new();
    for pass in 0..2 {
        for &(m, ops, w) in instrs {
            if m.starts_with("s_waitcnt") {
                let (vmc, lgc) = waitcnt_operands(ops);
                let mut worst: Option<Wait> = None;
                if let Some(n) = vmc {
                    let n = n as usize;
                    if vm.len() > n {
                        let newest = vm[vm.len() - n - 1];
                        let d = pos - newest - 1.0;
                        vm.drain(..vm.len() - n);
                        if CYCLES_PER_ISSUE * waves * d < LATENCY_VMEM {
                            worst = Some(Wait {
                                text: format!("{m} {ops}"),
                                distance: d,
                                counter: "vmcnt",
                                latency: LATENCY_VMEM,
                            });
                        }
                    }
                }
                if let Some(n) = lgc {
                    let n = n as usize;
                    if lgkm.len() > n {
                        let awaited = &lgkm[..lgkm.len() - n];
                        let newest = awaited.last().map(|o| o.pos).unwrap_or(0.0);
                        let lat = if awaited.iter().any(|o| o.smem) {
                            LATENCY_SMEM
                        } else {
                            LATENCY_LDS
                        };
                        let d = pos - newest - 1.0;
                        lgkm.drain(..lgkm.len() - n);
                        if CYCLES_PER_ISSUE * waves * d < lat && worst.is_none() {
                            worst = Some(Wait {
                                text: format!("{m} {ops}"),
                                distance: d,
                                counter: "lgkmcnt",
                                latency: lat,
                            });
                        }
                    }
                }
                if pass == 1 {
                    if let Some(wt) = worst {
                        for _ in 0..(w.round() as usize).max(1) {
                            found.push(wt.clone());
                        }
                    }
                }
                continue;
            }
            let cl = classify(m);
            // Only a single iteration's worth of an inner loop is simulated; its weight scales
            // the issue distance.
            if cl.vm {
                vm.push(pos);
            }
            if cl.lgkm {
                lgkm.push(Out {
                    pos,
                    smem: cl.unit == Unit::Smem,
                });
            }
            pos += w;
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(v: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str, f64)> {
        v.iter().map(|&(m, o)| (m, o, 1.0)).collect()
    }

    #[test]
    fn a_read_waited_on_at_once_blocks_and_a_covered_one_does_not() {
        let body = seq(&[
            ("ds_read_b128", "v[0:3], v4"),
            ("s_waitcnt", "lgkmcnt(0)"),
            ("v_fmac_f32_e32", "v5, v0, v1"),
        ]);
        let w = blocking_waits(&body, 4.0);
        assert_eq!(w.len(), 1);
        assert_eq!((w[0].distance, w[0].counter), (0.0, "lgkmcnt"));
        // 4 instructions between at 4 waves: 4·4·4 = 64 cycles >= 64: covered.
        let mut body = seq(&[("ds_read_b128", "v[0:3], v4")]);
        body.extend(seq(&[("v_fmac_f32_e32", "v5, v6, v7"); 4]));
        body.extend(seq(&[("s_waitcnt", "lgkmcnt(0)")]));
        assert!(blocking_waits(&body, 4.0).is_empty());
        assert_eq!(blocking_waits(&body, 3.0).len(), 1);
    }

    #[test]
    fn loads_of_the_previous_iteration_count_across_the_back_edge() {
        // Prefetch at the end of the body, waited on at the top of the next iteration.
        let mut body = seq(&[("s_waitcnt", "vmcnt(0)")]);
        body.extend(seq(&[("v_fmac_f32_e32", "v5, v6, v7"); 40]));
        body.extend(seq(&[("global_load_dwordx4", "v[0:3], v[8:9], off")]));
        // d = 0 after the load (wait is at the top, right after the back edge).
        assert_eq!(blocking_waits(&body, 4.0).len(), 1);
        let mut body = seq(&[("global_load_dwordx4", "v[0:3], v[8:9], off")]);
        body.extend(seq(&[("v_fmac_f32_e32", "v5, v6, v7"); 40]));
        body.extend(seq(&[("s_waitcnt", "vmcnt(0)")]));
        assert!(blocking_waits(&body, 4.0).is_empty(), "4·4·40 = 640 >= 500");
    }

    #[test]
    fn vmcnt_n_waits_only_for_the_older_loads() {
        let body = seq(&[
            ("global_load_dword", "v0, v[8:9], off"),
            ("v_add_f32_e32", "v1, v1, v1"),
            ("global_load_dword", "v2, v[8:9], off"),
            ("s_waitcnt", "vmcnt(1)"),
        ]);
        let w = blocking_waits(&body, 1.0);
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].distance, 2.0, "the older load, two instructions back");
        let c = count(&body, 64.0);
        assert_eq!((c.instructions, c.vmem, c.global_bytes), (4.0, 2.0, 8.0));
    }
}
