//! RMS norm on the device (`kernels/rmsnorm.hip`), with the CPU reference's names and argument
//! structs plus the stream. The launch geometry is layer norm's [`RowPlan`] (one wave per short
//! row, one block per long row; any plan is correct, the kernels pick cached or streamed rows
//! from it).
//!
//! Never run on a GPU: the kernels are compiled and statically checked for gfx906, and the
//! device tests ran on hip-emu (the CPU-emulated device) only.

use super::{ResidualRmsNormForward, RmsNormBackward, RmsNormForward, RmsNormParams};
use crate::embedded::kernel_names::rmsnorm as names;
use crate::ops::launch::{kernel, ptr};
use crate::ops::{LayerNormParams, OpError, RowPlan, MAX_COLS};
use crate::params::{checked_len, DeviceElement, OnDevice, ShapeError};
use hip_rt::memory::buffer::DeviceBuffer;
use hip_rt::{DevicePtr, LaunchConfig, Stream};

const SOURCE: &str = "rmsnorm";

/// The row geometry of layer norm for this shape (RMS norm's rows are laid out the same way).
fn row_shape(p: &RmsNormParams) -> Result<LayerNormParams, ShapeError> {
    if p.cols > MAX_COLS {
        return Err(ShapeError::Invalid {
            op: RmsNormParams::OP,
            name: "cols",
            value: p.cols.to_string(),
            reason: "must be at most 2^30 on the device (32-bit row offsets)",
        });
    }
    Ok(LayerNormParams {
        rows: p.rows,
        cols: p.cols,
        eps: p.eps,
    })
}

fn limits(stream: &Stream) -> (u32, u32, u32) {
    let d = stream.device();
    (
        d.wavefront_size(),
        d.compute_units(),
        d.max_threads_per_block(),
    )
}

