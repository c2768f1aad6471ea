//! What one gfx9 instruction is, for the counts of the report: its unit, its VALU issue weight,
//! the FMAs it does per lane, the bytes it moves, and the wait counters it increments.
//!
//! Rates (GCN5 / Vega ISA reference, "Instruction rates"; gfx906 is Vega 20): a full-rate VALU
//! instruction occupies the SIMD for 4 cycles (64 lanes on a 16-lane SIMD); transcendentals
//! (exp, log, rcp, rsq, sqrt, sin, cos) and 32-bit integer multiplies are quarter rate;
//! f64 FMA/MUL/ADD are half rate on gfx906.

/// The unit an instruction issues to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Valu,
    Salu,
    Smem,
    Vmem,
    Lds,
    Branch,
    /// s_waitcnt, s_nop, s_barrier and other sequencer-internal instructions.
    Internal,
}

/// Everything the report needs about one instruction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Class {
    pub unit: Unit,
    /// VALU issue cycles in units of a full-rate instruction (1, 2 or 4); 0 off the VALU.
    pub valu_weight: f64,
    /// FMAs per lane counted against the f32 FMA peak (packed/dot2: 2).
    pub fmas: f64,
    /// Bytes per lane read from LDS (ds_read*); cross-lane ds_bpermute/swizzle move none.
    pub lds_read: u32,
    pub lds_write: u32,
    /// Bytes per lane of global memory (VMEM) loaded or stored.
    pub global: u32,
    /// Bytes per wave loaded by a scalar memory instruction.
    pub smem: u32,
    /// Increments vmcnt (gfx9: VMEM loads and stores) / lgkmcnt (LDS, SMEM, FLAT, messages).
    pub vm: bool,
    pub lgkm: bool,
    /// Scratch (private memory) access: a spill or a private array.
    pub scratch: bool,
}

/// Strip encoding suffixes: `v_fmac_f32_e32` -> `v_fmac_f32`.
pub fn base_mnemonic(m: &str) -> &str {
    for suffix in ["_e32", "_e64", "_sdwa", "_dpp"] {
        if let Some(b) = m.strip_suffix(suffix) {
            return b;
        }
    }
    m
}

/// Width in bytes of a load/store mnemonic's data (`..._dwordx4` -> 16, `ds_read2_b64` -> 16).
fn data_bytes(m: &str) -> u32 {
    let pairs = if m.contains("read2") || m.contains("write2") || m.contains("load2") {
        2
    } else {
        1
    };
    let w = if m.ends_with("dwordx4") || m.ends_with("_b128") {
        16
    } else if m.ends_with("dwordx3") || m.ends_with("_b96") {
        12
    } else if m.ends_with("dwordx2") || m.ends_with("_b64") {
        8
    } else if m.ends_with("dword") || m.ends_with("_b32") || m.ends_with("_u32") {
        4
    } else if m.contains("short") || m.contains("_u16") || m.contains("_i16") || m.ends_with("_b16")
    {
        2
    } else if m.contains("byte") || m.contains("_u8") || m.contains("_i8") || m.ends_with("_b8") {
        1
    } else {
        4
    };
    w * pairs
}

const QUARTER_RATE: &[&str] = &[
    "v_exp_f32",
    "v_log_f32",
    "v_rcp_f32",
    "v_rcp_iflag_f32",
    "v_rsq_f32",
    "v_sqrt_f32",
    "v_sin_f32",
    "v_cos_f32",
    "v_exp_f16",
    "v_log_f16",
    "v_rcp_f16",
    "v_rsq_f16",
    "v_sqrt_f16",
    "v_sin_f16",
    "v_cos_f16",
    "v_rcp_f64",
    "v_rsq_f64",
    "v_sqrt_f64",
    "v_mul_lo_u32",
    "v_mul_hi_u32",
    "v_mul_lo_i32",
    "v_mul_hi_i32",
    "v_mad_u64_u32",
    "v_mad_i64_i32",
];

/// FMAs per lane of a VALU mnemonic (base form).
fn fmas_of(b: &str) -> f64 {
    match b {
        "v_fma_f32" | "v_fmac_f32" | "v_mac_f32" | "v_mad_f32" | "v_mad_legacy_f32"
        | "v_fma_legacy_f32" | "v_fma_mix_f32" | "v_mad_mix_f32" | "v_fma_f16" | "v_fmac_f16"
        | "v_mac_f16" | "v_mad_f16" | "v_fma_mixlo_f16" | "v_fma_mixhi_f16" => 1.0,
        "v_pk_fma_f16" | "v_pk_mad_f16" | "v_dot2_f32_f16" | "v_dot2c_f32_f16" => 2.0,
        _ => 0.0,
    }
}

