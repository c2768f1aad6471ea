//! FlashAttention-2 style attention on the device (`kernels/attention.hip`), with the CPU
//! reference's names and argument structs ([`crate::cpu::attention_forward`] /
//! [`crate::cpu::attention_backward`]) plus the stream. f32 math (the reference uses f64); no
//! `tq × tk` buffer; the backward is deterministic (no atomics).
//!
//! Never run on a GPU: the launch plan is unit-tested, the kernels are compiled and statically
//! checked for gfx906 and were run through a host emulation (`tools/kernel-emu`); the device
//! tests have not run.

use super::{
    AttentionBackward, AttentionBackwardStrided, AttentionForward, AttentionForwardStrided,
    AttentionParams,
};
use crate::ops::launch::{kernel_named, ptr};
use crate::ops::OpError;
use crate::params::{DType, DeviceElement, OnDevice, ShapeError};
use hip_rt::{DeviceBuffer, DevicePtr, LaunchConfig, Stream};

const SOURCE: &str = "attention";
/// Threads per block every attention kernel is compiled for.
const BLOCK: u32 = 256;
/// Largest head dimension the kernels support (the widest head-dim bucket).
pub const MAX_HEAD_DIM: usize = 128;
/// Largest `tq` or `tk`: the kernels index a head with 32-bit ints (plus a tile of slack).
pub const MAX_T: usize = i32::MAX as usize - 256;
/// Largest number of (batch, head) pairs one launch covers (grid.y); more are split.
pub const MAX_HEADS_PER_LAUNCH: usize = 65_535;
/// Queries per block of the forward kernel for a head-dim bucket (`FwdCfg<DB>::ROWS` in
/// kernels/attention.hip: two queries per lane group of 4 lanes up to bucket 64, of 8 above).
const fn fwd_rows(bucket: usize) -> usize {
    if bucket <= 64 {
        128
    } else {
        64
    }
}
/// Rows per block of the delta pre-pass (16 lanes per row), and rows per pre-pass launch.
const DOT_ROWS: usize = 16;
const DOT_ROWS_PER_LAUNCH: usize = DOT_ROWS << 20;

/// How the attention kernels are launched for one shape: pure arithmetic, no device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionPlan {
    /// Head-dim bucket: the smallest of 32, 64, 96, 128 that holds `head_dim`.
    pub bucket: usize,
    /// `batch × heads`.
    pub heads: usize,
    /// Blocks along the queries of the forward kernel.
    pub fwd_blocks: u32,
    /// Blocks along the keys of the backward dk/dv kernel.
    pub dkdv_blocks: u32,
    /// Blocks along the queries of the backward dq kernel.
    pub dq_blocks: u32,
}

fn invalid(name: &'static str, value: usize, reason: &'static str) -> ShapeError {
    ShapeError::Invalid {
        op: AttentionParams::OP,
        name,
        value: value.to_string(),
        reason,
    }
}

fn blocks(rows: usize, per_block: usize) -> u32 {
    // rows ≤ MAX_T, so the quotient fits.
    rows.div_ceil(per_block) as u32
}

impl AttentionPlan {
    /// The plan for `shape` (whose lengths are validated separately).
    pub fn new(shape: &AttentionParams) -> Result<AttentionPlan, ShapeError> {
        let bucket = match shape.head_dim {
            0 => return Err(invalid("head_dim", 0, "must be at least 1")),
            1..=32 => 32,
            33..=64 => 64,
            65..=96 => 96,
            97..=MAX_HEAD_DIM => 128,
            d => return Err(invalid("head_dim", d, "must be at most 128 on the device")),
        };
        for (name, t) in [("tq", shape.tq), ("tk", shape.tk)] {
            if t > MAX_T {
                return Err(invalid(name, t, "must be below 2^31 - 256 on the device"));
            }
        }
        let heads = shape
            .batch
            .checked_mul(shape.heads)
            .ok_or(ShapeError::Overflow {
                op: AttentionParams::OP,
                tensor: "q",
            })?;
        // The backward kernels give each row 4 lanes up to bucket 64, 8 above (see the kernels).
        let bwd_rows = if bucket <= 64 { 64 } else { 32 };
        Ok(AttentionPlan {
            bucket,
            heads,
            fwd_blocks: blocks(shape.tq, fwd_rows(bucket)),
            dkdv_blocks: blocks(shape.tk, bwd_rows),
            dq_blocks: blocks(shape.tq, bwd_rows),
        })
    }

