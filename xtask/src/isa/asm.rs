//! Parsing of the device assembly (`.s`) hipcc/clang emits for one kernel source: the kernels,
//! their instructions and labels, the loops (from backward branches), the hot-loop markers
//! (`;hipk-hot-begin` / `;hipk-hot-end`, see `kernels/common.h`) and the resource figures the
//! compiler prints (`; NumVgprs:` comments and the `amdhsa.kernels` metadata).

use std::collections::HashMap;

/// Text of the begin and end markers as they appear in the assembly (inline asm comments).
pub const MARK_BEGIN: &str = ";hipk-hot-begin";
pub const MARK_END: &str = ";hipk-hot-end";

/// One line of a kernel body that matters to the analysis.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    /// Start of a basic block: its label (`.LBB3_7`, none for fall-through `%bb.N`) and the
    /// header id (`BB3_7`) of the innermost loop holding it, from LLVM's loop comments.
    Block {
        label: Option<String>,
        lp: Option<String>,
    },
    /// An instruction: mnemonic and the operand text.
    Instr { mnemonic: String, operands: String },
    /// A hot-loop marker: begin or end, and the text after the marker word.
    Marker { begin: bool, text: String },
}

/// Resource figures of one kernel, as the compiler reports them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Resources {
    pub vgprs: u32,
    pub sgprs: u32,
    pub scratch_bytes: u32,
    pub lds_bytes: u32,
    /// The compiler's own occupancy figure (waves per SIMD), for cross-checking ours.
    pub compiler_occupancy: Option<u32>,
    pub max_block: u32,
    pub vgpr_spills: u32,
    pub sgpr_spills: u32,
}

/// One kernel of a source file.
#[derive(Debug, Clone)]
pub struct Kernel {
    pub name: String,
    pub items: Vec<Item>,
    pub res: Resources,
    /// Loops by header id (`BB3_7`), from LLVM's `Loop Header` / `Parent Loop` comments.
    pub loops: Vec<LoopInfo>,
}

/// One loop: its header id, the item index of the header block, its parent and depth.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoopInfo {
    pub id: String,
    pub head: usize,
    pub parent: Option<String>,
    pub depth: u32,
}

impl Kernel {
    pub fn loop_info(&self, id: &str) -> Option<&LoopInfo> {
        self.loops.iter().find(|l| l.id == id)
    }

    /// The chain of loops holding item `i`, innermost first.
    pub fn chain_at(&self, i: usize) -> Vec<&str> {
        let lp = self.items[..=i.min(self.items.len().saturating_sub(1))]
            .iter()
            .rev()
            .find_map(|it| match it {
                Item::Block { lp, .. } => Some(lp.clone()),
                _ => None,
            })
            .flatten();
        let mut chain = Vec::new();
        let mut cur = lp.and_then(|id| self.loop_info(&id));
        while let Some(l) = cur {
            chain.push(l.id.as_str());
            cur = l.parent.as_deref().and_then(|p| self.loop_info(p));
        }
        chain
    }
}

