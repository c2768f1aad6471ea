//! The encoder on the device (`kernels/encoder.hip`), with the CPU reference's names and
//! argument structs ([`crate::cpu::encoder_forward`] / [`crate::cpu::encoder_backward`]) plus the
//! stream.
//!
//! Bad token ids: the host never reads the tokens (that would be a sync). The kernels never use
//! a bad id as an index and, when the argument struct carries an `error` flag, set it to the
//! first bad row `b·seq + t` ([`NO_ERROR`] when all are valid); read it with the next read-back
//! and look the value up in the tokens. The forward writes NaN into a bad row of `out`; the
//! backward leaves bad rows out of `dwte`.
//!
//! Never run on a GPU: compiled and statically checked for gfx906; the device tests run on
//! hip-emu (the CPU-emulated HIP device, `tests/device_trainops.rs`).

use super::{EncoderBackward, EncoderForward, EncoderParams};
use crate::embedded::kernel_names::encoder as names;
use crate::ops::launch::{grid_for, kernel, kernel_named, ptr};
use crate::ops::OpError;
use crate::params::{invalid, DeviceElement, OnDevice, ShapeError};
use hip_rt::memory::buffer::{DeviceBuffer, DeviceViewMut};
use hip_rt::{DevicePtr, LaunchConfig, Stream};

const SOURCE: &str = "encoder";
/// Threads per block the kernels are compiled for (`__launch_bounds__`).
const BLOCK: u32 = 256;
/// Blocks per compute unit for the grid-stride kernels.
const BLOCKS_PER_CU: u32 = 8;

/// The `error` flag's value when every token id is valid.
pub const NO_ERROR: u32 = u32::MAX;

/// Device limits: 32-bit `C`, `seq`, `vocab`; rows (`batch·seq`) such that the backward's grid
/// of one block per row stays under 2^32 work-items (AMD's limit per grid dimension).
fn check_limits(p: &EncoderParams) -> Result<(), ShapeError> {
    let max = i32::MAX as usize;
    let max_rows = (u32::MAX / BLOCK) as usize;
    for (name, v, limit) in [
        ("channels", p.channels, max),
        ("seq", p.seq, max),
        ("vocab", p.vocab, max),
        ("batch·seq", p.batch.saturating_mul(p.seq), max_rows),
    ] {
        if v > limit {
            return Err(invalid(
                EncoderParams::OP,
                name,
                format!("{v} (device limit {limit})"),
                "exceeds what the device kernels index; split the batch",
            ));
        }
    }
    Ok(())
}

/// Elements per 16-byte pack of T (4 f32, 8 f16/bf16): the kernels' vector width.
fn pack<T>() -> u64 {
    (16 / std::mem::size_of::<T>()) as u64
}

fn error_ptr(
    stream: &Stream,
    error: Option<&mut dyn DeviceViewMut<u32>>,
) -> Result<DevicePtr, OpError> {
    match error {
        None => Ok(DevicePtr::NULL),
        Some(e) => {
            stream.memset_bytes(e, 0xff)?;
            ptr(stream, "error", &*e)
        }
    }
}

