//! Matmul on the device (`kernels/matmul.hip`), with the CPU reference's name and argument
//! struct ([`crate::cpu::matmul`]) plus the stream: `out = alpha·op(A)·op(B) + beta·out`, row-major,
//! packed or strided batches ([`super::MatmulLayout`]), f32 accumulation.
//!
//! The same launcher runs the bias-epilogue kernels (`matmul_bias_*`, `matmul_small_bias_*`) for
//! [`crate::ops::matmul_bias`].
//!
//! Never run on a GPU: the launch plan is unit-tested, the kernels are compiled and statically
//! checked for gfx906, and the device tests ran on hip-emu (the CPU-emulated device), not on a
//! GPU.

use super::mc::{self, MatmulKernel};
use super::{Matmul, MatmulParams, ResolvedLayout};
use crate::embedded::kernel_names::matmul as names;
use crate::ops::launch::{dtype_kernel, kernel_named, ptr};
use crate::ops::OpError;
use crate::params::{DType, DeviceElement, OnDevice, ShapeError};
use hip_rt::{DevicePtr, LaunchConfig, Stream};

const SOURCE: &str = "matmul";
/// Threads per block every matmul kernel is compiled for.
const BLOCK: u32 = 256;
/// Largest grid.y and grid.z of one launch.
pub const MAX_GRID_YZ: usize = 65_535;
/// Largest m, n or k: the kernels index within a matrix with 32-bit ints (plus a tile of slack).
pub const MAX_DIM: usize = i32::MAX as usize - 256;

/// The block tile of a matmul kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatmulTile {
    /// 128×128 outputs per block (`matmul_<ab>_<dtype>`): big problems.
    Big,
    /// 64×64 outputs per block (`matmul_small_<ab>_<dtype>`): problems with few big tiles.
    Small,
}

impl MatmulTile {
    /// Rows and columns of `out` one block computes.
    pub const fn edge(self) -> usize {
        match self {
            MatmulTile::Big => 128,
            MatmulTile::Small => 64,
        }
    }

    /// The generated kernel-name triples of this tile, indexed `[bias epilogue][nn, nt, tn, tt]`.
    const fn kernels(self) -> [[[&'static str; 3]; 4]; 2] {
        match self {
            MatmulTile::Big => [
                [
                    names::MATMUL_NN,
                    names::MATMUL_NT,
                    names::MATMUL_TN,
                    names::MATMUL_TT,
                ],
                [
                    names::MATMUL_BIAS_NN,
                    names::MATMUL_BIAS_NT,
                    names::MATMUL_BIAS_TN,
                    names::MATMUL_BIAS_TT,
                ],
            ],
            MatmulTile::Small => [
                [
                    names::MATMUL_SMALL_NN,
                    names::MATMUL_SMALL_NT,
                    names::MATMUL_SMALL_TN,
                    names::MATMUL_SMALL_TT,
                ],
                [
                    names::MATMUL_SMALL_BIAS_NN,
                    names::MATMUL_SMALL_BIAS_NT,
                    names::MATMUL_SMALL_BIAS_TN,
                    names::MATMUL_SMALL_BIAS_TT,
                ],
            ],
        }
    }
}

/// How a matmul is launched: pure arithmetic on the shape and the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatmulPlan {
    /// Kernel symbol (an entry of [`crate::ops::kernel_names`]`("matmul")`).
    pub kernel: &'static str,
    /// The bias-epilogue kernel of the same tile, layout and dtype.
    bias_kernel: &'static str,
    /// Block tile.
    pub tile: MatmulTile,
    /// Blocks along n and along m.
    pub grid_xy: (u32, u32),
    /// Batch items per launch (grid.z); the batch is split into `launches` launches.
    pub batch_per_launch: usize,
    /// Number of launches (0 when there is nothing to compute).
    pub launches: usize,
}

fn invalid(name: &'static str, value: usize, reason: &'static str) -> ShapeError {
    ShapeError::Invalid {
        op: MatmulParams::OP,
        name,
        value: value.to_string(),
        reason,
    }
}

impl MatmulPlan {
    /// The plan for `shape` in `dtype` on a device with `compute_units` CUs. The small tile is
    /// used when big tiles would not give every CU two blocks (skinny or small problems).
    pub fn new(
        shape: &MatmulParams,
        dtype: DType,
        compute_units: u32,
    ) -> Result<MatmulPlan, ShapeError> {
        Self::with_tile(shape, dtype, compute_units, None)
    }