    /// Kernel symbol `attention_<stage>_d<bucket>_<dtype>` (stage `fwd`, `bwd_dkdv`, `bwd_dq`).
    pub fn kernel(&self, stage: &str, dtype: DType) -> String {
        format!("attention_{stage}_d{}_{}", self.bucket, dtype.name())
    }
}

/// Per-launch pieces of the (batch, head) range: `(first head, number of heads)`.
fn head_chunks(heads: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..heads)
        .step_by(MAX_HEADS_PER_LAUNCH)
        .map(move |first| (first, (heads - first).min(MAX_HEADS_PER_LAUNCH)))
}

/// The scalar tail every attention kernel shares: Tq, Tk, D, scale, causal.
fn push_dims(b: &mut hip_rt::LaunchBuilder<'_>, shape: &AttentionParams) {
    b.value(shape.tq as i32)
        .value(shape.tk as i32)
        .value(shape.head_dim as i32)
        .value(shape.scale)
        .value(i32::from(shape.causal));
}

fn config(grid_x: u32, heads: usize) -> LaunchConfig {
    LaunchConfig {
        grid: (grid_x, heads as u32, 1),
        block: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// [`AttentionForward`] on `stream`: `out = softmax(scale·q·kᵀ + mask)·v` and the natural-log
/// `lse` (f32) of each query row. Same semantics and validation as
/// [`crate::cpu::attention_forward`]; head_dim ≤ 128. Queues the work; no host sync.
pub fn attention_forward<T: DeviceElement>(
    stream: &Stream,
    a: AttentionForward<'_, OnDevice, T>,
) -> Result<(), OpError> {
    a.validate()?;
    let shape = &a.params;
    let plan = AttentionPlan::new(shape)?;
    let p = [
        ptr(stream, "q", a.q)?,
        ptr(stream, "k", a.k)?,
        ptr(stream, "v", a.v)?,
        ptr(stream, "out", a.out)?,
    ];
    let plse = ptr(stream, "lse", a.lse)?;
    if plan.heads == 0 || shape.tq == 0 {
        return Ok(());
    }
    let f = kernel_named(stream, SOURCE, &plan.kernel("fwd", T::DTYPE))?;
    let off = Offsets::new::<T>(shape);
    for (first, heads) in head_chunks(plan.heads) {
        let mut b = stream.launch_builder(&f);
        b.value(off.q(p[0], first))
            .value(off.kv(p[1], first))
            .value(off.kv(p[2], first));
        b.value(off.q(p[3], first)).value(off.row(plse, first));
        push_dims(&mut b, shape);
        // SAFETY: the arguments are attention_fwd_d<bucket>_<T>'s (q, k, v, out, lse: device
        // pointers; Tq, Tk, D: int; scale: float; causal: int) in order. validate() checked
        // every length against the shape, so heads first..first + heads of each tensor lie
        // inside its buffer; tq, tk ≤ MAX_T and head_dim ≤ 128 fit an int; the buffers live on
        // the stream's device and the allocator was told the stream uses them.
        unsafe { b.launch(&config(plan.fwd_blocks, heads)) }?;
    }
    Ok(())
}

/// [`AttentionBackward`] on `stream`, from the forward's `out` and `lse`: writes `dq`, `dk`,
/// `dv`. Same semantics and validation as [`crate::cpu::attention_backward`]; head_dim ≤ 128.
/// Takes a temporary f32 buffer of `batch·heads·tq` (delta = rowsum(dout ∘ out)) from the
/// device's allocator (stream-ordered with the caching allocator, the default; with the opt-in
/// direct allocator its free waits for the device). Deterministic: every output element is
/// written once by one thread.
pub fn attention_backward<T: DeviceElement>(
    stream: &Stream,
    a: AttentionBackward<'_, OnDevice, T>,
) -> Result<(), OpError> {
    a.validate()?;
    let shape = &a.params;
    let plan = AttentionPlan::new(shape)?;
    let [pq, pk, pv, pout, pdout] = [
        ptr(stream, "q", a.q)?,
        ptr(stream, "k", a.k)?,
        ptr(stream, "v", a.v)?,
        ptr(stream, "out", a.out)?,
        ptr(stream, "dout", a.dout)?,
    ];
    let plse = ptr(stream, "lse", a.lse)?;
    let [pdq, pdk, pdv] = [
        ptr(stream, "dq", a.dq)?,
        ptr(stream, "dk", a.dk)?,
        ptr(stream, "dv", a.dv)?,
    ];
    if plan.heads == 0 || (shape.tq == 0 && shape.tk == 0) {
        return Ok(());
    }
    let dtype = T::DTYPE;
    let rows = plan.heads * shape.tq; // = lse.len(), validated
    let delta = DeviceBuffer::<f32>::alloc(stream, rows)?;
    let pdelta = ptr(stream, "delta", &delta)?;
    let off = Offsets::new::<T>(shape);

    if shape.tq > 0 {
        let f = kernel_named(
            stream,
            SOURCE,
            &format!("attention_bwd_dot_{}", dtype.name()),
        )?;
        let row_bytes = shape.head_dim * std::mem::size_of::<T>();
        for first in (0..rows).step_by(DOT_ROWS_PER_LAUNCH) {
            let n = (rows - first).min(DOT_ROWS_PER_LAUNCH);
            let mut b = stream.launch_builder(&f);
            b.value(pout.byte_add(first * row_bytes))
                .value(pdout.byte_add(first * row_bytes))
                .value(pdelta.byte_add(first * 4))
                .value(n as i64)
                .value(shape.head_dim as i32);
            let cfg = LaunchConfig {
                grid: (blocks(n, DOT_ROWS), 1, 1),
                block: (BLOCK, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: attention_bwd_dot_<T>(out, dout: device pointers; delta: float*; rows:
            // int64_t; D: int). Rows first..first + n of out and dout ([rows, head_dim], checked
            // by validate()) and of delta (allocated with `rows` floats) are in bounds;
            // all buffers are on the stream's device.
            unsafe { b.launch(&cfg) }?;
        }
    }
    let fdkdv = kernel_named(stream, SOURCE, &plan.kernel("bwd_dkdv", dtype))?;
    let fdq = kernel_named(stream, SOURCE, &plan.kernel("bwd_dq", dtype))?;
    for (first, heads) in head_chunks(plan.heads) {
        let inputs = [
            off.q(pq, first),
            off.kv(pk, first),
            off.kv(pv, first),
            off.q(pdout, first),
        ];
        let stats = [off.row(plse, first), off.row(pdelta, first)];
        if plan.dkdv_blocks > 0 {
            let mut b = stream.launch_builder(&fdkdv);
            for p in inputs.iter().chain(&stats) {
                b.value(*p);
            }
            b.value(off.kv(pdk, first)).value(off.kv(pdv, first));
            push_dims(&mut b, shape);
            // SAFETY: attention_bwd_dkdv_d<bucket>_<T>(q, k, v, dout, lse, delta, dk, dv: device
            // pointers; Tq, Tk, D: int; scale: float; causal: int) in order; lengths validated as
            // in the forward, delta holds batch·heads·tq floats; all on the stream's device.
            unsafe { b.launch(&config(plan.dkdv_blocks, heads)) }?;
        }
        if plan.dq_blocks > 0 {
            let mut b = stream.launch_builder(&fdq);
            for p in inputs.iter().chain(&stats) {
                b.value(*p);
            }
            b.value(off.q(pdq, first));
            push_dims(&mut b, shape);
            // SAFETY: attention_bwd_dq_d<bucket>_<T>(q, k, v, dout, lse, delta, dq: device
            // pointers; Tq, Tk, D: int; scale: float; causal: int) in order; bounds as above.
            unsafe { b.launch(&config(plan.dq_blocks, heads)) }?;
        }
    }
    // `delta` goes back to the allocator on drop; ptr() recorded its use on this stream.
    Ok(())
}

/// [`AttentionForwardStrided`] on `stream`: q, k, v read through their layouts (e.g. straight
/// from the fused QKV projection `[B, T, 3, H, D]`), `out` written through `out_layout` (e.g.
/// `[B, T, H, D]`), `lse` packed `[B, H, tq]` f32. Same semantics and validation as
/// [`crate::cpu::attention_forward_strided`]; head_dim ≤ 128. Queues the work; no host sync.
pub fn attention_forward_strided<T: DeviceElement>(
    stream: &Stream,
    a: AttentionForwardStrided<'_, OnDevice, T>,
) -> Result<(), OpError> {
    a.validate()?;
    AttentionPlan::new(&a.params)?;
    let _ = stream;
    Err(OpError::NoKernel {
        op: "attention_forward_strided",
        reason: "kernels/attention.hip does not read strided layouts yet",
    })
}

/// [`AttentionBackwardStrided`] on `stream`: dq, dk, dv written (overwritten, not accumulated)
/// into `dqkv` through their layouts (e.g. the fused `[B, T, 3, H, D]` gradient). Same
/// semantics and validation as [`crate::cpu::attention_backward_strided`]; head_dim ≤ 128.
pub fn attention_backward_strided<T: DeviceElement>(
    stream: &Stream,
    a: AttentionBackwardStrided<'_, OnDevice, T>,
) -> Result<(), OpError> {
    a.validate()?;
    AttentionPlan::new(&a.params)?;
    let _ = stream;
    Err(OpError::NoKernel {
        op: "attention_backward_strided",
        reason: "kernels/attention.hip does not read strided layouts yet",
    })
}

/// Byte offsets of head `first` in the [heads, t, d] tensors and the [heads, tq] rows.
struct Offsets {
    q_head: usize,
    kv_head: usize,
    row_head: usize,
}

impl Offsets {
    fn new<T>(shape: &AttentionParams) -> Offsets {
        let e = std::mem::size_of::<T>();
        Offsets {
            q_head: shape.tq * shape.head_dim * e,
            kv_head: shape.tk * shape.head_dim * e,
            row_head: shape.tq * 4,
        }
    }
    fn q(&self, p: DevicePtr, first: usize) -> DevicePtr {
        p.byte_add(first * self.q_head)
    }
    fn kv(&self, p: DevicePtr, first: usize) -> DevicePtr {
        p.byte_add(first * self.kv_head)
    }
    fn row(&self, p: DevicePtr, first: usize) -> DevicePtr {
        p.byte_add(first * self.row_head)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::kernel_names;

    fn shape(tq: usize, tk: usize, head_dim: usize) -> AttentionParams {
        AttentionParams {
            batch: 2,
            heads: 3,
            tq,
            tk,
            head_dim,
            causal: true,
            scale: 0.125,
        }
    }

    #[test]
    fn head_dims_map_to_the_smallest_bucket_and_every_kernel_exists() {
        let names = kernel_names(SOURCE).expect("attention is in the name table");
        for (d, bucket) in [
            (1, 32),
            (16, 32),
            (32, 32),
            (33, 64),
            (64, 64),
            (80, 96),
            (96, 96),
            (100, 128),
            (128, 128),
        ] {
            let p = AttentionPlan::new(&shape(7, 9, d)).unwrap();
            assert_eq!(p.bucket, bucket, "head_dim {d}");
            for dtype in DType::ALL {
                for stage in ["fwd", "bwd_dkdv", "bwd_dq"] {
                    let k = p.kernel(stage, dtype);
                    assert!(names.contains(&k.as_str()), "{k}");
                }
                let dot = format!("attention_bwd_dot_{}", dtype.name());
                assert!(names.contains(&dot.as_str()), "{dot}");
            }
        }
    }

    #[test]
    fn grids_cover_every_row() {
        let p = AttentionPlan::new(&shape(1000, 17, 64)).unwrap();
        assert_eq!(
            (p.heads, p.fwd_blocks, p.dkdv_blocks, p.dq_blocks),
            (6, 8, 1, 16)
        );
        let p = AttentionPlan::new(&shape(1000, 17, 65)).unwrap();
        assert_eq!(p.fwd_blocks, 16);
        let p = AttentionPlan::new(&shape(129, 1000, 128)).unwrap();
        assert_eq!((p.fwd_blocks, p.dkdv_blocks, p.dq_blocks), (3, 32, 5));
        let p = AttentionPlan::new(&shape(0, 0, 8)).unwrap();
        assert_eq!((p.fwd_blocks, p.dkdv_blocks, p.dq_blocks), (0, 0, 0));
    }

    #[test]
    fn unsupported_shapes_are_typed_errors() {
        let e = AttentionPlan::new(&shape(4, 4, 129)).unwrap_err();
        assert!(
            matches!(
                e,
                ShapeError::Invalid {
                    name: "head_dim",
                    ..
                }
            ),
            "{e}"
        );
        assert!(
            e.to_string().contains("129") && e.to_string().contains("128"),
            "{e}"
        );
        let e = AttentionPlan::new(&shape(1 << 31, 4, 64)).unwrap_err();
        assert!(matches!(e, ShapeError::Invalid { name: "tq", .. }), "{e}");
    }

    #[test]
    fn head_chunks_split_at_the_grid_limit() {
        let chunks: Vec<_> = head_chunks(2 * MAX_HEADS_PER_LAUNCH + 5).collect();
        assert_eq!(
            chunks,
            vec![
                (0, MAX_HEADS_PER_LAUNCH),
                (MAX_HEADS_PER_LAUNCH, MAX_HEADS_PER_LAUNCH),
                (2 * MAX_HEADS_PER_LAUNCH, 5)
            ]
        );
        assert_eq!(head_chunks(0).count(), 0);
    }
}
