//! The fused classifier on the device (`kernels/crossentropy.hip`), with the CPU reference's
//! name and argument struct ([`crate::cpu::softmax_cross_entropy`]) plus the stream.
//!
//! Three kernels, no host sync: the count of non-ignored rows (into 4 bytes of scratch), one
//! block per row for the losses and the in-place gradient, and, when `loss` or `totals` is
//! given, the reduction (mean over the divisor, sum and count added to `totals`). The three
//! launches are `pub(super)` so that the chunked [`super::linear_cross_entropy`] runs them on
//! its row chunks.
//! Bad targets: never used as an index; with `error`, the first bad row is reported there
//! (`u32::MAX` when none) for the caller's next read-back; such a row gets loss NaN and, with
//! `dloss`, a NaN gradient row.
//!
//! Never run on a GPU: compiled and statically checked for gfx906; the device tests run on
//! hip-emu (the CPU-emulated HIP device, `tests/device_trainops.rs`).

use super::{CrossEntropyParams, SoftmaxCrossEntropy};
use crate::embedded::kernel_names::crossentropy as names;
use crate::ops::launch::{grid_for, kernel, kernel_named, ptr};
use crate::ops::OpError;
use crate::params::{invalid, DeviceElement, OnDevice, ShapeError};
use hip_rt::memory::buffer::DeviceBuffer;
use hip_rt::{DevicePtr, DeviceViewMut, LaunchConfig, Stream};

const SOURCE: &str = "crossentropy";
/// Threads per block the kernels are compiled for (`__launch_bounds__`).
const BLOCK: u32 = 512;
/// Row blocks per compute unit (the kernel walks rows grid-stride).
const BLOCKS_PER_CU: u32 = 16;

