//! Occupancy queries, answered from the kernel's resources in its code object's metadata
//! (VGPRs, SGPRs, static LDS, the flat work-group size limit) with gfx906's per-CU limits: 4
//! SIMDs of at most 10 waves, 256 VGPRs per lane (granule 4) and 800 SGPRs per SIMD (granule
//! 16), 64 KiB of LDS, 40 waves per CU. A static model of a device, not a measurement.

use std::ffi::{c_int, c_void};

use hip_sys::hipFunction_t;

use super::device::{COMPUTE_UNITS, LDS_PER_BLOCK, MAX_THREADS_PER_BLOCK, WAVEFRONT};
use super::error::{Fail, Res};
use super::metadata::KernelMeta;
use super::module::function;
use super::{hip_exports, out};

const SIMDS: u64 = 4;
const WAVES_PER_SIMD: u64 = 10;
const WAVES_PER_CU: u64 = 40;

/// Blocks of `block` threads with `dynamic` bytes of dynamic LDS that fit on one CU at once.
pub fn max_active_blocks(meta: &KernelMeta, block: u64, dynamic: u64) -> u64 {
    let limit = if meta.max_flat_workgroup_size == 0 {
        MAX_THREADS_PER_BLOCK as u64
    } else {
        meta.max_flat_workgroup_size
    };
    if block == 0 || block > limit {
        return 0;
    }
    let round = |v: u64, g: u64| v.max(1).div_ceil(g) * g;
    let by_vgpr = 256 / round(meta.vgpr_count, 4);
    let by_sgpr = 800 / round(meta.sgpr_count, 16);
    let waves_per_simd = WAVES_PER_SIMD.min(by_vgpr).min(by_sgpr);
    let waves_per_block = block.div_ceil(WAVEFRONT as u64);
    let by_waves = (waves_per_simd * SIMDS).min(WAVES_PER_CU) / waves_per_block;
    let lds = meta.group_segment_fixed_size + dynamic;
    let by_lds = (LDS_PER_BLOCK as u64).checked_div(lds).unwrap_or(u64::MAX);
    by_waves.min(by_lds)
}

/// The block size (a multiple of the wavefront, at most `limit`) with the most active threads
/// per CU, the smallest such; and the grid that fills every CU with it.
pub fn potential_block_size(meta: &KernelMeta, dynamic: u64, limit: u64) -> Option<(u64, u64)> {
    let mut best: Option<(u64, u64)> = None;
    let mut block = WAVEFRONT as u64;
    while block <= limit.min(MAX_THREADS_PER_BLOCK as u64) {
        let blocks = max_active_blocks(meta, block, dynamic);
        if blocks > 0 && best.map_or(true, |(b, n)| blocks * block > n * b) {
            best = Some((block, blocks));
        }
        block += WAVEFRONT as u64;
    }
    best.map(|(block, blocks)| (block, blocks * COMPUTE_UNITS as u64))
}

fn to_int(v: u64) -> c_int {
    c_int::try_from(v).unwrap_or(c_int::MAX)
}

hip_exports! {
    fn hipModuleOccupancyMaxActiveBlocksPerMultiprocessor(num_blocks: *mut c_int, f: hipFunction_t, block_size: c_int, dyn_shared: usize) {
        let func = function(f)?;
        let block = u64::try_from(block_size).map_err(|_| Fail::invalid(format!("hipModuleOccupancyMaxActiveBlocksPerMultiprocessor: block size {block_size} is negative")))?;
        let n = max_active_blocks(&func.meta, block, dyn_shared as u64);
        // SAFETY: out-parameter per the C API contract.
        unsafe { out(num_blocks, to_int(n), "numBlocks") }
    }

    fn hipModuleOccupancyMaxPotentialBlockSize(grid_size: *mut c_int, block_size: *mut c_int, f: hipFunction_t, dyn_shared: usize, block_size_limit: c_int) {
        // SAFETY: forwarded from the caller (the C API contract).
        unsafe { answer_potential("hipModuleOccupancyMaxPotentialBlockSize", grid_size, block_size, f, dyn_shared, block_size_limit) }
    }

    /// The runtime form. HIP's `f` is the kernel's host stub; hip-emu has no host stubs, so `f`
    /// is a `hipFunction_t` from `hipModuleGetFunction` (cast to `const void*`), answered as
    /// the module form.
    fn hipOccupancyMaxPotentialBlockSize(grid_size: *mut c_int, block_size: *mut c_int, f: *const c_void, dyn_shared: usize, block_size_limit: c_int) {
        // SAFETY: as above.
        unsafe { answer_potential("hipOccupancyMaxPotentialBlockSize", grid_size, block_size, f as hipFunction_t, dyn_shared, block_size_limit) }
    }
}