/// Parse a whole `.s` file into its kernels (functions that have a `.amdhsa_kernel` block).
pub fn parse(text: &str) -> Vec<Kernel> {
    let meta = parse_metadata(text);
    let mut kernels = Vec::new();
    let mut current: Option<Kernel> = None;
    let mut in_asm_block = false;
    let mut pending_info: Option<String> = None;
    let mut pending_parent: Option<String> = None;
    for raw in text.lines() {
        let line = raw.trim();
        if let Some(k) = current.as_mut() {
            if line.starts_with(".Lfunc_end") {
                pending_info = Some(k.name.clone());
                kernels.push(current.take().expect("current kernel"));
                continue;
            }
            if line == ";;#ASMSTART" {
                in_asm_block = true;
                continue;
            }
            if line == ";;#ASMEND" {
                in_asm_block = false;
                continue;
            }
            if let Some(rest) = line.strip_prefix(MARK_BEGIN) {
                k.items.push(Item::Marker {
                    begin: true,
                    text: rest.trim().to_string(),
                });
                continue;
            }
            if let Some(rest) = line.strip_prefix(MARK_END) {
                k.items.push(Item::Marker {
                    begin: false,
                    text: rest.trim().to_string(),
                });
                continue;
            }
            if in_asm_block || line.is_empty() {
                continue;
            }
            if line.starts_with(';') {
                if let Some(rest) = line.strip_prefix("; %bb.") {
                    let comment = rest.split_once(';').map(|x| x.1).unwrap_or("");
                    k.items.push(Item::Block {
                        label: None,
                        lp: in_loop(comment),
                    });
                } else if line.contains("Loop Header: Depth=") {
                    header_comment(k, &mut pending_parent, line);
                } else if let Some(p) = line.split("Parent Loop ").nth(1) {
                    pending_parent = parent_id(p);
                }
                continue;
            }
            if let Some(label) = label_before_comment(line) {
                if let Some(id) = label.strip_prefix(".L") {
                    let comment = line.split_once(';').map(|x| x.1).unwrap_or("");
                    k.items.push(Item::Block {
                        label: Some(label.to_string()),
                        lp: in_loop(comment),
                    });
                    if comment.contains("Loop Header: Depth=") {
                        header_comment(k, &mut pending_parent, comment);
                    } else if let Some(p) = comment.split("Parent Loop ").nth(1) {
                        pending_parent = parent_id(p);
                    }
                    let _ = id;
                    if !comment.contains("Parent Loop") {
                        pending_parent = None;
                    }
                }
                continue;
            }
            if line.starts_with('.') {
                continue; // directives (.p2align, .section, the .amdhsa_kernel block)
            }
            let code = line.split(';').next().unwrap_or("").trim();
            let (mnemonic, operands) = match code.split_once(char::is_whitespace) {
                Some((m, o)) => (m, o.trim()),
                None => (code, ""),
            };
            if !mnemonic.is_empty() {
                k.items.push(Item::Instr {
                    mnemonic: mnemonic.to_string(),
                    operands: operands.to_string(),
                });
            }
            continue;
        }
        if let Some(name) = function_start(line) {
            if let Some(m) = meta.get(name) {
                current = Some(Kernel {
                    name: name.to_string(),
                    items: Vec::new(),
                    res: m.clone(),
                    loops: Vec::new(),
                });
                pending_parent = None;
                in_asm_block = false;
            }
            continue;
        }
        if let Some(name) = &pending_info {
            if let Some(k) = kernels.iter_mut().rev().find(|k| &k.name == name) {
                kernel_info_comment(line, &mut k.res);
            }
            if line.starts_with(".text") || line.starts_with(".protected") {
                pending_info = None;
            }
        }
    }
    kernels
}

/// `name:` at the start of a function (`layernorm_fwd_f32:  ; @layernorm_fwd_f32`).
fn function_start(line: &str) -> Option<&str> {
    let head = line.split(';').next()?.trim();
    let name = head.strip_suffix(':')?;
    if name.is_empty() || name.starts_with('.') || name.contains(char::is_whitespace) {
        return None;
    }
    Some(name)
}

/// `in Loop: Header=BB0_22 Depth=1` -> `BB0_22`.
fn in_loop(comment: &str) -> Option<String> {
    let rest = comment.split("in Loop: Header=").nth(1)?;
    Some(rest.split_whitespace().next()?.to_string())
}

/// `BB0_22 Depth=1` -> `BB0_22`.
fn parent_id(rest: &str) -> Option<String> {
    Some(rest.split_whitespace().next()?.to_string())
}

/// `=>This Loop Header: Depth=N`: the last block is a loop header (its parent, if any, was
/// named by the `Parent Loop` comment before).
fn header_comment(k: &mut Kernel, pending_parent: &mut Option<String>, comment: &str) {
    let depth = comment
        .split("Depth=")
        .nth(1)
        .and_then(|d| d.split_whitespace().next())
        .and_then(|d| d.parse::<u32>().ok())
        .unwrap_or(1);
    let Some(head) = k
        .items
        .iter()
        .rposition(|it| matches!(it, Item::Block { .. }))
    else {
        return;
    };
    let Item::Block {
        label: Some(label),
        lp,
    } = &mut k.items[head]
    else {
        return;
    };
    let id = label.trim_start_matches(".L").to_string();
    *lp = Some(id.clone());
    let parent = if depth > 1 {
        pending_parent.take()
    } else {
        None
    };
    k.loops.push(LoopInfo {
        id,
        head,
        parent,
        depth,
    });
}

/// `.LBB0_7:   ; =>This Loop Header: Depth=1` -> `.LBB0_7`.
fn label_before_comment(line: &str) -> Option<&str> {
    let head = line.split(';').next()?.trim();
    head.strip_suffix(':')
}

/// The `; Kernel info:` comments after a function.
fn kernel_info_comment(line: &str, res: &mut Resources) {
    let Some(rest) = line.strip_prefix("; ") else {
        return;
    };
    let Some((key, value)) = rest.split_once(':') else {
        return;
    };
    let num = || {
        value
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u32>().ok())
    };
    match key.trim() {
        "NumSgprs" => res.sgprs = num().unwrap_or(res.sgprs),
        "NumVgprs" => res.vgprs = num().unwrap_or(res.vgprs),
        "ScratchSize" => res.scratch_bytes = num().unwrap_or(res.scratch_bytes),
        "LDSByteSize" => res.lds_bytes = num().unwrap_or(res.lds_bytes),
        "Occupancy" => res.compiler_occupancy = num(),
        _ => {}
    }
}