pub(super) fn config(grid: u32) -> LaunchConfig {
    LaunchConfig {
        grid: (grid, 1, 1),
        block: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

pub(super) fn check_limits(p: &CrossEntropyParams) -> Result<(), ShapeError> {
    if p.padded_vocab > i32::MAX as usize || p.rows > (u32::MAX - 1) as usize {
        return Err(invalid(
            CrossEntropyParams::OP,
            "padded_vocab",
            format!("{} (rows = {})", p.padded_vocab, p.rows),
            "the device needs padded_vocab ≤ 2^31 − 1 and rows < 2^32 − 1",
        ));
    }
    Ok(())
}

/// [`SoftmaxCrossEntropy`] on `stream`: same semantics and validation as
/// [`crate::cpu::softmax_cross_entropy`] (f32 math; the loss goes to `loss` on the device
/// instead of being returned) except for bad targets (see the module docs). Takes 4 bytes of
/// scratch from the device's allocator (stream-ordered with the caching allocator, the
/// default). Queues the work; no host sync.
pub fn softmax_cross_entropy<T: DeviceElement>(
    stream: &Stream,
    a: SoftmaxCrossEntropy<'_, OnDevice, T>,
) -> Result<(), OpError> {
    a.validate()?;
    let p = a.params;
    check_limits(&p)?;
    let logits = ptr(stream, "logits", &*a.logits)?;
    let targets = ptr(stream, "targets", a.targets)?;
    let losses = ptr(stream, "losses", &*a.losses)?;
    let loss = opt_ptr(stream, "loss", a.loss)?;
    let totals = opt_ptr(stream, "totals", a.totals)?;
    let error = error_ptr(stream, a.error)?;
    let count_buf = DeviceBuffer::<f32>::alloc(stream, 1)?;
    let count = ptr(stream, "count", &count_buf)?;
    launch_count(stream, targets, p.rows, count)?;
    let rows = RowsPtrs {
        logits,
        targets,
        losses,
        count,
        error,
        first_row: 0,
    };
    launch_rows::<T>(stream, &p, rows)?;
    launch_reduce(stream, &p, losses, count, loss, totals)?;
    drop(count_buf);
    Ok(())
}

/// The device address of an optional tensor (null when absent).
pub(super) fn opt_ptr<T: hip_rt::Element>(
    stream: &Stream,
    name: &'static str,
    v: Option<&mut dyn DeviceViewMut<T>>,
) -> Result<DevicePtr, OpError> {
    match v {
        Some(v) => ptr(stream, name, &*v),
        None => Ok(DevicePtr::NULL),
    }
}

/// The optional error flag, set to `u32::MAX` (no bad row yet) when given.
pub(super) fn error_ptr(
    stream: &Stream,
    error: Option<&mut dyn DeviceViewMut<u32>>,
) -> Result<DevicePtr, OpError> {
    match error {
        Some(e) => {
            stream.memset_bytes(e, 0xff)?;
            ptr(stream, "error", &*e)
        }
        None => Ok(DevicePtr::NULL),
    }
}

/// `*count` = the targets of `targets[..rows]` that are not ignored (one block).
pub(super) fn launch_count(
    stream: &Stream,
    targets: DevicePtr,
    rows: usize,
    count: DevicePtr,
) -> Result<(), OpError> {
    let f = kernel_named(stream, SOURCE, names::CROSSENTROPY_COUNT_I32)?;
    let mut b = stream.launch_builder(&f);
    b.value(targets).value(rows as i64).value(count);
    // SAFETY: crossentropy_count_i32(const int* targets, int64_t rows, float* count): the
    // callers pass targets holding `rows` ints (validated) and count one float; one block.
    unsafe { b.launch(&config(1)) }?;
    Ok(())
}

/// The device addresses of one [`launch_rows`] call.
pub(super) struct RowsPtrs {
    /// `T` logits `[rows, padded_vocab]`, overwritten by the gradient with `dloss`.
    pub logits: DevicePtr,
    /// `i32` targets `[rows]`.
    pub targets: DevicePtr,
    /// `f32` per-row losses `[rows]`.
    pub losses: DevicePtr,
    /// One `f32`: the count of counted targets the gradient divides by without a divisor.
    pub count: DevicePtr,
    /// One `u32` error flag or null.
    pub error: DevicePtr,
    /// Index of row 0 in the caller's tensor (a chunk's offset), for the error flag.
    pub first_row: usize,
}

/// Per-row losses and, with `p.dloss`, the in-place gradient of `p.rows` rows.
pub(super) fn launch_rows<T: DeviceElement>(
    stream: &Stream,
    p: &CrossEntropyParams,
    at: RowsPtrs,
) -> Result<(), OpError> {
    if p.rows == 0 {
        return Ok(());
    }
    let f = kernel::<T>(stream, SOURCE, names::CROSSENTROPY)?;
    let grid = grid_for(
        p.rows as u64,
        1,
        stream.device().compute_units(),
        BLOCKS_PER_CU,
    );
    let mut b = stream.launch_builder(&f);
    b.value(at.logits)
        .value(at.targets)
        .value(at.losses)
        .value(at.count)
        .value(p.rows as i64)
        .value(p.vocab as i32)
        .value(p.padded_vocab as i32)
        .value(p.dloss.unwrap_or(0.0))
        .value(i32::from(p.dloss.is_some()))
        .value(p.divisor.unwrap_or(0.0))
        .value(at.first_row as i64)
        .value(at.error);
    // SAFETY: crossentropy_<T>'s parameters in order (logits: T*, targets: const int*,
    // losses: float*, count: const float*, rows: int64_t, vocab, padded: int, dloss: float,
    // write_grad: int, divisor: float (0: use *count), first_row: int64_t, error: unsigned* or
    // null). The callers
    // pass logits holding rows·padded_vocab elements, targets and losses `rows` (validated,
    // padded_vocab fits an int: check_limits); a target is range-checked by the kernel before
    // it indexes a row.
    unsafe { b.launch(&config(grid)) }?;
    Ok(())
}

/// `*loss` = Σ losses / divisor (when `loss` is not null) and `totals += (Σ losses, *count)`
/// (when `totals` is not null), over `p.rows` losses; nothing when both are null.
pub(super) fn launch_reduce(
    stream: &Stream,
    p: &CrossEntropyParams,
    losses: DevicePtr,
    count: DevicePtr,
    loss: DevicePtr,
    totals: DevicePtr,
) -> Result<(), OpError> {
    if loss.is_null() && totals.is_null() {
        return Ok(());
    }
    let f = kernel_named(stream, SOURCE, names::CROSSENTROPY_MEAN_F32)?;
    let mut b = stream.launch_builder(&f);
    b.value(losses)
        .value(count)
        .value(p.rows as i64)
        .value(p.divisor.unwrap_or(0.0))
        .value(loss)
        .value(totals);
    // SAFETY: crossentropy_mean_f32(const float* losses, const float* count, int64_t rows,
    // float divisor, float* mean or null, float* totals or null): the callers pass losses
    // holding `rows` floats, count and mean one float each, totals two; one block.
    unsafe { b.launch(&config(1)) }?;
    Ok(())
}