/// Classify one instruction.
pub fn classify(mnemonic: &str) -> Class {
    let b = base_mnemonic(mnemonic);
    let mut c = Class {
        unit: Unit::Internal,
        valu_weight: 0.0,
        fmas: 0.0,
        lds_read: 0,
        lds_write: 0,
        global: 0,
        smem: 0,
        vm: false,
        lgkm: false,
        scratch: false,
    };
    if let Some(rest) = b.strip_prefix("v_") {
        c.unit = Unit::Valu;
        c.valu_weight = if QUARTER_RATE.contains(&b) {
            4.0
        } else if rest.ends_with("_f64") {
            2.0
        } else {
            1.0
        };
        c.fmas = fmas_of(b);
    } else if b.starts_with("ds_") {
        c.unit = Unit::Lds;
        c.lgkm = true;
        let cross_lane = b.contains("permute") || b.contains("swizzle");
        if !cross_lane {
            if b.starts_with("ds_read") || b.starts_with("ds_load") {
                c.lds_read = data_bytes(b);
            } else if b.starts_with("ds_write") || b.starts_with("ds_store") {
                c.lds_write = data_bytes(b);
            }
        }
    } else if b.starts_with("global_") || b.starts_with("buffer_") || b.starts_with("flat_") {
        c.unit = Unit::Vmem;
        c.vm = true;
        c.lgkm = b.starts_with("flat_");
        if b.contains("_load") || b.contains("_store") {
            c.global = data_bytes(b);
        }
    } else if b.starts_with("scratch_") {
        c.unit = Unit::Vmem;
        c.vm = true;
        c.scratch = true;
    } else if b.starts_with("s_load") || b.starts_with("s_buffer_load") {
        c.unit = Unit::Smem;
        c.lgkm = true;
        c.smem = data_bytes(b);
    } else if b.starts_with("s_store") || b.starts_with("s_buffer_store") || b == "s_memtime" {
        c.unit = Unit::Smem;
        c.lgkm = true;
    } else if b.starts_with("s_branch")
        || b.starts_with("s_cbranch")
        || b.starts_with("s_setpc")
        || b.starts_with("s_swappc")
    {
        c.unit = Unit::Branch;
    } else if b == "s_sendmsg" {
        c.unit = Unit::Internal;
        c.lgkm = true;
    } else if b.starts_with("s_waitcnt")
        || b == "s_nop"
        || b == "s_barrier"
        || b == "s_endpgm"
        || b.starts_with("s_setprio")
        || b == "s_sleep"
        || b.starts_with("s_dcache")
    {
        c.unit = Unit::Internal;
    } else if b.starts_with("s_") {
        c.unit = Unit::Salu;
    }
    c
}

/// `s_waitcnt vmcnt(1) lgkmcnt(0)` -> (Some(1), Some(0)); a counter not named is not waited on.
pub fn waitcnt_operands(operands: &str) -> (Option<u32>, Option<u32>) {
    let get = |key: &str| {
        let i = operands.find(key)? + key.len();
        let rest = operands[i..].strip_prefix('(')?;
        rest.split(')').next()?.trim().parse::<u32>().ok()
    };
    (get("vmcnt"), get("lgkmcnt"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_the_common_gfx9_instructions() {
        let f = classify("v_fmac_f32_e32");
        assert_eq!((f.unit, f.fmas, f.valu_weight), (Unit::Valu, 1.0, 1.0));
        assert_eq!(classify("v_pk_fma_f16").fmas, 2.0);
        assert_eq!(classify("v_exp_f32_e32").valu_weight, 4.0);
        assert_eq!(classify("v_fma_f64").valu_weight, 2.0);
        assert_eq!(classify("ds_read_b128").lds_read, 16);
        assert_eq!(classify("ds_read2_b32").lds_read, 8);
        assert_eq!(classify("ds_read2st64_b64").lds_read, 16);
        assert_eq!(classify("ds_write_b64").lds_write, 8);
        assert_eq!(classify("ds_bpermute_b32").lds_read, 0);
        assert_eq!(classify("ds_read_u16").lds_read, 2);
        let g = classify("global_load_dwordx4");
        assert_eq!(
            (g.unit, g.global, g.vm, g.lgkm),
            (Unit::Vmem, 16, true, false)
        );
        assert_eq!(classify("global_store_short").global, 2);
        assert!(classify("flat_load_dword").lgkm);
        assert_eq!(classify("s_load_dwordx2").smem, 8);
        assert_eq!(classify("s_cbranch_scc1").unit, Unit::Branch);
        assert_eq!(classify("s_waitcnt").unit, Unit::Internal);
        assert_eq!(classify("s_add_u32").unit, Unit::Salu);
        assert!(classify("scratch_store_dword").scratch);
        assert!(classify("buffer_store_dword").vm);
    }

    #[test]
    fn reads_waitcnt_operands() {
        assert_eq!(waitcnt_operands("vmcnt(1) lgkmcnt(0)"), (Some(1), Some(0)));
        assert_eq!(waitcnt_operands("lgkmcnt(2)"), (None, Some(2)));
        assert_eq!(waitcnt_operands("vmcnt(0)"), (Some(0), None));
    }
}
