//! Layer norm forward and backward on the device (`kernels/layernorm.hip`), with the CPU
//! reference's names and argument structs ([`crate::cpu::layernorm_forward`] /
//! [`crate::cpu::layernorm_backward`]) plus the stream.
//!
//! Also the one-launch residual + layer norm forward (`layernorm_fwd_residual_<T>`) behind
//! [`super::residual_layernorm_forward_device`].
//!
//! Never run on a GPU: the launch geometry is unit-tested, the kernels are compiled and
//! statically checked for gfx906, and the device tests ran on hip-emu (the CPU-emulated
//! device) only.

use super::{LayerNormBackward, LayerNormForward, LayerNormParams, ResidualLayerNormForward};
use crate::embedded::kernel_names::layernorm as names;
use crate::ops::launch::{grid_for, kernel, ptr};
use crate::ops::OpError;
use crate::params::{DeviceElement, OnDevice, ShapeError};
use hip_rt::memory::buffer::DeviceBuffer;
use hip_rt::{DevicePtr, LaunchConfig, Stream};

const SOURCE: &str = "layernorm";

/// Largest `cols` the kernels index with 32-bit row offsets (with room for a block of slots).
pub const MAX_COLS: usize = 1 << 30;

/// Elements a thread keeps in registers: forward 4 slots of 4, backward 1 slot of 4 (see the
/// header of `kernels/layernorm.hip`).
const FWD_CACHED_PER_THREAD: u64 = 16;
const BWD_CACHED_PER_THREAD: u64 = 4;
/// Threads per block the row kernels are compiled for (`__launch_bounds__`).
const MAX_BLOCK: u32 = 1024;
/// Threads per block in row-per-wave mode.
const WAVE_MODE_BLOCK: u32 = 256;
/// Elements per thread of the wide backward (`layernorm_bwd_wide_<T>`: 2 slots of 4), and the
/// row lengths it takes: above what the one-slot backward keeps in registers, up to 8 per
/// thread of a full block.
const BWD_WIDE_PER_THREAD: u64 = 8;
/// Elements per vector slot: the wide backward needs `cols % 4 == 0` and every tensor aligned
/// to 4 elements.
const SLOT: usize = 4;

/// How one layer norm kernel is launched: pure arithmetic on the shape and the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowPlan {
    /// One wave per row (several rows per block) instead of one block per row.
    pub row_per_wave: bool,
    /// Threads per block.
    pub block: u32,
    /// Blocks.
    pub grid: u32,
    /// Row groups in the grid (waves or blocks): the rows of the backward's partial buffer.
    pub groups: u64,
}

impl RowPlan {
    /// `cached_per_thread` elements per thread fit in registers; `blocks_per_cu` caps the grid
    /// (the kernels walk rows grid-stride).
    fn new(
        shape: &LayerNormParams,
        (wave, cus, max_threads): (u32, u32, u32),
        (cached_per_thread, blocks_per_cu): (u64, u32),
    ) -> Result<RowPlan, ShapeError> {
        if !(1..=MAX_BLOCK).contains(&wave) {
            return Err(ShapeError::Invalid {
                op: LayerNormParams::OP,
                name: "wavefront size",
                value: wave.to_string(),
                reason: "must be 1..=1024: a row group is one wave inside a block of at most \
                         1024 threads (the device reported an impossible wave width)",
            });
        }
        let max_threads = max_threads.clamp(wave, MAX_BLOCK);
        let (rows, cols) = (shape.rows as u64, shape.cols as u64);
        if cols <= u64::from(wave) * cached_per_thread {
            let block = (WAVE_MODE_BLOCK.min(max_threads) / wave).max(1) * wave;
            let per_block = block / wave;
            let grid = grid_for(rows, u64::from(per_block), cus, blocks_per_cu);
            return Ok(RowPlan {
                row_per_wave: true,
                block,
                grid,
                groups: u64::from(grid) * u64::from(per_block),
            });
        }
        let threads = cols.div_ceil(cached_per_thread).div_ceil(u64::from(wave)) * u64::from(wave);
        let block = u32::try_from(threads)
            .unwrap_or(u32::MAX)
            .clamp(wave, max_threads / wave * wave);
        let per_cu = (blocks_per_cu * WAVE_MODE_BLOCK / block).max(1);
        let grid = grid_for(rows, 1, cus, per_cu);
        Ok(RowPlan {
            row_per_wave: false,
            block,
            grid,
            groups: u64::from(grid),
        })
    }

