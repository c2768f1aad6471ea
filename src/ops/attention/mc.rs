//! Which attention kernels run: the vector-ALU kernels of `kernels/attention.hip`, or the
//! matrix-core kernels of `kernels/attention_mc.hip` (f16 and bf16, head-dim buckets 64 and
//! 128, built on the 16x16x16 tile instruction: MFMA on CDNA, MMAC on Hygon's gfx928 and
//! later).
//!
//! [`AttentionKernel::Auto`] (what [`super::attention_forward`] and the other launchers without
//! `_with` use) takes the matrix-core kernels for f16 and bf16 with `head_dim` in 33..=128 when
//! the device's arch has matrix cores ([`crate::ops::arch_has_matrix_cores`]); the vector
//! kernels otherwise (f32, head_dim ≤ 32, which would fill half of the 64 bucket with zeros,
//! and archs without the unit). [`AttentionKernel::MatrixCore`] asks for them explicitly (any
//! head_dim ≤ 128): on hip-emu, whose device is a gfx906, that is how the tests run them
//! (hip-emu emulates the tile instruction).
//!
//! Never run on a GPU: the matrix-core kernels are compiled for gfx90a and checked statically
//! (`cargo xtask isa-mc`), and the device tests ran on hip-emu.

use super::AttentionParams;
use crate::embedded::kernel_names::attention_mc as names;
use crate::ops::arch_has_matrix_cores;
use crate::params::DType;

/// Source (`kernels/<SOURCE>.hip`) of the matrix-core kernels.
pub(crate) const SOURCE: &str = "attention_mc";
/// Keys per block of the matrix-core dk/dv kernel and queries per block of its dq kernel
/// (4 waves × 16 rows).
pub const MC_BWD_ROWS: usize = 64;
/// Threads per block of the matrix-core backward kernels.
pub(crate) const MC_BWD_THREADS: u32 = 256;

/// The attention kernel family a launch uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AttentionKernel {
    /// The matrix-core kernels for f16/bf16 with head_dim 33..=128 when the arch has matrix
    /// cores, else the vector kernels.
    #[default]
    Auto,
    /// The vector-ALU kernels (`attention_*`), whatever the arch.
    Plain,
    /// The matrix-core kernels (`attention_mc_*`): f16 and bf16 only, on an arch with matrix
    /// cores or on hip-emu (an error elsewhere: the kernels would trap).
    MatrixCore,
}

/// Why a [`AttentionKernel::MatrixCore`] request cannot be served (`None`: it can).
pub(crate) fn refusal(dtype: DType, arch: &str, emulated: bool) -> Option<&'static str> {
    if dtype == DType::F32 {
        return Some(
            "the matrix-core attention takes f16 or bf16 (f32 has no matrix-core kernel): use \
             AttentionKernel::Auto or Plain",
        );
    }
    if !emulated && !arch_has_matrix_cores(arch) {
        return Some(
            "this device's arch has no 16x16x16 f16/bf16 matrix unit (gfx908, gfx90a, gfx94x, \
             gfx928, gfx92a, gfx936, gfx938, gfx946 have one): use AttentionKernel::Auto or \
             Plain",
        );
    }
    None
}

/// Whether `kernel` resolves to the matrix-core kernels for `dtype` and `head_dim` on `arch`.
pub(crate) fn use_matrix_cores(
    kernel: AttentionKernel,
    dtype: DType,
    head_dim: usize,
    arch: &str,
) -> bool {
    match kernel {
        AttentionKernel::Auto => {
            dtype != DType::F32 && head_dim > 32 && arch_has_matrix_cores(arch)
        }
        AttentionKernel::Plain => false,
        AttentionKernel::MatrixCore => true,
    }
}