/// Per-kernel fields of the `amdhsa.kernels` YAML block: work-group bound, spills, LDS,
/// scratch (the comment lines refine VGPR/SGPR counts later).
fn parse_metadata(text: &str) -> HashMap<String, Resources> {
    let mut out = HashMap::new();
    let Some(start) = text.find(".amdgpu_metadata") else {
        return out;
    };
    let mut fields: HashMap<String, String> = HashMap::new();
    let mut flush = |fields: &mut HashMap<String, String>| {
        if let Some(name) = fields.get(".name") {
            let n = |k: &str| {
                fields
                    .get(k)
                    .and_then(|v| v.parse::<u32>().ok())
                    .unwrap_or(0)
            };
            out.insert(
                name.clone(),
                Resources {
                    vgprs: n(".vgpr_count"),
                    sgprs: n(".sgpr_count"),
                    scratch_bytes: n(".private_segment_fixed_size"),
                    lds_bytes: n(".group_segment_fixed_size"),
                    compiler_occupancy: None,
                    max_block: n(".max_flat_workgroup_size"),
                    vgpr_spills: n(".vgpr_spill_count"),
                    sgpr_spills: n(".sgpr_spill_count"),
                },
            );
        }
        fields.clear();
    };
    for line in text[start..].lines() {
        if line.starts_with("  - ") {
            flush(&mut fields);
        }
        // Kernel-level keys are indented by 4 spaces; argument keys are deeper.
        if let Some(rest) = line.strip_prefix("    .") {
            if let Some((k, v)) = rest.split_once(':') {
                fields.insert(format!(".{}", k.trim()), v.trim().to_string());
            }
        }
        if line.starts_with(".end_amdgpu_metadata") || line.contains("end_amdgpu_metadata") {
            break;
        }
    }
    flush(&mut fields);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
\t.globl\tk_f32
k_f32:                          ; @k_f32
; %bb.0:
\ts_load_dwordx2 s[0:1], s[4:5], 0x0
\t;;#ASMSTART
\t;hipk-hot-begin main elems=4
\t;;#ASMEND
.LBB0_1:                        ; =>This Inner Loop Header: Depth=1
	v_add_u32_e32 v9, 1, v9
.LBB0_3:                        ;   Parent Loop BB0_1 Depth=1
                                ; =>  This Inner Loop Header: Depth=2
	v_add_u32_e32 v9, 1, v9
	s_cbranch_scc1 .LBB0_3
; %bb.4:                        ;   in Loop: Header=BB0_1 Depth=1
\tglobal_load_dwordx4 v[0:3], v[4:5], off
\ts_waitcnt vmcnt(0)
\tv_fmac_f32_e32 v6, v0, v1
\ts_cbranch_scc1 .LBB0_1
; %bb.2:
\t;;#ASMSTART
\t;hipk-hot-end main
\t;;#ASMEND
\ts_endpgm
\t.amdhsa_kernel k_f32
\t.end_amdhsa_kernel
.Lfunc_end0:
; Kernel info:
; NumSgprs: 18
; NumVgprs: 7
; ScratchSize: 0
; LDSByteSize: 512 bytes/workgroup (compile time only)
; Occupancy: 10
\t.text
\t.amdgpu_metadata
---
amdhsa.kernels:
  - .args:
      - .offset:         0
        .size:           8
    .group_segment_fixed_size: 512
    .max_flat_workgroup_size: 256
    .name:           k_f32
    .private_segment_fixed_size: 0
    .sgpr_count:     18
    .sgpr_spill_count: 0
    .vgpr_count:     7
    .vgpr_spill_count: 0
\t.end_amdgpu_metadata
";

    #[test]
    fn parses_kernels_markers_loops_and_resources() {
        let ks = parse(SAMPLE);
        assert_eq!(ks.len(), 1);
        let k = &ks[0];
        assert_eq!(k.name, "k_f32");
        assert_eq!(
            (k.res.vgprs, k.res.sgprs, k.res.lds_bytes, k.res.max_block),
            (7, 18, 512, 256)
        );
        assert_eq!(k.res.compiler_occupancy, Some(10));
        assert!(
            matches!(&k.items[2], Item::Marker { begin: true, text } if text == "main elems=4")
        );
        assert_eq!(k.loops.len(), 2);
        assert_eq!((k.loops[0].id.as_str(), k.loops[0].depth), ("BB0_1", 1));
        assert_eq!(k.loops[1].parent.as_deref(), Some("BB0_1"));
        let fma = k
            .items
            .iter()
            .position(
                |it| matches!(it, Item::Instr { mnemonic, .. } if mnemonic == "v_fmac_f32_e32"),
            )
            .unwrap();
        assert_eq!(k.chain_at(fma), vec!["BB0_1"]);
        let inner = k.loops[1].head + 1;
        assert_eq!(k.chain_at(inner), vec!["BB0_3", "BB0_1"]);
    }
}