    /// The forward's launch for `shape` on a device with `wave`-wide waves and `cus` compute
    /// units; a wave outside `1..=1024` is a [`ShapeError::Invalid`] naming it.
    pub fn forward(
        shape: &LayerNormParams,
        wave: u32,
        cus: u32,
        max_threads: u32,
    ) -> Result<RowPlan, ShapeError> {
        RowPlan::new(shape, (wave, cus, max_threads), (FWD_CACHED_PER_THREAD, 32))
    }

    /// The backward's first stage: few enough groups that the partial sums stay small, enough
    /// to fill the device. A wave outside `1..=1024` is a [`ShapeError::Invalid`].
    pub fn backward(
        shape: &LayerNormParams,
        wave: u32,
        cus: u32,
        max_threads: u32,
    ) -> Result<RowPlan, ShapeError> {
        RowPlan::new(shape, (wave, cus, max_threads), (BWD_CACHED_PER_THREAD, 4))
    }

    /// The wide backward (`layernorm_bwd_wide_<T>`) for rows too long for the one-slot
    /// backward's registers and at most 8 elements per thread of a block: one block per row
    /// group, the block just big enough for the row. None for other shapes (the launcher also
    /// requires `cols % 4 == 0` and aligned tensors: [`wide_layout_ok`]).
    pub fn backward_wide(
        shape: &LayerNormParams,
        wave: u32,
        cus: u32,
        max_threads: u32,
    ) -> Option<RowPlan> {
        let wave = wave.max(1);
        if wave > MAX_BLOCK {
            // Not a device this kernel can run on; `RowPlan::backward` reports the typed error.
            return None;
        }
        let max_block = max_threads.clamp(wave, MAX_BLOCK) / wave * wave;
        let cols = shape.cols as u64;
        let one_slot = u64::from(max_block) * BWD_CACHED_PER_THREAD;
        if cols <= one_slot || cols > u64::from(max_block) * BWD_WIDE_PER_THREAD {
            return None;
        }
        let block =
            (cols.div_ceil(BWD_WIDE_PER_THREAD).div_ceil(u64::from(wave)) * u64::from(wave)) as u32;
        let per_cu = (4 * WAVE_MODE_BLOCK / block).max(1);
        let grid = grid_for(shape.rows as u64, 1, cus, per_cu);
        Some(RowPlan {
            row_per_wave: false,
            block,
            grid,
            groups: u64::from(grid),
        })
    }

    fn config(&self) -> LaunchConfig {
        LaunchConfig {
            grid: (self.grid, 1, 1),
            block: (self.block, 1, 1),
            shared_mem_bytes: 0,
        }
    }
}

/// The wide backward's layout: whole slots of 4 and every tensor's address aligned to a slot.
pub fn wide_layout_ok(cols: usize, elem_bytes: usize, addrs: &[u64]) -> bool {
    let align = (SLOT * elem_bytes) as u64;
    cols % SLOT == 0 && addrs.iter().all(|a| a % align == 0)
}

fn check_cols(shape: &LayerNormParams) -> Result<(), ShapeError> {
    if shape.cols > MAX_COLS {
        return Err(ShapeError::Invalid {
            op: LayerNormParams::OP,
            name: "cols",
            value: shape.cols.to_string(),
            reason: "must be at most 2^30 on the device (32-bit row offsets)",
        });
    }
    Ok(())
}

/// The device's wave width, compute units and threads per block, as [`RowPlan`] takes them.
fn device_limits(stream: &Stream) -> (u32, u32, u32) {
    let d = stream.device();
    (
        d.wavefront_size(),
        d.compute_units(),
        d.max_threads_per_block(),
    )
}

/// [`LayerNormForward`] on `stream`: writes `y`, and the per-row `mean` and `rstd` (f32). Same
/// semantics and validation as [`crate::cpu::layernorm_forward`]; f32 math (the reference uses
/// f64). Queues the work; no host sync.
pub fn layernorm_forward<T: DeviceElement>(
    stream: &Stream,
    a: LayerNormForward<'_, OnDevice, T>,
) -> Result<(), OpError> {
    a.validate()?;
    let shape = &a.params;
    check_cols(shape)?;
    let ptrs = [
        ptr(stream, "x", a.x)?,
        ptr(stream, "weight", a.weight)?,
        ptr(stream, "bias", a.bias)?,
        ptr(stream, "y", a.y)?,
        ptr(stream, "mean", a.mean)?,
        ptr(stream, "rstd", a.rstd)?,
    ];
    // SAFETY: layernorm_fwd_<T> takes (x, weight, bias, y, mean, rstd) then the row arguments;
    // validate() checked every buffer holds exactly the elements the shape needs, and `ptr`
    // that each lives on the stream's device (the allocator was told the stream uses it).
    unsafe { launch_forward::<T>(stream, shape, names::LAYERNORM_FWD, &ptrs) }
}