    /// [`MatmulPlan::new`] with the tile forced (`None`: `new`'s choice); the GEMM tuner times
    /// both tiles.
    pub fn with_tile(
        shape: &MatmulParams,
        dtype: DType,
        compute_units: u32,
        forced: Option<MatmulTile>,
    ) -> Result<MatmulPlan, ShapeError> {
        for (name, v) in [("m", shape.m), ("n", shape.n), ("k", shape.k)] {
            if v > MAX_DIM {
                return Err(invalid(name, v, "must be below 2^31 - 256 on the device"));
            }
        }
        let blocks = |t: MatmulTile| (shape.m.div_ceil(t.edge()), shape.n.div_ceil(t.edge()));
        let (bm, bn) = blocks(MatmulTile::Big);
        let big_blocks = bm.saturating_mul(bn).saturating_mul(shape.batch);
        let wanted = 2 * compute_units.max(1) as usize;
        let small_fits = blocks(MatmulTile::Small).0 <= MAX_GRID_YZ;
        let tile = match forced {
            Some(tile) => tile,
            None if big_blocks < wanted && small_fits => MatmulTile::Small,
            None => MatmulTile::Big,
        };
        let (gy, gx) = blocks(tile);
        if gy > MAX_GRID_YZ || gx > u32::MAX as usize {
            return Err(invalid(
                "m",
                shape.m,
                "must be at most 65535 * 128 on the device",
            ));
        }
        let ab = match (shape.trans_a, shape.trans_b) {
            (false, false) => 0, // nn
            (false, true) => 1,  // nt
            (true, false) => 2,  // tn
            (true, true) => 3,   // tt
        };
        let [plain, bias] = tile.kernels();
        let empty = shape.m == 0 || shape.n == 0 || shape.batch == 0;
        Ok(MatmulPlan {
            kernel: dtype_kernel(plain[ab], dtype),
            bias_kernel: dtype_kernel(bias[ab], dtype),
            tile,
            grid_xy: (gx as u32, gy as u32),
            batch_per_launch: shape.batch.clamp(1, MAX_GRID_YZ),
            launches: if empty {
                0
            } else {
                shape.batch.div_ceil(MAX_GRID_YZ)
            },
        })
    }

    /// The bias-epilogue kernel of the same tile, layout and dtype (`matmul_bias_<ab>_<dtype>`
    /// or `matmul_small_bias_<ab>_<dtype>`).
    pub fn bias_kernel(&self) -> &'static str {
        self.bias_kernel
    }
}

/// [`Matmul`] on `stream`: `out = alpha·op(a)·op(b) + beta·out` (out doubles as C, read only
/// when `beta != 0`, so it may hold anything when `beta == 0`). Same semantics and validation as
/// [`crate::cpu::matmul`]; f32 accumulation (the reference uses f64). Queues the work; no host
/// sync, unless GEMM tuning is on ([`super::tuning`]; off by default).
///
/// # Host sync
/// With `HIPK_GEMM_TUNING=tune` (or a tuner installed by [`super::set_gemm_tuner`]), the first
/// call of each shape times every candidate and waits for the device; later calls queue only.
pub fn matmul<T: DeviceElement>(
    stream: &Stream,
    args: Matmul<'_, OnDevice, T>,
) -> Result<(), OpError> {
    args.validate()?;
    if super::tuning::global_active()? {
        return super::tuning::global_matmul(stream, args);
    }
    let (pa, pb, po) = (
        ptr(stream, "a", args.a)?,
        ptr(stream, "b", args.b)?,
        ptr(stream, "out", args.out)?,
    );
    launch_gemm::<T>(stream, &args.params, [pa, pb, po], None, MatmulKernel::Auto)
}

/// [`matmul`] with an explicit kernel family ([`MatmulKernel`]): `MatrixCore` runs the
/// matrix-core kernels (f16/bf16; on an arch with matrix cores or on hip-emu, else a typed
/// error), `Plain` the FMA kernels, `Auto` what [`matmul`] picks. Queues the work; no host sync.
pub fn matmul_with<T: DeviceElement>(
    stream: &Stream,
    args: Matmul<'_, OnDevice, T>,
    kernel: MatmulKernel,
) -> Result<(), OpError> {
    args.validate()?;
    let (pa, pb, po) = (
        ptr(stream, "a", args.a)?,
        ptr(stream, "b", args.b)?,
        ptr(stream, "out", args.out)?,
    );
    launch_gemm::<T>(stream, &args.params, [pa, pb, po], None, kernel)
}

/// The bias epilogue of the `matmul_bias_*` / `matmul_small_bias_*` kernels: `bias` (`[n]`,
/// added to every row in f32), `pre_gelu` (null, or `[batch, m, n]` like out: the pre-activation
/// rounded to T) and `gelu` (GELU-tanh in f32 before the one rounding of out).
#[derive(Debug, Clone, Copy)]
pub(crate) struct BiasEpilogue {
    pub bias: DevicePtr,
    pub pre_gelu: DevicePtr,
    pub gelu: bool,
}

