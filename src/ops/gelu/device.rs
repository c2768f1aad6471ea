//! GELU and the residual add on the device (`kernels/gelu.hip`), with the CPU reference's names
//! and argument structs plus the stream. Grid-stride over 16-byte packs (one vector access per
//! tensor when aligned). Queues the work; no host sync.
//!
//! Never run on a GPU: compiled and statically checked for gfx906; the device tests run on
//! hip-emu (the CPU-emulated HIP device, `tests/device_trainops.rs`).

use super::{GeluBackward, GeluForward, ResidualAdd};
use crate::embedded::kernel_names::gelu as names;
use crate::ops::launch::{grid_for, kernel, ptr};
use crate::ops::OpError;
use crate::params::{DeviceElement, OnDevice};
use hip_rt::{DevicePtr, LaunchConfig, Stream};

const SOURCE: &str = "gelu";
/// Threads per block the kernels are compiled for (`__launch_bounds__`).
const BLOCK: u32 = 256;
const BLOCKS_PER_CU: u32 = 8;

/// Launch `<op>_<T>(ptrs..., n)` over `n` elements.
fn launch<T: DeviceElement>(
    stream: &Stream,
    op: [&'static str; 3],
    ptrs: &[DevicePtr],
    n: usize,
) -> Result<(), OpError> {
    if n == 0 {
        return Ok(());
    }
    let f = kernel::<T>(stream, SOURCE, op)?;
    let packs = (n as u64).div_ceil((16 / std::mem::size_of::<T>()) as u64);
    let grid = grid_for(
        packs,
        u64::from(BLOCK),
        stream.device().compute_units(),
        BLOCKS_PER_CU,
    );
    let mut b = stream.launch_builder(&f);
    for &p in ptrs {
        b.value(p);
    }
    b.value(n as i64);
    let cfg = LaunchConfig {
        grid: (grid, 1, 1),
        block: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: gelu_fwd_<T> (x, out, n), gelu_bwd_<T> (x, dout, dx, n) and residual_add_<T>
    // (a, b, out, n) take their device pointers in the order the callers pass them, then
    // n: int64_t; every buffer holds exactly n elements (validated), lives on the stream's
    // device and is recorded on the stream. The kernels read each element before writing it,
    // so an output may alias an input.
    unsafe { b.launch(&cfg) }?;
    Ok(())
}

/// [`GeluForward`] on `stream` ([`crate::cpu::gelu_forward`]'s semantics, f32 math).
pub fn gelu_forward<T: DeviceElement>(
    stream: &Stream,
    a: GeluForward<'_, OnDevice, T>,
) -> Result<(), OpError> {
    a.validate()?;
    let ptrs = [ptr(stream, "x", a.x)?, ptr(stream, "out", &*a.out)?];
    launch::<T>(stream, names::GELU_FWD, &ptrs, a.params.len)
}

/// [`GeluBackward`] on `stream` ([`crate::cpu::gelu_backward`]'s semantics, f32 math).
pub fn gelu_backward<T: DeviceElement>(
    stream: &Stream,
    a: GeluBackward<'_, OnDevice, T>,
) -> Result<(), OpError> {
    a.validate()?;
    let ptrs = [
        ptr(stream, "x", a.x)?,
        ptr(stream, "dout", a.dout)?,
        ptr(stream, "dx", &*a.dx)?,
    ];
    launch::<T>(stream, names::GELU_BWD, &ptrs, a.params.len)
}

/// [`ResidualAdd`] on `stream` ([`crate::cpu::residual_add`]'s semantics).
pub fn residual_add<T: DeviceElement>(
    stream: &Stream,
    a: ResidualAdd<'_, OnDevice, T>,
) -> Result<(), OpError> {
    a.validate()?;
    let ptrs = [
        ptr(stream, "a", a.a)?,
        ptr(stream, "b", a.b)?,
        ptr(stream, "out", &*a.out)?,
    ];
    launch::<T>(stream, names::RESIDUAL_ADD, &ptrs, a.params.len)
}