/// Both forms of `hipOccupancyMaxPotentialBlockSize`.
///
/// # Safety
/// `grid_size` and `block_size` are null or valid for a write.
unsafe fn answer_potential(
    api: &str,
    grid_size: *mut c_int,
    block_size: *mut c_int,
    f: hipFunction_t,
    dyn_shared: usize,
    block_size_limit: c_int,
) -> Res {
    let func = function(f).map_err(|e| {
        Fail::new(
            e.code,
            format!(
                "{api}: {} (on hip-emu `f` is a hipFunction_t from hipModuleGetFunction)",
                e.message
            ),
        )
    })?;
    let limit = if block_size_limit <= 0 {
        MAX_THREADS_PER_BLOCK as u64
    } else {
        block_size_limit as u64
    };
    let (block, grid) = potential_block_size(&func.meta, dyn_shared as u64, limit).ok_or_else(|| {
        Fail::invalid(format!(
            "{api}: kernel `{}` fits no block of up to {limit} threads with {dyn_shared} bytes of dynamic LDS",
            func.meta.name
        ))
    })?;
    // SAFETY: out-parameters per the caller's contract.
    unsafe { out(grid_size, to_int(grid), "gridSize") }?;
    // SAFETY: as above.
    unsafe { out(block_size, to_int(block), "blockSize") }
}

/// Checks `hipModuleOccupancy*`'s model on made-up resource figures.
#[cfg(test)]
mod tests {
    use super::*;

    fn meta(vgprs: u64, sgprs: u64, lds: u64, max_block: u64) -> KernelMeta {
        KernelMeta {
            name: "k".into(),
            symbol: "k.kd".into(),
            args: Vec::new(),
            group_segment_fixed_size: lds,
            private_segment_fixed_size: 0,
            max_flat_workgroup_size: max_block,
            vgpr_count: vgprs,
            sgpr_count: sgprs,
            wavefront_size: 64,
        }
    }

    #[test]
    fn registers_lds_and_waves_bound_the_blocks_per_cu() {
        // 32 VGPRs: 8 waves/SIMD, 32 per CU; blocks of 256 (4 waves): 8.
        assert_eq!(max_active_blocks(&meta(32, 16, 0, 1024), 256, 0), 8);
        // Few registers: the 40-wave CU limit (10 blocks of 4 waves).
        assert_eq!(max_active_blocks(&meta(8, 16, 0, 1024), 256, 0), 10);
        // 16 KiB of static LDS plus 8 KiB dynamic: 2 blocks fit in 64 KiB.
        assert_eq!(max_active_blocks(&meta(8, 16, 16384, 1024), 64, 8192), 2);
        // 128 VGPRs: 2 waves/SIMD; a block of 1024 (16 waves) does not fit.
        assert_eq!(max_active_blocks(&meta(128, 16, 0, 1024), 1024, 0), 0);
        // Over the kernel's own limit (__launch_bounds__(256)).
        assert_eq!(max_active_blocks(&meta(8, 16, 0, 256), 512, 0), 0);
        // The potential block size maximises active threads.
        let (block, grid) = potential_block_size(&meta(128, 16, 0, 1024), 0, 1024).unwrap();
        assert_eq!(
            max_active_blocks(&meta(128, 16, 0, 1024), block, 0) * block,
            512
        );
        assert_eq!(grid % COMPUTE_UNITS as u64, 0);
        assert!(potential_block_size(&meta(8, 16, 65536, 1024), 1, 1024).is_none());
    }
}