/// Launches the GEMM of `shape` on the device pointers `[a, b, out]` (out doubles as C), with
/// the bias epilogue when `epilogue` is given. The caller validated that the buffers hold
/// exactly the elements `shape` needs (and `[n]` for the bias, `[batch, m, n]` for pre_gelu).
pub(crate) fn launch_gemm<T: DeviceElement>(
    stream: &Stream,
    shape: &MatmulParams,
    [pa, pb, po]: [DevicePtr; 3],
    epilogue: Option<BiasEpilogue>,
    kernel: MatmulKernel,
) -> Result<(), OpError> {
    launch_gemm_tiled::<T>(stream, shape, [pa, pb, po], epilogue, kernel, None)
}

/// [`launch_gemm`] with the plain kernel's tile forced (`None`: [`MatmulPlan::new`]'s choice).
/// A forced tile runs the plain (FMA) kernel whatever `kernel` says.
pub(crate) fn launch_gemm_tiled<T: DeviceElement>(
    stream: &Stream,
    shape: &MatmulParams,
    [pa, pb, po]: [DevicePtr; 3],
    epilogue: Option<BiasEpilogue>,
    kernel: MatmulKernel,
    tile: Option<MatmulTile>,
) -> Result<(), OpError> {
    let (alpha, beta) = (shape.alpha, shape.beta);
    // The kernel family (src/ops/matmul/mc.rs): launches, grid and names of either plan.
    let device = stream.device();
    let (source, [plain, bias], grid_xy, batch_per_launch, launches) =
        if tile.is_none() && mc::use_matrix_cores(kernel, T::DTYPE, device.arch()) {
            if let Some(reason) = mc::refusal(T::DTYPE, device.arch(), device.is_emulated()) {
                return Err(OpError::NoKernel {
                    op: MatmulParams::OP,
                    reason,
                });
            }
            let p = mc::McPlan::new(shape, T::DTYPE)?;
            let names = [p.kernel, p.bias_kernel];
            (mc::SOURCE, names, p.grid_xy, p.batch_per_launch, p.launches)
        } else {
            let p = MatmulPlan::with_tile(shape, T::DTYPE, device.compute_units(), tile)?;
            let names = [p.kernel, p.bias_kernel()];
            (SOURCE, names, p.grid_xy, p.batch_per_launch, p.launches)
        };
    if launches == 0 {
        return Ok(());
    }
    let name = match epilogue {
        Some(_) => bias,
        None => plain,
    };
    let f = kernel_named(stream, source, name)?;
    let (m, n, k) = (shape.m, shape.n, shape.k);
    // Leading dimensions and batch strides (packed unless the caller's layout says otherwise);
    // validate() checked them against the buffers, so every offset below stays inside.
    let ResolvedLayout {
        ld: [lda, ldb, ldc],
        stride: [sa, sb, so],
        ..
    } = shape.resolve()?;
    let elem = std::mem::size_of::<T>();
    for launch in 0..launches {
        let first = launch * batch_per_launch;
        let items = (shape.batch - first).min(batch_per_launch);
        let mut builder = stream.launch_builder(&f);
        let c_and_out = po.byte_add(first * so * elem);
        builder
            .value(pa.byte_add(first * sa * elem))
            .value(pb.byte_add(first * sb * elem))
            .value(c_and_out)
            .value(c_and_out)
            .value(m as i32)
            .value(n as i32)
            .value(k as i32);
        for v in [lda, ldb, ldc, ldc, sa, sb, so, so] {
            builder.value(v as i64);
        }
        builder.value(alpha).value(beta);
        if let Some(e) = epilogue {
            let pre = if e.pre_gelu.is_null() {
                DevicePtr::NULL
            } else {
                e.pre_gelu.byte_add(first * so * elem)
            };
            builder.value(e.bias).value(pre).value(i32::from(e.gelu));
        }
        let config = LaunchConfig {
            grid: (grid_xy.0, grid_xy.1, items as u32),
            block: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments are those of matmul_*_<T> (and of matmul_mc_*_<T>, which take
        // the same list) in order (a, b, c, out: device
        // pointers, c = out; M, N, K: int; lda, ldb, ldc, ldo, stride_a, stride_b, stride_c,
        // stride_o: int64_t; alpha, beta: float), and for matmul_*bias_*_<T> then bias, pre_gelu
        // (device pointers, pre_gelu null or laid out as out) and gelu (int). The callers
        // validated that a, b and out (and pre_gelu) reach every element of their layouts
        // (packed: exactly batch·m·k, batch·k·n and batch·m·n elements; strided: at least
        // MatmulParams::resolve's reach, outputs not overlapping) and bias n, so items
        // `first..first + items` lie inside them; ld and strides fit an int64_t;
        // m, n, k ≤ MAX_DIM fit an int; the buffers live on the stream's device and the
        // allocator was told the stream uses them.
        unsafe { builder.launch(&config) }?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::kernel_names;

    fn shape(batch: usize, m: usize, n: usize, k: usize, ta: bool, tb: bool) -> MatmulParams {
        MatmulParams {
            batch,
            trans_a: ta,
            trans_b: tb,
            ..MatmulParams::new(m, n, k)
        }
    }

    #[test]
    fn every_planned_kernel_is_in_the_name_table() {
        let names = kernel_names(SOURCE).expect("matmul is in the name table");
        for dtype in DType::ALL {
            for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
                for (m, n) in [(4096, 4096), (8192, 64), (1, 1)] {
                    let p = MatmulPlan::new(&shape(1, m, n, 64, ta, tb), dtype, 60).unwrap();
                    assert!(names.contains(&p.kernel), "{}", p.kernel);
                    let bias = p.bias_kernel();
                    assert!(names.contains(&bias), "{bias}");
                    let prefix = if p.tile == MatmulTile::Small {
                        "matmul_small_"
                    } else {
                        "matmul_"
                    };
                    let ab = ["nn", "nt", "tn", "tt"][usize::from(ta) * 2 + usize::from(tb)];
                    assert_eq!(p.kernel, format!("{prefix}{ab}_{}", dtype.name()));
                    assert_eq!(bias, format!("{prefix}bias_{ab}_{}", dtype.name()));
                }
            }
        }
    }

    #[test]
    fn big_problems_take_the_big_tile_and_skinny_ones_the_small() {
        let big =
            MatmulPlan::new(&shape(1, 4096, 4096, 4096, false, false), DType::F32, 60).unwrap();
        assert_eq!(
            (big.tile, big.grid_xy, big.kernel),
            (MatmulTile::Big, (32, 32), "matmul_nn_f32")
        );
        let skinny =
            MatmulPlan::new(&shape(1, 8192, 64, 8192, false, true), DType::BF16, 60).unwrap();
        assert_eq!((skinny.tile, skinny.grid_xy), (MatmulTile::Small, (1, 128)));
        assert_eq!(skinny.kernel, "matmul_small_nt_bf16");
        let tiny = MatmulPlan::new(&shape(3, 1, 129, 7, true, false), DType::F16, 60).unwrap();
        assert_eq!(
            (tiny.grid_xy, tiny.launches, tiny.kernel),
            ((3, 1), 1, "matmul_small_tn_f16")
        );
    }

    #[test]
    fn batches_beyond_the_grid_limit_are_split_into_launches() {
        let p = MatmulPlan::new(&shape(200_000, 2, 2, 2, false, false), DType::F32, 60).unwrap();
        assert_eq!((p.batch_per_launch, p.launches), (MAX_GRID_YZ, 4));
        let one = MatmulPlan::new(&shape(65_535, 2, 2, 2, false, false), DType::F32, 60).unwrap();
        assert_eq!(one.launches, 1);
    }

    #[test]
    fn empty_outputs_launch_nothing_but_k_zero_still_scales_c() {
        for s in [
            shape(1, 0, 5, 3, false, false),
            shape(1, 5, 0, 3, false, false),
            shape(0, 5, 5, 3, false, false),
        ] {
            assert_eq!(
                MatmulPlan::new(&s, DType::F32, 60).unwrap().launches,
                0,
                "{s:?}"
            );
        }
        assert_eq!(
            MatmulPlan::new(&shape(1, 5, 5, 0, false, false), DType::F32, 60)
                .unwrap()
                .launches,
            1
        );
    }

    #[test]
    fn dimensions_the_kernels_cannot_index_are_typed_errors() {
        let e =
            MatmulPlan::new(&shape(1, 5, 5, 1 << 31, false, false), DType::F32, 60).unwrap_err();
        assert!(matches!(e, ShapeError::Invalid { name: "k", .. }), "{e}");
        assert!(e.to_string().contains("2147483648"), "{e}");
        let e = MatmulPlan::new(&shape(1, 65_536 * 128, 1, 1, false, false), DType::F32, 60)
            .unwrap_err();
        assert!(matches!(e, ShapeError::Invalid { name: "m", .. }), "{e}");
    }
}
