//! SwiGLU on the device (`kernels/swiglu.hip`), with the CPU reference's names and argument
//! structs plus the stream. Columns in 16-byte packs across `blockIdx.x`, rows grid-stride in
//! `blockIdx.y`; the fused layout is the separate one with `u = g + F` and a row stride of 2F.
//! Queues the work; no host sync.
//!
//! Never run on a GPU: compiled and statically checked for gfx906; the device tests run on
//! hip-emu (the CPU-emulated HIP device, `tests/device_llama_ops.rs`).

use super::{GateUp, GateUpGrad, SwigluBackward, SwigluForward, SwigluParams};
use crate::embedded::kernel_names::swiglu as names;
use crate::ops::launch::{kernel, ptr};
use crate::ops::OpError;
use crate::params::{DeviceElement, OnDevice};
use hip_rt::{DevicePtr, LaunchConfig, Stream};

const SOURCE: &str = "swiglu";
/// Threads per block the kernels are compiled for.
const BLOCK: u32 = 256;
/// Blocks per compute unit the row walk aims for.
const BLOCKS_PER_CU: u64 = 8;
/// The largest grid.y a launch may use.
const MAX_GRID_Y: u64 = 65535;

/// How a SwiGLU kernel is launched: pure arithmetic on the shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SwigluPlan {
    /// Blocks across the columns (packs of `pack` elements, 256 per block).
    pub grid_x: u32,
    /// Blocks walking the rows.
    pub grid_y: u32,
    /// Row stride of g, u, dg, du in elements (F, or 2F fused).
    pub in_stride: usize,
}

impl SwigluPlan {
    /// The plan for `p` with packs of `pack` elements on `cus` compute units.
    pub fn new(p: &SwigluParams, fused: bool, pack: usize, cus: u32) -> SwigluPlan {
        let packs = p.ffn.div_ceil(pack.max(1)) as u64;
        let grid_x = packs.div_ceil(u64::from(BLOCK)).max(1);
        let want_y = (u64::from(cus.max(1)) * BLOCKS_PER_CU).div_ceil(grid_x);
        let grid_y = (p.rows as u64).min(want_y).clamp(1, MAX_GRID_Y);
        SwigluPlan {
            grid_x: u32::try_from(grid_x).unwrap_or(u32::MAX),
            grid_y: grid_y as u32,
            in_stride: if fused { 2 * p.ffn } else { p.ffn },
        }
    }
}

/// Every pointer aligned to a 16-byte pack and F a whole number of packs.
fn vec_ok(ffn: usize, pack: usize, ptrs: &[DevicePtr]) -> bool {
    ffn % pack == 0 && ptrs.iter().all(|p| p.0 % 16 == 0)
}

/// `(g, u)` device pointers of the input layout.
fn gate_up_ptrs<T: DeviceElement>(
    stream: &Stream,
    p: &SwigluParams,
    input: &GateUp<'_, OnDevice, T>,
) -> Result<[DevicePtr; 2], OpError> {
    Ok(match input {
        GateUp::Separate { gate, up } => [ptr(stream, "gate", *gate)?, ptr(stream, "up", *up)?],
        GateUp::Fused { gate_up } => {
            let g = ptr(stream, "gate_up", *gate_up)?;
            [
                g,
                DevicePtr(g.0 + (p.ffn * std::mem::size_of::<T>()) as u64),
            ]
        }
    })
}

