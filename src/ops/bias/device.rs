//! Matmul + bias (+ GELU) and the bias gradient on the device: the GEMM of `kernels/matmul.hip`
//! with the bias epilogue fused into its store (one launch), and the two-stage column sums of
//! `kernels/bias.hip`.
//!
//! Never run on a GPU: compiled and statically checked for gfx906; the device tests ran on
//! hip-emu (the CPU-emulated device) only.

use super::{BiasBackward, BiasParams, MatmulBias};
use crate::embedded::kernel_names::bias as names;
use crate::ops::launch::{kernel, ptr};
use crate::ops::matmul::{launch_gemm, BiasEpilogue, MatmulKernel};
use crate::ops::OpError;
use crate::params::{invalid, DeviceElement, OnDevice};
use hip_rt::memory::buffer::DeviceBuffer;
use hip_rt::{DevicePtr, LaunchConfig, Stream};

const SOURCE: &str = "bias";
/// Threads per block the kernels are compiled for (`__launch_bounds__`).
const BLOCK: u32 = 256;

fn cfg(grid: (u32, u32), block: u32) -> LaunchConfig {
    LaunchConfig {
        grid: (grid.0, grid.1, 1),
        block: (block, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// [`MatmulBias`] on `stream`: [`crate::cpu::matmul_bias`]'s semantics in one launch (per
/// 65535 batch items) of the GEMM with the bias epilogue of `kernels/matmul.hip`: the f32
/// accumulator plus the bias in f32, GELU in f32, one rounding to T on store (`pre_gelu`, when
/// given, is the pre-activation rounded once). Queues the work; no host sync.
pub fn matmul_bias<T: DeviceElement>(
    stream: &Stream,
    a: MatmulBias<'_, OnDevice, T>,
) -> Result<(), OpError> {
    matmul_bias_with(stream, a, MatmulKernel::Auto)
}

/// [`matmul_bias`] with an explicit kernel family ([`MatmulKernel`], as
/// [`crate::ops::matmul_with`]). Queues the work; no host sync.
pub fn matmul_bias_with<T: DeviceElement>(
    stream: &Stream,
    a: MatmulBias<'_, OnDevice, T>,
    kernel: MatmulKernel,
) -> Result<(), OpError> {
    a.validate()?;
    let p = a.params;
    let m = p.matmul();
    let pointers = [
        ptr(stream, "a", a.a)?,
        ptr(stream, "b", a.b)?,
        ptr(stream, "out", &*a.out)?,
    ];
    let epilogue = BiasEpilogue {
        bias: ptr(stream, "bias", a.bias)?,
        pre_gelu: match &a.pre_gelu {
            Some(v) => ptr(stream, "pre_gelu", &**v)?,
            None => DevicePtr::NULL,
        },
        gelu: p.gelu,
    };
    launch_gemm::<T>(stream, &m, pointers, Some(epilogue), kernel)
}

/// How [`bias_backward`] splits the rows: `groups` blocks of rows per column slice, each
/// `rows_per_group` long. Pure arithmetic, tested without a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BiasPlan {
    /// Row groups (rows of the partial-sum buffer).
    pub groups: u64,
    /// Rows per group (the last may be shorter).
    pub rows_per_group: u64,
    /// Column-slice blocks.
    pub slices: u32,
}

impl BiasPlan {
    /// Enough blocks to fill `cus` compute units, groups of at least 32 rows.
    pub fn new(rows: usize, cols: usize, elem_bytes: usize, cus: u32) -> BiasPlan {
        let per_block = u64::from(BLOCK) * (16 / elem_bytes.max(1)) as u64;
        let slices = (cols as u64).div_ceil(per_block).max(1);
        let want = (u64::from(cus.max(1)) * 4).div_ceil(slices).max(1);
        let groups = want.min((rows as u64).div_ceil(32)).max(1);
        let rows_per_group = (rows as u64).div_ceil(groups).max(1);
        BiasPlan {
            groups: (rows as u64).div_ceil(rows_per_group).max(1),
            rows_per_group,
            slices: u32::try_from(slices).unwrap_or(u32::MAX),
        }
    }
}

/// [`BiasBackward`] on `stream`: [`crate::cpu::bias_backward`]'s semantics (f32 sums). Two
/// stages without atomics: bit-identical run to run on one device. Takes `groups × cols` f32 of
/// scratch from the device's allocator (stream-ordered with the caching allocator, the
/// default). Queues the work; no host sync.
pub fn bias_backward<T: DeviceElement>(
    stream: &Stream,
    a: BiasBackward<'_, OnDevice, T>,
) -> Result<(), OpError> {
    a.validate()?;
    let p = a.params;
    if p.cols > i32::MAX as usize {
        return Err(invalid(
            BiasParams::OP,
            "cols",
            p.cols,
            "must be at most 2^31 − 1 on the device",
        )
        .into());
    }
    let dout = ptr(stream, "dout", a.dout)?;
    let dbias = ptr(stream, "dbias", &*a.dbias)?;
    if p.cols == 0 {
        return Ok(());
    }
    let plan = BiasPlan::new(
        p.rows,
        p.cols,
        std::mem::size_of::<T>(),
        stream.device().compute_units(),
    );
    let partial = DeviceBuffer::<f32>::alloc(stream, plan.groups as usize * p.cols)?;
    let part = ptr(stream, "partial", &partial)?;
    let f = kernel::<T>(stream, SOURCE, names::BIAS_BWD_PARTIAL)?;
    let mut b = stream.launch_builder(&f);
    b.value(dout)
        .value(part)
        .value(p.rows as i64)
        .value(p.cols as i32)
        .value(plan.rows_per_group as i64);
    // SAFETY: bias_bwd_partial_<T>(const T* dout, float* partial, int64_t rows, int cols,
    // int64_t rows_per_group): dout holds rows·cols elements (validated), partial
    // groups·cols floats (allocated above); grid (slices, groups) covers every column and row.
    unsafe { b.launch(&cfg((plan.slices, plan.groups as u32), BLOCK)) }?;
    let f = kernel::<T>(stream, SOURCE, names::BIAS_BWD_FINAL)?;
    let mut b = stream.launch_builder(&f);
    b.value(part)
        .value(plan.groups as i64)
        .value(p.cols as i32)
        .value(dbias)
        .value(i32::from(p.accumulate));
    let grid = u32::try_from((p.cols as u64).div_ceil(u64::from(BLOCK))).unwrap_or(u32::MAX);
    // SAFETY: bias_bwd_final_<T>(const float* partial, int64_t groups, int cols, T* dbias,
    // int accumulate): one thread per column; dbias holds cols elements (validated).
    unsafe { b.launch(&cfg((grid, 1), BLOCK)) }?;
    drop(partial);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::BiasPlan;

    #[test]
    fn plans_cover_every_row_and_column() {
        for (rows, cols, bytes, cus) in [
            (0, 5, 4, 60),
            (1, 5, 4, 60),
            (37, 19, 2, 4),
            (8192, 2304, 2, 64),
            (100_000, 768, 4, 1),
        ] {
            let p = BiasPlan::new(rows, cols, bytes, cus);
            assert!(
                p.groups * p.rows_per_group >= rows as u64,
                "{rows} {cols}: {p:?}"
            );
            assert!(
                (p.groups - 1) * p.rows_per_group < rows.max(1) as u64,
                "no empty group: {p:?}"
            );
            let per_block = 256 * (16 / bytes) as u64;
            assert!(u64::from(p.slices) * per_block >= cols as u64, "{p:?}");
            assert!(p.rows_per_group >= 1 && p.groups >= 1);
        }
        // Enough blocks to fill the device when the rows allow it.
        let p = BiasPlan::new(8192, 768, 2, 64);
        assert!(u64::from(p.slices) * p.groups >= 64, "{p:?}");
    }
}
