//! The fused classifier on the device (`kernels/crossentropy.hip`), with the CPU reference's
//! name and argument struct ([`crate::cpu::softmax_cross_entropy`]) plus the stream.
//!
//! Three kernels, no host sync: the count of non-ignored rows (into 4 bytes of scratch), one
//! block per row for the losses and the in-place gradient, and, when `loss` is given, the mean.
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
use hip_rt::{DevicePtr, LaunchConfig, Stream};

const SOURCE: &str = "crossentropy";
/// Threads per block the kernels are compiled for (`__launch_bounds__`).
const BLOCK: u32 = 512;
/// Row blocks per compute unit (the kernel walks rows grid-stride).
const BLOCKS_PER_CU: u32 = 16;

fn config(grid: u32) -> LaunchConfig {
    LaunchConfig {
        grid: (grid, 1, 1),
        block: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn check_limits(p: &CrossEntropyParams) -> Result<(), ShapeError> {
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
/// [`crate::cpu::softmax_cross_entropy`] (f32 math; the mean goes to `loss` on the device
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
    let loss = match a.loss {
        Some(l) => ptr(stream, "loss", &*l)?,
        None => DevicePtr::NULL,
    };
    let error = match a.error {
        Some(e) => {
            stream.memset_bytes(e, 0xff)?;
            ptr(stream, "error", &*e)?
        }
        None => DevicePtr::NULL,
    };
    let count_buf = DeviceBuffer::<f32>::alloc(stream, 1)?;
    let count = ptr(stream, "count", &count_buf)?;
    let rows = p.rows as i64;

    let f = kernel_named(stream, SOURCE, names::CROSSENTROPY_COUNT_I32)?;
    let mut b = stream.launch_builder(&f);
    b.value(targets).value(rows).value(count);
    // SAFETY: crossentropy_count_i32(const int* targets, int64_t rows, float* count): targets
    // holds `rows` ints (validated), count one float (allocated above); one block.
    unsafe { b.launch(&config(1)) }?;

    if p.rows > 0 {
        let f = kernel::<T>(stream, SOURCE, names::CROSSENTROPY)?;
        let grid = grid_for(
            p.rows as u64,
            1,
            stream.device().compute_units(),
            BLOCKS_PER_CU,
        );
        let mut b = stream.launch_builder(&f);
        b.value(logits)
            .value(targets)
            .value(losses)
            .value(count)
            .value(rows)
            .value(p.vocab as i32)
            .value(p.padded_vocab as i32)
            .value(p.dloss.unwrap_or(0.0))
            .value(i32::from(p.dloss.is_some()))
            .value(error);
        // SAFETY: crossentropy_<T>'s parameters in order (logits: T*, targets: const int*,
        // losses: float*, count: const float*, rows: int64_t, vocab, padded: int, dloss: float,
        // write_grad: int, error: unsigned* or null). logits holds rows·padded_vocab elements,
        // targets and losses `rows` (validated, padded_vocab fits an int); a target is
        // range-checked by the kernel before it indexes a row.
        unsafe { b.launch(&config(grid)) }?;
    }

    if !loss.is_null() {
        let f = kernel_named(stream, SOURCE, names::CROSSENTROPY_MEAN_F32)?;
        let mut b = stream.launch_builder(&f);
        b.value(losses).value(count).value(rows).value(loss);
        // SAFETY: crossentropy_mean_f32(const float* losses, const float* count, int64_t rows,
        // float* mean): losses holds `rows` floats, count and mean one each; one block.
        unsafe { b.launch(&config(1)) }?;
    }
    drop(count_buf);
    Ok(())
}