fn launch<T: DeviceElement>(
    stream: &Stream,
    p: &SwigluParams,
    fused: bool,
    op: [&'static str; 3],
    ptrs: &[DevicePtr],
    grad_stride: Option<usize>,
) -> Result<(), OpError> {
    if p.rows == 0 || p.ffn == 0 {
        return Ok(());
    }
    let pack = 16 / std::mem::size_of::<T>();
    let plan = SwigluPlan::new(p, fused, pack, stream.device().compute_units());
    let f = kernel::<T>(stream, SOURCE, op)?;
    let mut b = stream.launch_builder(&f);
    for &q in ptrs {
        b.value(q);
    }
    b.value(p.rows as i64)
        .value(p.ffn as i64)
        .value(plan.in_stride as i64);
    if let Some(stride) = grad_stride {
        b.value(stride as i64);
    }
    b.value(i32::from(vec_ok(p.ffn, pack, ptrs)));
    let cfg = LaunchConfig {
        grid: (plan.grid_x, plan.grid_y, 1),
        block: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: swiglu_fwd_<T> (g, u, h) and swiglu_bwd_<T> (g, u, dh, dg, du) take their pointers
    // in the order the callers pass them, then rows: int64_t, F: int64_t, in_stride: int64_t,
    // (backward only) grad_stride: int64_t, vec: int. validate() checked every buffer's length
    // for its layout (fused: rows·2F with u, du at +F inside it and row stride 2F; separate:
    // rows·F each, stride F), `ptr` their device; vec is set only when every pointer is 16-byte
    // aligned and F a multiple of the pack.
    unsafe { b.launch(&cfg) }?;
    Ok(())
}

/// [`SwigluForward`] on `stream` ([`crate::cpu::swiglu_forward`]'s semantics, f32 math).
pub fn swiglu_forward<T: DeviceElement>(
    stream: &Stream,
    a: SwigluForward<'_, OnDevice, T>,
) -> Result<(), OpError> {
    a.validate()?;
    let p = a.params;
    let [g, u] = gate_up_ptrs(stream, &p, &a.input)?;
    let h = ptr(stream, "h", &*a.h)?;
    let fused = matches!(a.input, GateUp::Fused { .. });
    launch::<T>(stream, &p, fused, names::SWIGLU_FWD, &[g, u, h], None)
}

/// [`SwigluBackward`] on `stream` ([`crate::cpu::swiglu_backward`]'s semantics, f32 math); the
/// input and gradient layouts are independent (fused, separate, or one of each).
pub fn swiglu_backward<T: DeviceElement>(
    stream: &Stream,
    a: SwigluBackward<'_, OnDevice, T>,
) -> Result<(), OpError> {
    a.validate()?;
    let p = a.params;
    let [g, u] = gate_up_ptrs(stream, &p, &a.input)?;
    let dh = ptr(stream, "dh", a.dh)?;
    let fused = matches!(a.input, GateUp::Fused { .. });
    let [dg, du] = match &a.grad {
        GateUpGrad::Separate { dgate, dup } => {
            [ptr(stream, "dgate", &**dgate)?, ptr(stream, "dup", &**dup)?]
        }
        GateUpGrad::Fused { dgate_up } => {
            let d = ptr(stream, "dgate_up", &**dgate_up)?;
            [
                d,
                DevicePtr(d.0 + (p.ffn * std::mem::size_of::<T>()) as u64),
            ]
        }
    };
    let grad_fused = matches!(a.grad, GateUpGrad::Fused { .. });
    let grad_stride = if grad_fused { 2 * p.ffn } else { p.ffn };
    launch::<T>(
        stream,
        &p,
        fused,
        names::SWIGLU_BWD,
        &[g, u, dh, dg, du],
        Some(grad_stride),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_cover_the_columns_and_walk_the_rows() {
        let p = SwigluParams {
            rows: 4096,
            ffn: 11008,
        };
        let plan = SwigluPlan::new(&p, true, 4, 60);
        assert_eq!((plan.grid_x, plan.in_stride), (11, 22016));
        assert_eq!(plan.grid_y, 44, "480 blocks over 11 column blocks");
        let plan = SwigluPlan::new(&SwigluParams { rows: 3, ffn: 5 }, false, 8, 60);
        assert_eq!((plan.grid_x, plan.grid_y, plan.in_stride), (1, 3, 5));
        let plan = SwigluPlan::new(
            &SwigluParams {
                rows: 1 << 30,
                ffn: 1,
            },
            false,
            4,
            1 << 20,
        );
        assert_eq!(plan.grid_y, 65535);
    }

    #[test]
    fn the_vector_layout_needs_whole_packs_and_aligned_pointers() {
        assert!(vec_ok(8, 4, &[DevicePtr(0), DevicePtr(32)]));
        assert!(!vec_ok(6, 4, &[DevicePtr(0)]));
        assert!(!vec_ok(8, 4, &[DevicePtr(0), DevicePtr(8)]));
    }
}
