//! Occupancy (waves per SIMD) a kernel's registers and LDS allow on gfx906.
//!
//! gfx906 (Vega 20, GCN5): 4 SIMDs per CU; per SIMD 256 VGPRs per lane, allocated in granules
//! of 4, and 800 SGPRs, allocated in granules of 16; at most 10 waves per SIMD (40 per CU);
//! 64 KiB of LDS per CU, allocated per work-group in granules of 512 bytes (128 dwords). A
//! work-group's waves are spread over the 4 SIMDs of one CU.
//! Sources: AMD "Vega" Instruction Set Architecture reference (2017), sections 1–3 and 9;
//! LLVM's AMDGPU backend, `llvm/lib/Target/AMDGPU/Utils/AMDGPUBaseInfo.cpp`
//! (`getVGPRAllocGranule`, `getTotalNumVGPRs`, `getTotalNumSGPRs`, `getSGPRAllocGranule`,
//! `getMaxWavesPerEU`) and `AMDGPUSubtarget::getOccupancyWithLocalMemSize`, whose result the
//! compiler prints as `; Occupancy:` (reported beside ours as a cross-check).

use serde::{Deserialize, Serialize};

pub const VGPRS_PER_SIMD_LANE: u32 = 256;
pub const VGPR_GRANULE: u32 = 4;
pub const SGPRS_PER_SIMD: u32 = 800;
pub const SGPR_GRANULE: u32 = 16;
pub const MAX_WAVES_PER_SIMD: u32 = 10;
pub const SIMDS_PER_CU: u32 = 4;
pub const LDS_PER_CU: u32 = 65536;
pub const LDS_GRANULE: u32 = 512;
pub const WAVE: u32 = 64;

/// The limits and the result, in waves per SIMD.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Occupancy {
    /// Threads per work-group assumed (the launch bound unless the source declares `block=`).
    pub block: u32,
    pub by_vgpr: u32,
    pub by_sgpr: u32,
    /// Work-groups per CU the LDS allows, as waves per SIMD.
    pub by_lds: u32,
    pub waves_per_simd: u32,
}

fn round_up(x: u32, g: u32) -> u32 {
    x.div_ceil(g) * g
}

/// `floor(256 / roundup(v, 4))`, `floor(800 / roundup(s, 16))`, capped at 10; LDS:
/// `floor(65536 / roundup(lds, 512))` work-groups per CU × waves per group / 4 SIMDs. The
/// result also honours whole work-groups: groups per CU = min(LDS groups, 4·min(vgpr, sgpr,
/// 10) / waves per group), and waves per SIMD = groups × waves per group / 4.
pub fn occupancy(vgprs: u32, sgprs: u32, lds: u32, block: u32) -> Occupancy {
    let by = |total: u32, used: u32, g: u32| {
        if used == 0 {
            MAX_WAVES_PER_SIMD
        } else {
            (total / round_up(used, g)).min(MAX_WAVES_PER_SIMD)
        }
    };
    let by_vgpr = by(VGPRS_PER_SIMD_LANE, vgprs, VGPR_GRANULE);
    let by_sgpr = by(SGPRS_PER_SIMD, sgprs, SGPR_GRANULE);
    let block = block.max(1);
    let waves_per_group = block.div_ceil(WAVE);
    let groups_by_lds = if lds == 0 {
        u32::MAX
    } else {
        LDS_PER_CU / round_up(lds, LDS_GRANULE)
    };
    let by_lds = if lds == 0 {
        MAX_WAVES_PER_SIMD
    } else {
        (groups_by_lds.saturating_mul(waves_per_group) / SIMDS_PER_CU).min(MAX_WAVES_PER_SIMD)
    };
    let regs = by_vgpr.min(by_sgpr);
    let groups_by_regs = SIMDS_PER_CU * regs / waves_per_group;
    let groups = groups_by_lds.min(groups_by_regs);
    let waves_per_simd = (groups * waves_per_group / SIMDS_PER_CU).min(MAX_WAVES_PER_SIMD);
    Occupancy {
        block,
        by_vgpr,
        by_sgpr,
        by_lds,
        waves_per_simd,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_limits_follow_the_granules() {
        assert_eq!(occupancy(64, 50, 0, 256).by_vgpr, 4);
        assert_eq!(
            occupancy(65, 50, 0, 256).by_vgpr,
            3,
            "65 rounds up to 68: 256/68 = 3"
        );
        assert_eq!(occupancy(24, 50, 0, 256).by_vgpr, 10, "capped at 10");
        assert_eq!(
            occupancy(8, 102, 0, 256).by_sgpr,
            7,
            "102 -> 112: 800/112 = 7"
        );
    }

    #[test]
    fn lds_limits_whole_work_groups() {
        // 17,408 B -> 17,408 (a multiple of 512): 65536 / 17408 = 3 groups of 4 waves:
        // 3 waves per SIMD.
        let o = occupancy(64, 40, 17408, 256);
        assert_eq!((o.by_lds, o.waves_per_simd), (3, 3));
        let o = occupancy(64, 40, 16384, 256);
        assert_eq!((o.by_lds, o.waves_per_simd), (4, 4));
        // A 1024-thread group is 16 waves = 4 per SIMD; 10-wave registers fit 2 groups.
        let o = occupancy(24, 40, 256, 1024);
        assert_eq!(o.waves_per_simd, 8);
    }
}