fn config(plan: &RowPlan) -> LaunchConfig {
    LaunchConfig {
        grid: (plan.grid, 1, 1),
        block: (plan.block, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Launches forward kernel `name` with `ptrs` then `(rows: int64_t, C: int, eps: float,
/// row_per_wave: int)`. Nothing for 0 rows.
///
/// # Safety
/// `ptrs` must be exactly the kernel's pointer parameters, in order, each into a live allocation
/// on the stream's device holding the elements `p` needs, and `p.cols` at most [`MAX_COLS`].
unsafe fn launch_forward<T: DeviceElement>(
    stream: &Stream,
    p: &RmsNormParams,
    name: [&'static str; 3],
    ptrs: &[DevicePtr],
) -> Result<(), OpError> {
    let shape = row_shape(p)?;
    if p.rows == 0 {
        return Ok(());
    }
    let f = kernel::<T>(stream, SOURCE, name)?;
    let (wave, cus, max) = limits(stream);
    let plan = RowPlan::forward(&shape, wave, cus, max)?;
    let mut b = stream.launch_builder(&f);
    for q in ptrs {
        b.value(*q);
    }
    b.value(p.rows as i64)
        .value(p.cols as i32)
        .value(p.eps)
        .value(i32::from(plan.row_per_wave));
    // SAFETY: the kernel's parameters in order (the caller's pointers, then rows: int64_t,
    // C: int (fits: cols ≤ MAX_COLS), eps: float, row_per_wave: int); every pointer is a live
    // allocation on the stream's device holding what the shape needs (this function's contract).
    unsafe { b.launch(&config(&plan)) }?;
    Ok(())
}

/// [`RmsNormForward`] on `stream`: writes `y` and the per-row `rstd` (f32). Same semantics and
/// validation as [`crate::cpu::rmsnorm_forward`]; f32 math. Queues the work; no host sync.
pub fn rmsnorm_forward<T: DeviceElement>(
    stream: &Stream,
    a: RmsNormForward<'_, OnDevice, T>,
) -> Result<(), OpError> {
    a.validate()?;
    let ptrs = [
        ptr(stream, "x", a.x)?,
        ptr(stream, "weight", a.weight)?,
        ptr(stream, "y", &*a.y)?,
        ptr(stream, "rstd", &*a.rstd)?,
    ];
    // SAFETY: rmsnorm_fwd_<T> takes (x, weight, y, rstd) then the row arguments; validate()
    // checked every length, `ptr` the device of each buffer; launch_forward checks cols.
    unsafe { launch_forward::<T>(stream, &a.params, names::RMSNORM_FWD, &ptrs) }
}

/// [`ResidualRmsNormForward`] on `stream` in one launch (`rmsnorm_fwd_residual_<T>`): writes
/// `residual = a + b` rounded to T and normalises that stored residual (the CPU reference's
/// semantics). Queues the work; no host sync.
pub fn residual_rmsnorm_forward<T: DeviceElement>(
    stream: &Stream,
    a: ResidualRmsNormForward<'_, OnDevice, T>,
) -> Result<(), OpError> {
    a.validate()?;
    let ptrs = [
        ptr(stream, "a", a.a)?,
        ptr(stream, "b", a.b)?,
        ptr(stream, "weight", a.weight)?,
        ptr(stream, "residual", &*a.residual)?,
        ptr(stream, "y", &*a.y)?,
        ptr(stream, "rstd", &*a.rstd)?,
    ];
    // SAFETY: rmsnorm_fwd_residual_<T> takes (a, b, weight, residual, y, rstd) then the row
    // arguments; validate() checked every length, `ptr` the device of each buffer.
    unsafe { launch_forward::<T>(stream, &a.params, names::RMSNORM_FWD_RESIDUAL, &ptrs) }
}

/// [`RmsNormBackward`] on `stream`, from the saved `rstd`: writes `dx` and `dweight`, or with
/// `accumulate` adds into them (in f32, one rounding to `T`). Same semantics and validation as
/// [`crate::cpu::rmsnorm_backward`]. dweight is summed in a fixed order (no atomics): bit-identical
/// run to run on one device. Takes `groups × cols` f32 of scratch for the partial column sums from
/// the device's allocator (stream-ordered with the caching allocator, the default).
pub fn rmsnorm_backward<T: DeviceElement>(
    stream: &Stream,
    a: RmsNormBackward<'_, OnDevice, T>,
) -> Result<(), OpError> {
    a.validate()?;
    let p = a.params;
    let shape = row_shape(&p)?;
    let row_ptrs = [
        ptr(stream, "x", a.x)?,
        ptr(stream, "weight", a.weight)?,
        ptr(stream, "dy", a.dy)?,
        ptr(stream, "rstd", a.rstd)?,
        ptr(stream, "dx", &*a.dx)?,
    ];
    let pdw = ptr(stream, "dweight", &*a.dweight)?;
    let stage1 = kernel::<T>(stream, SOURCE, names::RMSNORM_BWD)?;
    let stage2 = kernel::<T>(stream, SOURCE, names::RMSNORM_BWD_DW)?;
    let (wave, cus, max) = limits(stream);
    let plan = RowPlan::backward(&shape, wave, cus, max)?;
    let groups = if p.rows == 0 { 0 } else { plan.groups };
    let partial_len = checked_len(RmsNormParams::OP, "partial", &[groups as usize, p.cols])?;
    let partial: DeviceBuffer<f32> = DeviceBuffer::alloc(stream, partial_len)?;
    if groups > 0 {
        let mut b = stream.launch_builder(&stage1);
        for q in row_ptrs {
            b.value(q);
        }
        b.value(partial.device_ptr())
            .value(p.rows as i64)
            .value(p.cols as i32)
            .value(i32::from(plan.row_per_wave))
            .value(i32::from(a.accumulate));
        // SAFETY: rmsnorm_bwd_<T>'s parameters in order (x, weight, dy, rstd, dx, partial:
        // pointers; rows: int64_t; C: int, ≤ MAX_COLS; row_per_wave: int; accumulate: int);
        // lengths validated; `partial` holds groups × cols f32 for the plan's `groups` row groups
        // and is freed stream-ordered after this work.
        unsafe { b.launch(&config(&plan)) }?;
    }
    let cfg = LaunchConfig::for_num_elems_with_block(p.cols as u64, 256, stage2.limits())
        .map_err(hip_rt::Error::from)?;
    let mut b = stream.launch_builder(&stage2);
    b.value(partial.device_ptr())
        .value(groups as i64)
        .value(p.cols as i32)
        .value(pdw)
        .value(i32::from(a.accumulate));
    // SAFETY: rmsnorm_bwd_dw_<T>'s parameters (partial: pointer; groups: int64_t; C: int;
    // dweight: pointer; accumulate: int); `partial` has `groups` rows of cols written by stage 1
    // on this stream; dweight holds cols elements.
    unsafe { b.launch(&cfg) }?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_rows_are_rejected_with_the_op_name() {
        let p = RmsNormParams {
            rows: 1,
            cols: MAX_COLS + 1,
            eps: 1e-6,
        };
        let e = row_shape(&p).unwrap_err();
        assert!(
            e.to_string().contains("rmsnorm") && e.to_string().contains("2^30"),
            "{e}"
        );
        assert!(row_shape(&RmsNormParams {
            cols: MAX_COLS,
            ..p
        })
        .is_ok());
    }
}
