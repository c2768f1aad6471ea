//! Rotary embedding on the device (`kernels/rope.hip`), with the CPU reference's names and
//! argument struct plus the stream. One thread per (token, pair group): its angles are computed
//! once and applied to every head of the view. Queues the work; no host sync.
//!
//! Never run on a GPU: compiled and statically checked for gfx906; the device tests run on
//! hip-emu (the CPU-emulated HIP device, `tests/device_llama_ops.rs`).

use super::{Rope, RopeParams};
use crate::embedded::kernel_names::rope as names;
use crate::ops::launch::{grid_for, kernel, ptr};
use crate::ops::{AttentionLayout, OpError};
use crate::params::{DeviceElement, OnDevice};
use hip_rt::{LaunchConfig, Stream};

const SOURCE: &str = "rope";
/// Threads per block the kernel is compiled for.
const BLOCK: u32 = 256;
const BLOCKS_PER_CU: u32 = 8;
/// Elements every row start, stride and the buffer must be a multiple of for the vector path.
const VEC_ALIGN: usize = 4;

/// The vector path's layout (2 pairs per thread, one access of 2 + 2 or 4 elements): an even
/// number of pairs, the view's start (`addr` in bytes, `elem` bytes per element) and every
/// stride multiples of 4 elements.
pub fn rope_vector_layout_ok(
    pairs: usize,
    layout: &AttentionLayout,
    addr: u64,
    elem: usize,
) -> bool {
    let strides_ok = [layout.batch_stride, layout.head_stride, layout.seq_stride]
        .iter()
        .all(|s| s % VEC_ALIGN == 0);
    let start = addr + (layout.offset * elem) as u64;
    pairs % 2 == 0 && strides_ok && start % (VEC_ALIGN * elem) as u64 == 0
}

fn launch<T: DeviceElement>(
    stream: &Stream,
    a: Rope<'_, OnDevice, T>,
    sign: f32,
) -> Result<(), OpError> {
    a.validate()?;
    let p: RopeParams = a.params;
    let tokens = p.tokens()?;
    let x = ptr(stream, "x", &*a.x)?;
    let pos = ptr(stream, "positions", a.positions)?;
    let freqs = ptr(stream, "freqs", a.freqs)?;
    if tokens == 0 || p.heads == 0 {
        return Ok(());
    }
    let f = kernel::<T>(stream, SOURCE, names::ROPE)?;
    let vec = rope_vector_layout_ok(p.pairs(), &a.layout, x.0, std::mem::size_of::<T>());
    let per_thread = if vec { 2 } else { 1 };
    let items = tokens as u64 * (p.pairs() / per_thread) as u64;
    let grid = grid_for(
        items,
        u64::from(BLOCK),
        stream.device().compute_units(),
        BLOCKS_PER_CU,
    );
    let l = a.layout;
    let mut b = stream.launch_builder(&f);
    b.value(x)
        .value(pos)
        .value(freqs)
        .value(tokens as i64)
        .value(p.seq as i64)
        .value(p.heads as i32)
        .value(l.offset as i64)
        .value(l.batch_stride as i64)
        .value(l.seq_stride as i64)
        .value(l.head_stride as i64)
        .value(p.pairs() as i32)
        .value(i32::from(p.interleaved))
        .value(sign)
        .value(i32::from(vec));
    let cfg = LaunchConfig {
        grid: (grid, 1, 1),
        block: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: rope_<T>'s parameters in order (x, positions: int*, freqs: float*, tokens, seq:
    // int64_t, heads: int, offset, batch_stride, seq_stride, head_stride: int64_t, half: int,
    // interleaved: int, sign: float, vec: int). validate() checked that every row (b, h, t) of
    // the view, head_dim ≤ 256 elements from its start, lies inside `x` (so the rotated dims,
    // R ≤ head_dim, do), that positions holds batch·seq and freqs R/2 values; heads fits an
    // int (the view of a buffer that small has far fewer rows); vec is set only when every
    // access it makes is aligned (rope_vector_layout_ok).
    unsafe { b.launch(&cfg) }?;
    Ok(())
}

/// [`Rope`] forward on `stream` ([`crate::cpu::rope_forward`]'s semantics, f32 math: the angle
/// `pos·f` formed exactly, see `kernels/rope.hip`). In place on the view; no host sync.
pub fn rope_forward<T: DeviceElement>(
    stream: &Stream,
    a: Rope<'_, OnDevice, T>,
) -> Result<(), OpError> {
    launch(stream, a, 1.0)
}

/// [`Rope`] backward on `stream` ([`crate::cpu::rope_backward`]: the rotation by `−a`), in place
/// on the gradient's view; no host sync.
pub fn rope_backward<T: DeviceElement>(
    stream: &Stream,
    a: Rope<'_, OnDevice, T>,
) -> Result<(), OpError> {
    launch(stream, a, -1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vector_path_needs_even_pairs_and_aligned_rows() {
        let fused = AttentionLayout::fused_qkv(crate::ops::Qkv::K, 16, 8, 128);
        let p = 64;
        assert!(rope_vector_layout_ok(p, &fused, 4096, 2));
        assert!(!rope_vector_layout_ok(3, &fused, 4096, 2));
        assert!(
            !rope_vector_layout_ok(p, &fused, 4098, 2),
            "misaligned buffer"
        );
        let odd = AttentionLayout { offset: 1, ..fused };
        assert!(!rope_vector_layout_ok(p, &odd, 4096, 2), "misaligned view");
        let odd = AttentionLayout::packed(2, 3, 6);
        assert!(
            !rope_vector_layout_ok(p, &odd, 0, 4),
            "head_dim 6: rows 6 apart"
        );
    }
}
