//! Which matmul kernel runs: the plain FMA kernels of `kernels/matmul.hip`, or the matrix-core
//! kernels of `kernels/matmul_mc.hip` (f16 and bf16, built on the 16x16x16 tile instruction:
//! MFMA on CDNA, MMAC on Hygon's gfx928 and later).
//!
//! [`MatmulKernel::Auto`] (what [`super::matmul`] and [`crate::ops::matmul_bias`] use) takes the
//! matrix-core kernel for f16 and bf16 when the device's arch has the unit
//! ([`arch_has_matrix_cores`]), the plain kernel otherwise (and always for f32).
//! [`MatmulKernel::MatrixCore`] asks for it explicitly: on hip-emu, whose device is a gfx906,
//! that is how the tests run the matrix-core kernels (hip-emu emulates the tile instruction).
//!
//! Never run on a GPU: the matrix-core kernels are compiled for gfx90a and checked statically,
//! and the device tests ran on hip-emu.

use super::device::{MAX_DIM, MAX_GRID_YZ};
use super::MatmulParams;
use crate::embedded::kernel_names::matmul_mc as names;
use crate::params::{DType, ShapeError};

/// Source (`kernels/<SOURCE>.hip`) of the matrix-core kernels.
pub(crate) const SOURCE: &str = "matmul_mc";
/// Rows and columns of `out` one block of the matrix-core kernels computes.
pub const MC_TILE: usize = 128;

/// The matmul kernel family a launch uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MatmulKernel {
    /// The matrix-core kernel for f16/bf16 when the arch has matrix cores, else the plain one.
    #[default]
    Auto,
    /// The plain FMA kernels (`matmul_*`, `matmul_small_*`), whatever the arch.
    Plain,
    /// The matrix-core kernels (`matmul_mc_*`): f16 and bf16 only, on an arch with matrix
    /// cores or on hip-emu (an error elsewhere: the kernels would trap).
    MatrixCore,
}

/// Archs whose matrix cores have the 16x16x16 f16/bf16 tile the kernels use: CDNA's MFMA
/// (gfx908, gfx90a, gfx940-942) and Hygon's MMAC (gfx928, gfx92a, gfx936, gfx938, gfx946, as
/// Hygon's public composable_kernel fork guards it). gfx926 has only an f32 tile; gfx906 has
/// none. `arch` may carry target features (`gfx90a:sramecc+:xnack-`).
pub fn arch_has_matrix_cores(arch: &str) -> bool {
    let base = arch.split(':').next().unwrap_or("");
    matches!(
        base,
        "gfx908"
            | "gfx90a"
            | "gfx940"
            | "gfx941"
            | "gfx942"
            | "gfx928"
            | "gfx92a"
            | "gfx936"
            | "gfx938"
            | "gfx946"
    )
}

/// Why a [`MatmulKernel::MatrixCore`] request cannot be served (`None`: it can).
pub(crate) fn refusal(dtype: DType, arch: &str, emulated: bool) -> Option<&'static str> {
    if dtype == DType::F32 {
        return Some(
            "the matrix-core matmul takes f16 or bf16 (f32 has no matrix-core kernel): use \
             MatmulKernel::Auto or Plain",
        );
    }
    if !emulated && !arch_has_matrix_cores(arch) {
        return Some(
            "this device's arch has no 16x16x16 f16/bf16 matrix unit (gfx908, gfx90a, gfx94x, \
             gfx928, gfx92a, gfx936, gfx938, gfx946 have one): use MatmulKernel::Auto or Plain",
        );
    }
    None
}

/// Whether `kernel` resolves to the matrix-core kernels for `dtype` on `arch`.
pub(crate) fn use_matrix_cores(kernel: MatmulKernel, dtype: DType, arch: &str) -> bool {
    match kernel {
        MatmulKernel::Auto => dtype != DType::F32 && arch_has_matrix_cores(arch),
        MatmulKernel::Plain => false,
        MatmulKernel::MatrixCore => true,
    }
}

/// How a matrix-core matmul is launched: pure arithmetic on the shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McPlan {
    /// Kernel symbol (`matmul_mc_<ab>_<dtype>`).
    pub kernel: &'static str,
    /// The bias-epilogue kernel (`matmul_mc_bias_<ab>_<dtype>`).
    pub bias_kernel: &'static str,
    /// Blocks along n and along m.
    pub grid_xy: (u32, u32),
    /// Batch items per launch (grid.z).
    pub batch_per_launch: usize,
    /// Number of launches (0 when there is nothing to compute).
    pub launches: usize,
}