/// How the matrix-core kernels are launched for one shape: pure arithmetic, no device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct McAttentionPlan {
    /// Head-dim bucket: 64 (head_dim ≤ 64) or 128.
    pub bucket: usize,
    /// Threads per block of the forward kernel (`FwdCfg<DB>::THREADS`: 8 waves in both
    /// buckets).
    pub fwd_threads: u32,
    /// Blocks along the queries of the forward kernel (16 queries per wave).
    pub fwd_blocks: u32,
    /// Blocks along the keys of the dk/dv kernel.
    pub dkdv_blocks: u32,
    /// Blocks along the queries of the dq kernel.
    pub dq_blocks: u32,
}

impl McAttentionPlan {
    /// The plan for `shape` (head_dim 1..=128 and the lengths checked by
    /// [`super::AttentionPlan::new`] first).
    pub fn new(shape: &AttentionParams) -> McAttentionPlan {
        let bucket = if shape.head_dim <= 64 { 64 } else { 128 };
        let fwd_threads: u32 = 512;
        let fwd_rows = 16 * fwd_threads as usize / 64;
        // tq, tk ≤ MAX_T (checked by AttentionPlan::new), so the quotients fit.
        let blocks = |rows: usize, per: usize| rows.div_ceil(per) as u32;
        McAttentionPlan {
            bucket,
            fwd_threads,
            fwd_blocks: blocks(shape.tq, fwd_rows),
            dkdv_blocks: blocks(shape.tk, MC_BWD_ROWS),
            dq_blocks: blocks(shape.tq, MC_BWD_ROWS),
        }
    }