/// Launches `<name>_<T>` (a forward kernel) with `ptrs` followed by `(rows: int64_t, C: int,
/// eps: float, row_per_wave: int)` on [`RowPlan::forward`]'s geometry. Nothing for 0 rows.
///
/// # Safety
/// `ptrs` must be exactly the kernel's pointer parameters, in order, each pointing into a live
/// allocation on the stream's device with at least the elements `shape` needs from there, and
/// `check_cols` must have passed (cols fits an int).
unsafe fn launch_forward<T: DeviceElement>(
    stream: &Stream,
    shape: &LayerNormParams,
    name: [&'static str; 3],
    ptrs: &[DevicePtr],
) -> Result<(), OpError> {
    if shape.rows == 0 {
        return Ok(());
    }
    let f = kernel::<T>(stream, SOURCE, name)?;
    let (wave, cus, max) = device_limits(stream);
    let plan = RowPlan::forward(shape, wave, cus, max)?;
    let mut b = stream.launch_builder(&f);
    for p in ptrs {
        b.value(*p);
    }
    b.value(shape.rows as i64)
        .value(shape.cols as i32)
        .value(shape.eps)
        .value(i32::from(plan.row_per_wave));
    // SAFETY: the argument list is the kernel's in order (the caller's pointers, then rows:
    // int64_t, C: int, eps: float, row_per_wave: int; C fits an int by `check_cols`), and every
    // pointer is a live allocation on the stream's device holding the elements the shape needs
    // (this function's contract), so the kernel reads and writes only inside them.
    unsafe { b.launch(&plan.config()) }?;
    Ok(())
}

/// [`ResidualLayerNormForward`] on `stream` in one launch of `layernorm_fwd_residual_<T>`:
/// `residual = a + b` rounded to T, then the forward of that stored residual (mean, rstd f32),
/// the launch geometry of [`layernorm_forward`]. The caller validated the arguments.
pub(super) fn residual_forward<T: DeviceElement>(
    stream: &Stream,
    a: ResidualLayerNormForward<'_, OnDevice, T>,
) -> Result<(), OpError> {
    let shape = &a.params;
    check_cols(shape)?;
    let ptrs = [
        ptr(stream, "a", a.a)?,
        ptr(stream, "b", a.b)?,
        ptr(stream, "weight", a.weight)?,
        ptr(stream, "bias", a.bias)?,
        ptr(stream, "residual", &*a.residual)?,
        ptr(stream, "y", &*a.y)?,
        ptr(stream, "mean", &*a.mean)?,
        ptr(stream, "rstd", &*a.rstd)?,
    ];
    // SAFETY: layernorm_fwd_residual_<T> takes (a, b, weight, bias, residual, y, mean, rstd)
    // then the row arguments; the caller's validate() checked every buffer holds exactly the
    // elements the shape needs, and `ptr` that each lives on the stream's device.
    unsafe { launch_forward::<T>(stream, shape, names::LAYERNORM_FWD_RESIDUAL, &ptrs) }
}

/// [`LayerNormBackward`] on `stream`, from the saved `mean` and `rstd`: writes `dx`, `dweight`
/// and `dbias`, or with `accumulate` adds into them (in f32, one rounding to `T`). Same semantics and validation as
/// [`crate::cpu::layernorm_backward`]. dweight/dbias are summed in a fixed order (no atomics):
/// bit-identical run to run on one device. Takes `groups × 2 × cols` f32 of scratch for the
/// partial sums from the device's allocator (stream-ordered with the caching allocator, the
/// default; with the opt-in direct allocator its free waits for the device).
pub fn layernorm_backward<T: DeviceElement>(
    stream: &Stream,
    a: LayerNormBackward<'_, OnDevice, T>,
) -> Result<(), OpError> {
    a.validate()?;
    let shape = &a.params;
    check_cols(shape)?;
    let row_ptrs = [
        ptr(stream, "x", a.x)?,
        ptr(stream, "weight", a.weight)?,
        ptr(stream, "dy", a.dy)?,
        ptr(stream, "mean", a.mean)?,
        ptr(stream, "rstd", a.rstd)?,
        ptr(stream, "dx", a.dx)?,
    ];
    let (pdw, pdb) = (
        ptr(stream, "dweight", a.dweight)?,
        ptr(stream, "dbias", a.dbias)?,
    );
    let (wave, cus, max) = device_limits(stream);
    let wide = RowPlan::backward_wide(shape, wave, cus, max).filter(|_| {
        let addrs: Vec<u64> = [0, 1, 2, 5].iter().map(|&i| row_ptrs[i].0).collect();
        wide_layout_ok(shape.cols, std::mem::size_of::<T>(), &addrs)
    });
    let stage1 = match wide {
        Some(_) => kernel::<T>(stream, SOURCE, names::LAYERNORM_BWD_WIDE)?,
        None => kernel::<T>(stream, SOURCE, names::LAYERNORM_BWD)?,
    };
    let stage2 = kernel::<T>(stream, SOURCE, names::LAYERNORM_BWD_DWDB)?;
    let plan = match wide {
        Some(plan) => plan,
        None => RowPlan::backward(shape, wave, cus, max)?,
    };
    let groups = if shape.rows == 0 { 0 } else { plan.groups };
    let partial_len = crate::params::checked_len(
        LayerNormParams::OP,
        "partial",
        &[groups as usize, 2, shape.cols],
    )?;
    let partial: DeviceBuffer<f32> = DeviceBuffer::alloc(stream, partial_len)?;
    if groups > 0 {
        let mut b = stream.launch_builder(&stage1);
        for p in row_ptrs {
            b.value(p);
        }
        b.value(partial.device_ptr())
            .value(shape.rows as i64)
            .value(shape.cols as i32);
        if wide.is_none() {
            b.value(i32::from(plan.row_per_wave));
        }
        b.value(i32::from(a.accumulate));
        // SAFETY: layernorm_bwd_<T>'s parameters in order (x, weight, dy, mean, rstd, dx,
        // partial: pointers; rows: int64_t; C: int; row_per_wave: int; accumulate: int), or
        // layernorm_bwd_wide_<T>'s (the same without row_per_wave; cols % 4 == 0, every tensor
        // aligned to 4 elements and cols ≤ 8 × block, as it requires); lengths checked above;
        // `partial` holds groups × 2 × cols f32 for the grid's `groups` row groups and stays
        // allocated on this stream until its work is done (freed stream-ordered on drop).
        unsafe { b.launch(&plan.config()) }?;
    }
    let cfg = LaunchConfig::for_num_elems_with_block(shape.cols as u64, 256, stage2.limits())
        .map_err(hip_rt::Error::from)?;
    let mut b = stream.launch_builder(&stage2);
    b.value(partial.device_ptr())
        .value(groups as i64)
        .value(shape.cols as i32)
        .value(pdw)
        .value(pdb)
        .value(i32::from(a.accumulate));
    // SAFETY: layernorm_bwd_dwdb_<T>'s parameters (partial: pointer; groups: int64_t; C: int;
    // dweight, dbias: pointers; accumulate: int); `partial` has `groups` rows of 2 × cols, written by stage 1 on
    // the same stream; dweight/dbias hold cols elements.
    unsafe { b.launch(&cfg) }?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(rows: usize, cols: usize) -> LayerNormParams {
        LayerNormParams {
            rows,
            cols,
            eps: 1e-5,
        }
    }

    #[test]
    fn forward_uses_a_wave_per_short_row_and_a_block_per_long_row() {
        let p = RowPlan::forward(&shape(1000, 768), 64, 60, 1024).unwrap();
        assert_eq!((p.row_per_wave, p.block), (true, 256));
        assert_eq!(p.grid, 250, "4 rows per block");
        assert_eq!(p.groups, 1000);
        let p = RowPlan::forward(&shape(1000, 1024), 64, 60, 1024).unwrap();
        assert!(p.row_per_wave, "1024 = 64 lanes × 16 cached elements");
        let p = RowPlan::forward(&shape(1000, 1025), 64, 60, 1024).unwrap();
        assert_eq!((p.row_per_wave, p.block), (false, 128));
        let p = RowPlan::forward(&shape(10, 8192), 64, 60, 1024).unwrap();
        assert_eq!((p.row_per_wave, p.block, p.grid), (false, 512, 10));
        let p = RowPlan::forward(&shape(10, 1 << 20), 64, 60, 1024).unwrap();
        assert_eq!(
            p.block, 1024,
            "capped at the launch bound; the kernel streams the row"
        );
    }

    #[test]
    fn wave32_devices_get_a_multiple_of_their_wave() {
        let p = RowPlan::forward(&shape(7, 3), 32, 60, 1024).unwrap();
        assert_eq!(
            (p.row_per_wave, p.block, p.grid, p.groups),
            (true, 256, 1, 8)
        );
        let p = RowPlan::backward(&shape(7, 4095), 32, 60, 1024).unwrap();
        assert_eq!((p.row_per_wave, p.block % 32), (false, 0));
    }

    #[test]
    fn backward_caps_the_groups_and_counts_them() {
        let p = RowPlan::backward(&shape(1 << 20, 256), 64, 60, 1024).unwrap();
        assert_eq!((p.row_per_wave, p.block, p.grid), (true, 256, 240));
        assert_eq!(p.groups, 960);
        let p = RowPlan::backward(&shape(1 << 20, 4096), 64, 60, 1024).unwrap();
        assert_eq!(
            (p.row_per_wave, p.block, p.grid, p.groups),
            (false, 1024, 60, 60)
        );
        let p = RowPlan::backward(&shape(1, 1), 64, 60, 1024).unwrap();
        assert_eq!((p.grid, p.groups), (1, 4));
        let p = RowPlan::backward(&shape(3, 4095), 64, 60, 1024).unwrap();
        assert_eq!((p.block, p.grid), (1024, 3));
    }

    #[test]
    fn the_wide_backward_takes_rows_between_one_and_two_slots_per_thread() {
        assert_eq!(RowPlan::backward_wide(&shape(64, 4096), 64, 60, 1024), None);
        let p = RowPlan::backward_wide(&shape(64, 4100), 64, 60, 1024).unwrap();
        assert_eq!(
            (p.row_per_wave, p.block, p.grid, p.groups),
            (false, 576, 60, 60)
        );
        let p = RowPlan::backward_wide(&shape(3, 8192), 64, 60, 1024).unwrap();
        assert_eq!((p.block, p.grid, p.groups), (1024, 3, 3));
        assert_eq!(RowPlan::backward_wide(&shape(3, 8196), 64, 60, 1024), None);
        // A device limit of 512 threads moves the range down.
        assert!(RowPlan::backward_wide(&shape(3, 3000), 64, 60, 512).is_some());
        assert!(RowPlan::backward_wide(&shape(3, 4100), 64, 60, 512).is_none());
    }

    #[test]
    fn the_wide_layout_needs_whole_slots_and_aligned_tensors() {
        assert!(wide_layout_ok(8192, 4, &[0, 16, 4096]));
        assert!(!wide_layout_ok(8190, 4, &[0, 16]));
        assert!(!wide_layout_ok(8192, 4, &[0, 8]));
        assert!(wide_layout_ok(8192, 2, &[0, 8]));
        assert!(!wide_layout_ok(8192, 2, &[0, 4]));
    }

    #[test]
    fn a_small_device_limit_narrows_the_block() {
        let p = RowPlan::forward(&shape(4, 8192), 64, 60, 256).unwrap();
        assert_eq!(p.block, 256);
    }

    #[test]
    fn an_impossible_wave_width_is_a_typed_error_not_a_panic() {
        for wave in [0, 1025, 2048, u32::MAX] {
            for plan in [RowPlan::forward, RowPlan::backward] {
                for cols in [3, 1 << 20] {
                    let e = plan(&shape(4, cols), wave, 60, 1024).unwrap_err();
                    assert!(
                        matches!(e, ShapeError::Invalid { name: "wavefront size", ref value, .. } if *value == wave.to_string()),
                        "{e}"
                    );
                }
            }
        }
        let p = RowPlan::forward(&shape(4, 1 << 20), 1024, 60, 1024).unwrap();
        assert_eq!(p.block, 1024);
    }

    #[test]
    fn huge_rows_are_rejected_before_any_launch() {
        let e = check_cols(&shape(1, MAX_COLS + 1)).unwrap_err();
        assert!(e.to_string().contains("2^30"), "{e}");
        assert!(check_cols(&shape(1, MAX_COLS)).is_ok());
    }
}