impl McPlan {
    /// The plan for `shape` in `dtype` (f16 or bf16; f32 is an error naming the dtype).
    pub fn new(shape: &MatmulParams, dtype: DType) -> Result<McPlan, ShapeError> {
        let invalid = |name, value: String, reason| ShapeError::Invalid {
            op: MatmulParams::OP,
            name,
            value,
            reason,
        };
        for (name, v) in [("m", shape.m), ("n", shape.n), ("k", shape.k)] {
            if v > MAX_DIM {
                return Err(invalid(
                    name,
                    v.to_string(),
                    "must be below 2^31 - 256 on the device",
                ));
            }
        }
        let (gy, gx) = (shape.m.div_ceil(MC_TILE), shape.n.div_ceil(MC_TILE));
        if gy > MAX_GRID_YZ {
            return Err(invalid(
                "m",
                shape.m.to_string(),
                "must be at most 65535 * 128 on the device",
            ));
        }
        let ab = usize::from(shape.trans_a) * 2 + usize::from(shape.trans_b);
        let (plain, bias) = match dtype {
            DType::F16 => (
                [
                    names::MATMUL_MC_NN_F16,
                    names::MATMUL_MC_NT_F16,
                    names::MATMUL_MC_TN_F16,
                    names::MATMUL_MC_TT_F16,
                ],
                [
                    names::MATMUL_MC_BIAS_NN_F16,
                    names::MATMUL_MC_BIAS_NT_F16,
                    names::MATMUL_MC_BIAS_TN_F16,
                    names::MATMUL_MC_BIAS_TT_F16,
                ],
            ),
            DType::BF16 => (
                [
                    names::MATMUL_MC_NN_BF16,
                    names::MATMUL_MC_NT_BF16,
                    names::MATMUL_MC_TN_BF16,
                    names::MATMUL_MC_TT_BF16,
                ],
                [
                    names::MATMUL_MC_BIAS_NN_BF16,
                    names::MATMUL_MC_BIAS_NT_BF16,
                    names::MATMUL_MC_BIAS_TN_BF16,
                    names::MATMUL_MC_BIAS_TT_BF16,
                ],
            ),
            DType::F32 => {
                return Err(invalid(
                    "dtype",
                    "f32".into(),
                    "the matrix-core matmul takes f16 or bf16",
                ))
            }
        };
        let empty = shape.m == 0 || shape.n == 0 || shape.batch == 0;
        Ok(McPlan {
            kernel: plain[ab],
            bias_kernel: bias[ab],
            grid_xy: (gx as u32, gy as u32),
            batch_per_launch: shape.batch.clamp(1, MAX_GRID_YZ),
            launches: if empty {
                0
            } else {
                shape.batch.div_ceil(MAX_GRID_YZ)
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::kernel_names;

    #[test]
    fn archs_with_the_tile_are_recognised_with_or_without_features() {
        for a in [
            "gfx90a:sramecc+:xnack-",
            "gfx908",
            "gfx942",
            "gfx928",
            "gfx936",
            "gfx938",
        ] {
            assert!(arch_has_matrix_cores(a), "{a}");
        }
        for a in [
            "gfx906",
            "gfx906:sramecc+:xnack-",
            "gfx926",
            "gfx1100",
            "",
            "gfx90",
        ] {
            assert!(!arch_has_matrix_cores(a), "{a}");
        }
    }

    #[test]
    fn auto_picks_matrix_cores_for_half_types_on_matrix_archs_only() {
        use MatmulKernel::*;
        assert!(use_matrix_cores(Auto, DType::F16, "gfx90a"));
        assert!(use_matrix_cores(Auto, DType::BF16, "gfx928"));
        assert!(!use_matrix_cores(Auto, DType::F32, "gfx90a"));
        assert!(!use_matrix_cores(Auto, DType::F16, "gfx906"));
        assert!(!use_matrix_cores(Plain, DType::F16, "gfx90a"));
        assert!(use_matrix_cores(MatrixCore, DType::F16, "gfx906"));
        assert!(refusal(DType::F16, "gfx906", true).is_none());
        assert!(refusal(DType::BF16, "gfx90a", false).is_none());
        assert!(refusal(DType::F16, "gfx906", false).is_some());
        assert!(refusal(DType::F32, "gfx90a", false).is_some());
    }

    #[test]
    fn every_planned_kernel_is_in_the_name_table() {
        let table = kernel_names(SOURCE).expect("matmul_mc is in the name table");
        for dtype in [DType::F16, DType::BF16] {
            for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
                let shape = MatmulParams {
                    trans_a: ta,
                    trans_b: tb,
                    batch: 3,
                    ..MatmulParams::new(300, 129, 7)
                };
                let p = McPlan::new(&shape, dtype).unwrap();
                let ab = ["nn", "nt", "tn", "tt"][usize::from(ta) * 2 + usize::from(tb)];
                assert_eq!(p.kernel, format!("matmul_mc_{ab}_{}", dtype.name()));
                assert_eq!(
                    p.bias_kernel,
                    format!("matmul_mc_bias_{ab}_{}", dtype.name())
                );
                assert!(table.contains(&p.kernel) && table.contains(&p.bias_kernel));
                assert_eq!((p.grid_xy, p.launches, p.batch_per_launch), ((2, 3), 1, 3));
            }
        }
        assert!(McPlan::new(&MatmulParams::new(1, 1, 1), DType::F32).is_err());
        let empty = McPlan::new(&MatmulParams::new(0, 5, 5), DType::F16).unwrap();
        assert_eq!(empty.launches, 0);
        let tall = MatmulParams::new(65_536 * 128, 1, 1);
        assert!(matches!(
            McPlan::new(&tall, DType::F16),
            Err(ShapeError::Invalid { name: "m", .. })
        ));
    }
}