    /// `attention_mc_fwd_d<bucket>[_varlen]_<dtype>` (f16 or bf16; `None` for f32).
    pub fn forward_kernel(&self, dtype: DType, varlen: bool) -> Option<&'static str> {
        let k = match (self.bucket, varlen, dtype) {
            (64, false, DType::F16) => names::ATTENTION_MC_FWD_D64_F16,
            (64, false, DType::BF16) => names::ATTENTION_MC_FWD_D64_BF16,
            (64, true, DType::F16) => names::ATTENTION_MC_FWD_D64_VARLEN_F16,
            (64, true, DType::BF16) => names::ATTENTION_MC_FWD_D64_VARLEN_BF16,
            (_, false, DType::F16) => names::ATTENTION_MC_FWD_D128_F16,
            (_, false, DType::BF16) => names::ATTENTION_MC_FWD_D128_BF16,
            (_, true, DType::F16) => names::ATTENTION_MC_FWD_D128_VARLEN_F16,
            (_, true, DType::BF16) => names::ATTENTION_MC_FWD_D128_VARLEN_BF16,
            (_, _, DType::F32) => return None,
        };
        Some(k)
    }

    /// `attention_mc_bwd_dkdv_d<bucket>_<dtype>` (one kernel with or without `cu_seqlens`).
    pub fn dkdv_kernel(&self, dtype: DType) -> Option<&'static str> {
        let k = match (self.bucket, dtype) {
            (64, DType::F16) => names::ATTENTION_MC_BWD_DKDV_D64_F16,
            (64, DType::BF16) => names::ATTENTION_MC_BWD_DKDV_D64_BF16,
            (_, DType::F16) => names::ATTENTION_MC_BWD_DKDV_D128_F16,
            (_, DType::BF16) => names::ATTENTION_MC_BWD_DKDV_D128_BF16,
            (_, DType::F32) => return None,
        };
        Some(k)
    }

    /// `attention_mc_bwd_dq_d<bucket>[_varlen]_<dtype>`.
    pub fn dq_kernel(&self, dtype: DType, varlen: bool) -> Option<&'static str> {
        let k = match (self.bucket, varlen, dtype) {
            (64, false, DType::F16) => names::ATTENTION_MC_BWD_DQ_D64_F16,
            (64, false, DType::BF16) => names::ATTENTION_MC_BWD_DQ_D64_BF16,
            (64, true, DType::F16) => names::ATTENTION_MC_BWD_DQ_D64_VARLEN_F16,
            (64, true, DType::BF16) => names::ATTENTION_MC_BWD_DQ_D64_VARLEN_BF16,
            (_, false, DType::F16) => names::ATTENTION_MC_BWD_DQ_D128_F16,
            (_, false, DType::BF16) => names::ATTENTION_MC_BWD_DQ_D128_BF16,
            (_, true, DType::F16) => names::ATTENTION_MC_BWD_DQ_D128_VARLEN_F16,
            (_, true, DType::BF16) => names::ATTENTION_MC_BWD_DQ_D128_VARLEN_BF16,
            (_, _, DType::F32) => return None,
        };
        Some(k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::kernel_names;

    fn shape(tq: usize, tk: usize, head_dim: usize) -> AttentionParams {
        AttentionParams {
            batch: 2,
            heads: 4,
            n_kv_heads: 2,
            tq,
            tk,
            head_dim,
            causal: true,
            scale: 0.125,
        }
    }

    #[test]
    fn auto_picks_matrix_cores_for_half_types_and_wide_heads_on_matrix_archs_only() {
        use AttentionKernel::*;
        assert!(use_matrix_cores(Auto, DType::F16, 64, "gfx90a"));
        assert!(use_matrix_cores(Auto, DType::BF16, 128, "gfx928"));
        assert!(use_matrix_cores(
            Auto,
            DType::BF16,
            33,
            "gfx90a:sramecc+:xnack-"
        ));
        assert!(!use_matrix_cores(Auto, DType::F16, 32, "gfx90a"));
        assert!(!use_matrix_cores(Auto, DType::F32, 64, "gfx90a"));
        assert!(!use_matrix_cores(Auto, DType::F16, 64, "gfx906"));
        assert!(!use_matrix_cores(Plain, DType::F16, 64, "gfx90a"));
        assert!(use_matrix_cores(MatrixCore, DType::F16, 8, "gfx906"));
        assert!(refusal(DType::F32, "gfx90a", false).is_some());
        assert!(refusal(DType::F16, "gfx906", false).is_some());
        assert!(refusal(DType::F16, "gfx906", true).is_none());
        assert!(refusal(DType::BF16, "gfx936", false).is_none());
    }

    #[test]
    fn buckets_grids_and_every_kernel_exist() {
        let table = kernel_names(SOURCE).expect("attention_mc is in the name table");
        for (d, bucket, threads) in [(1, 64, 512), (64, 64, 512), (65, 128, 512), (128, 128, 512)] {
            let p = McAttentionPlan::new(&shape(1000, 130, d));
            assert_eq!((p.bucket, p.fwd_threads), (bucket, threads), "head_dim {d}");
            let fwd_rows = 16 * threads as usize / 64;
            assert_eq!(p.fwd_blocks as usize, 1000usize.div_ceil(fwd_rows));
            assert_eq!((p.dkdv_blocks, p.dq_blocks), (3, 16));
            for dtype in [DType::F16, DType::BF16] {
                let n = dtype.name();
                for (k, want) in [
                    (
                        p.forward_kernel(dtype, false),
                        format!("attention_mc_fwd_d{bucket}_{n}"),
                    ),
                    (
                        p.forward_kernel(dtype, true),
                        format!("attention_mc_fwd_d{bucket}_varlen_{n}"),
                    ),
                    (
                        p.dkdv_kernel(dtype),
                        format!("attention_mc_bwd_dkdv_d{bucket}_{n}"),
                    ),
                    (
                        p.dq_kernel(dtype, false),
                        format!("attention_mc_bwd_dq_d{bucket}_{n}"),
                    ),
                    (
                        p.dq_kernel(dtype, true),
                        format!("attention_mc_bwd_dq_d{bucket}_varlen_{n}"),
                    ),
                ] {
                    let k = k.expect("f16/bf16 kernels exist");
                    assert_eq!(k, want);
                    assert!(table.contains(&k), "{k}");
                }
            }
            assert_eq!(p.forward_kernel(DType::F32, false), None);
            assert_eq!(p.dkdv_kernel(DType::F32), None);
            assert_eq!(p.dq_kernel(DType::F32, true), None);
        }
        let p = McAttentionPlan::new(&shape(0, 0, 64));
        assert_eq!((p.fwd_blocks, p.dkdv_blocks, p.dq_blocks), (0, 0, 0));
    }
}