fn config(grid: (u32, u32), block: u32) -> LaunchConfig {
    LaunchConfig {
        grid: (grid.0, grid.1, 1),
        block: (block, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// [`EncoderForward`] on `stream`: same semantics and validation as
/// [`crate::cpu::encoder_forward`] except for bad token ids (see the module docs). Queues the
/// work (and the asynchronous reset of `error`); no host sync.
pub fn encoder_forward<T: DeviceElement>(
    stream: &Stream,
    a: EncoderForward<'_, OnDevice, T>,
) -> Result<(), OpError> {
    a.validate()?;
    let p = a.params;
    check_limits(&p)?;
    let ptrs = [
        ptr(stream, "tokens", a.tokens)?,
        ptr(stream, "wte", a.wte)?,
        ptr(stream, "wpe", a.wpe)?,
        ptr(stream, "out", &*a.out)?,
    ];
    let error = error_ptr(stream, a.error)?;
    let rows = (p.batch * p.seq) as u64;
    if rows == 0 {
        return Ok(());
    }
    let f = kernel::<T>(stream, SOURCE, names::ENCODER_FWD)?;
    let packs = rows * (p.channels as u64).div_ceil(pack::<T>());
    let grid = grid_for(
        packs,
        u64::from(BLOCK),
        stream.device().compute_units(),
        BLOCKS_PER_CU,
    );
    let mut b = stream.launch_builder(&f);
    for q in ptrs {
        b.value(q);
    }
    b.value(rows as i64)
        .value(p.seq as i32)
        .value(p.channels as i32)
        .value(p.vocab as i32)
        .value(error);
    // SAFETY: encoder_fwd_<T>'s parameters in order (tokens, wte, wpe, out: device pointers;
    // rows: int64_t; seq, C, vocab: int; error: unsigned* or null). Every buffer holds exactly
    // the elements the params need (validated; the dimensions fit an int, check_limits), lives
    // on the stream's device and is recorded on the stream; token ids are range-checked by the
    // kernel before any use as an index.
    unsafe { b.launch(&config((grid, 1), BLOCK)) }?;
    Ok(())
}

/// [`EncoderBackward`] on `stream`: same semantics and validation as
/// [`crate::cpu::encoder_backward`] except for bad token ids (see the module docs); with
/// `accumulate = false`, `dwte` and `dwpe` are zeroed first (asynchronous memsets).
///
/// Deterministic without float atomics: each vocabulary row is summed by one block in row
/// order (see `kernels/encoder.hip`), so the result is bit-identical run to run. Takes 2·B·T
/// `int` of scratch from the device's allocator (stream-ordered with the caching allocator, the
/// default; with the opt-in direct allocator its free waits for the device). Queues the work.
pub fn encoder_backward<T: DeviceElement>(
    stream: &Stream,
    a: EncoderBackward<'_, OnDevice, T>,
) -> Result<(), OpError> {
    a.validate()?;
    let p = a.params;
    check_limits(&p)?;
    let (tokens, dout) = (
        ptr(stream, "tokens", a.tokens)?,
        ptr(stream, "dout", a.dout)?,
    );
    if !p.accumulate {
        stream.memset_zero(&mut *a.dwte)?;
        stream.memset_zero(&mut *a.dwpe)?;
    }
    let (dwte, dwpe) = (
        ptr(stream, "dwte", &*a.dwte)?,
        ptr(stream, "dwpe", &*a.dwpe)?,
    );
    let error = error_ptr(stream, a.error)?;
    let rows = (p.batch * p.seq) as u64;
    if rows == 0 {
        return Ok(());
    }
    let next = DeviceBuffer::<i32>::alloc(stream, rows as usize)?;
    let first = DeviceBuffer::<i32>::alloc(stream, rows as usize)?;
    let (next_p, first_p) = (ptr(stream, "next", &next)?, ptr(stream, "first", &first)?);
    let cus = stream.device().compute_units();
    let c = p.channels as u64;

    let links = kernel_named(stream, SOURCE, names::ENCODER_LINKS_I32)?;
    let mut b = stream.launch_builder(&links);
    b.value(tokens)
        .value(rows as i64)
        .value(p.vocab as i32)
        .value(next_p)
        .value(first_p)
        .value(error);
    let grid = u32::try_from(rows.div_ceil(u64::from(BLOCK))).unwrap_or(u32::MAX);
    // SAFETY: encoder_links_i32's parameters in order (tokens: const int*; rows: int64_t;
    // vocab: int; next, first: int* of `rows` elements, allocated above; error: unsigned* or
    // null). One thread per row (grid·BLOCK ≥ rows; rows ≤ 2^31 − 1).
    unsafe { b.launch(&config((grid, 1), BLOCK)) }?;

    let f = kernel::<T>(stream, SOURCE, names::ENCODER_BWD_DWTE)?;
    let mut b = stream.launch_builder(&f);
    b.value(dout)
        .value(tokens)
        .value(next_p)
        .value(first_p)
        .value(dwte)
        .value(p.channels as i32);
    let slices = u32::try_from(c.div_ceil(u64::from(BLOCK) * pack::<T>())).unwrap_or(u32::MAX);
    // SAFETY: encoder_bwd_dwte_<T>'s parameters in order (dout, tokens, next, first, dwte:
    // device pointers; C: int). Block (r, y) handles row r (grid.x = rows ≤ 2^31 − 1) and the
    // channel slice y; only rows with first[r] = 1 (valid tokens, checked by the links kernel)
    // index dwte.
    unsafe { b.launch(&config((rows as u32, slices), BLOCK)) }?;

    let f = kernel::<T>(stream, SOURCE, names::ENCODER_BWD_DWPE)?;
    let mut b = stream.launch_builder(&f);
    b.value(dout)
        .value(dwpe)
        .value(p.batch as i64)
        .value(p.seq as i32)
        .value(p.channels as i32);
    let packs = p.seq as u64 * c.div_ceil(pack::<T>());
    let grid = grid_for(packs, u64::from(BLOCK), cus, BLOCKS_PER_CU);
    // SAFETY: encoder_bwd_dwpe_<T>'s parameters in order (dout, dwpe: device pointers; batch:
    // int64_t; seq, C: int); dwpe has at least seq·C elements (seq ≤ positions, validated).
    unsafe { b.launch(&config((grid, 1), BLOCK)) }?;
    // `next` and `first` go back to the stream-ordered allocator after the queued kernels.
    drop((next, first));
    Ok(())
}
