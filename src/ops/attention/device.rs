//! FlashAttention-2 style attention on the device (`kernels/attention.hip`), with the CPU
//! reference's names and argument structs ([`crate::cpu::attention_forward`] /
//! [`crate::cpu::attention_backward`]) plus the stream. f32 math (the reference uses f64); no
//! `tq × tk` buffer; the backward is deterministic (no atomics).
//!
//! One set of kernels reads every tensor through element strides (offset, batch, head and seq
//! strides; head_dim contiguous): the packed `[B, H, T, D]` launchers pass packed strides, the
//! strided ones ([`attention_forward_strided`], [`attention_backward_strided`]) the caller's
//! [`AttentionLayout`]s (e.g. straight from the fused QKV projection `[B, T, 3, H, D]`).
//!
//! On f16/bf16 with an arch that has matrix units, [`AttentionKernel::Auto`] runs the
//! matrix-core kernels of `kernels/attention_mc.hip` instead (same arguments; see
//! `src/ops/attention/mc.rs`); the `_with` launchers choose explicitly.
//!
//! Never run on a GPU: the launch plan is unit-tested, the kernels are compiled and statically
//! checked for gfx906, and the device tests (`tests/device_matmul_attention.rs`,
//! `tests/device_attention_strided.rs`) ran on hip-emu, the CPU emulation of a device.

use super::mc::{self, AttentionKernel, McAttentionPlan};
use super::{
    AttentionBackward, AttentionBackwardStrided, AttentionForward, AttentionForwardStrided,
    AttentionLayout, AttentionParams,
};
use crate::embedded::kernel_names::attention as names;
use crate::ops::launch::{dtype_kernel, kernel_named, ptr};
use crate::ops::OpError;
use crate::params::{DType, DeviceElement, OnDevice, ShapeError};
use hip_rt::{DeviceBuffer, DevicePtr, DeviceRepr, LaunchBuilder, LaunchConfig, Stream};

const SOURCE: &str = "attention";
/// Threads per block every attention kernel is compiled for.
const BLOCK: u32 = 256;
/// Largest head dimension the kernels support (the widest head-dim bucket).
pub const MAX_HEAD_DIM: usize = 128;
/// Largest `tq` or `tk`: the kernels index a head with 32-bit ints (plus a tile of slack).
pub const MAX_T: usize = i32::MAX as usize - 256;
/// Largest number of heads (grid.y) and of batches (grid.z) one launch covers; more are split
/// into several launches.
pub const MAX_HEADS_PER_LAUNCH: usize = 65_535;
/// Queries per block of the forward kernel for a head-dim bucket (`FwdCfg<DB>::ROWS` in
/// kernels/attention.hip: 256 / G lane groups of QPT queries; G, QPT = 4, 2 at bucket 32,
/// 8, 4 at 64, 8, 2 at 96 and 16, 4 at 128).
const fn fwd_rows(bucket: usize) -> usize {
    if bucket <= 64 {
        128
    } else {
        64
    }
}
/// The same for the `_varlen` forward kernels: bucket 64 takes QPT = 2 there (its key spans
/// would not fit the registers of 2 waves/SIMD with 4).
const fn fwd_varlen_rows(bucket: usize) -> usize {
    if bucket <= 32 {
        128
    } else {
        64
    }
}
/// Rows per block of the delta pre-pass (16 lanes per row).
const DOT_ROWS: usize = 16;

/// How the attention kernels are launched for one shape: pure arithmetic, no device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionPlan {
    /// Head-dim bucket: the smallest of 32, 64, 96, 128 that holds `head_dim`.
    pub bucket: usize,
    /// `batch × heads` (0: nothing to launch).
    pub heads: usize,
    /// Blocks along the queries of the forward kernel.
    pub fwd_blocks: u32,
    /// Blocks along the queries of the forward kernel with `cu_seqlens` (`_varlen`).
    pub fwd_varlen_blocks: u32,
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
            fwd_varlen_blocks: blocks(shape.tq, fwd_varlen_rows(bucket)),
            dkdv_blocks: blocks(shape.tk, bwd_rows),
            dq_blocks: blocks(shape.tq, bwd_rows),
        })
    }

    /// Kernel symbol `attention_<stage>_d<bucket>_<dtype>`, a generated kernel-name constant.
    pub fn kernel(&self, stage: AttentionStage, dtype: DType) -> &'static str {
        const FWD: [[&str; 3]; 4] = [
            names::ATTENTION_FWD_D32,
            names::ATTENTION_FWD_D64,
            names::ATTENTION_FWD_D96,
            names::ATTENTION_FWD_D128,
        ];
        const DKDV: [[&str; 3]; 4] = [
            names::ATTENTION_BWD_DKDV_D32,
            names::ATTENTION_BWD_DKDV_D64,
            names::ATTENTION_BWD_DKDV_D96,
            names::ATTENTION_BWD_DKDV_D128,
        ];
        const DQ: [[&str; 3]; 4] = [
            names::ATTENTION_BWD_DQ_D32,
            names::ATTENTION_BWD_DQ_D64,
            names::ATTENTION_BWD_DQ_D96,
            names::ATTENTION_BWD_DQ_D128,
        ];
        // The smallest bucket holding `self.bucket` (which `new` sets to a bucket).
        let bucket = match self.bucket {
            0..=32 => 0,
            33..=64 => 1,
            65..=96 => 2,
            _ => 3,
        };
        let by_bucket = match stage {
            AttentionStage::Forward => FWD,
            AttentionStage::BackwardDkDv => DKDV,
            AttentionStage::BackwardDq => DQ,
        };
        dtype_kernel(by_bucket[bucket], dtype)
    }

    /// The kernel of `stage` for a call with `cu_seqlens`: `attention_fwd_d<bucket>_varlen_<dtype>`
    /// and `attention_bwd_dq_d<bucket>_varlen_<dtype>` (the masks of variable-length sequences
    /// are compiled only into these, so the kernels without them keep their registers);
    /// `attention_bwd_dkdv_d<bucket>_<dtype>` serves both.
    pub fn varlen_kernel(&self, stage: AttentionStage, dtype: DType) -> &'static str {
        const FWD: [[&str; 3]; 4] = [
            names::ATTENTION_FWD_D32_VARLEN,
            names::ATTENTION_FWD_D64_VARLEN,
            names::ATTENTION_FWD_D96_VARLEN,
            names::ATTENTION_FWD_D128_VARLEN,
        ];
        const DQ: [[&str; 3]; 4] = [
            names::ATTENTION_BWD_DQ_D32_VARLEN,
            names::ATTENTION_BWD_DQ_D64_VARLEN,
            names::ATTENTION_BWD_DQ_D96_VARLEN,
            names::ATTENTION_BWD_DQ_D128_VARLEN,
        ];
        let bucket = match self.bucket {
            0..=32 => 0,
            33..=64 => 1,
            65..=96 => 2,
            _ => 3,
        };
        match stage {
            AttentionStage::Forward => dtype_kernel(FWD[bucket], dtype),
            AttentionStage::BackwardDq => dtype_kernel(DQ[bucket], dtype),
            AttentionStage::BackwardDkDv => self.kernel(stage, dtype),
        }
    }

    /// [`kernel`](Self::kernel) or, with `cu_seqlens`, [`varlen_kernel`](Self::varlen_kernel).
    fn kernel_for(&self, stage: AttentionStage, dtype: DType, cu: &SeqStarts) -> &'static str {
        if cu.on() {
            self.varlen_kernel(stage, dtype)
        } else {
            self.kernel(stage, dtype)
        }
    }
}

/// An attention kernel with one instance per head-dim bucket (see [`AttentionPlan::kernel`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionStage {
    /// `attention_fwd_d<bucket>_<dtype>`.
    Forward,
    /// `attention_bwd_dkdv_d<bucket>_<dtype>`.
    BackwardDkDv,
    /// `attention_bwd_dq_d<bucket>_<dtype>`.
    BackwardDq,
}

/// Per-launch pieces of a batch or head range: `(first, count)`, count ≤ `step` (at most the
/// grid limit).
fn head_chunks(heads: usize, step: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..heads)
        .step_by(step)
        .map(move |first| (first, (heads - first).min(step)))
}

/// The kernels' `struct Strides` (kernels/attention.hip): element strides of a strided tensor.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Strides {
    batch: i64,
    head: i64,
    seq: i64,
}

/// The kernels' `struct RowStrides`: element strides of lse and delta `[B, H, Tq]` (f32).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RowStrides {
    batch: i64,
    head: i64,
}

// SAFETY: `#[repr(C)]` structs of three (two) i64, no padding, any bit pattern valid, equal to
// the kernels' `struct Strides { int64_t batch, head, seq; }` and `struct RowStrides`; nothing
// in them is a host pointer.
unsafe impl DeviceRepr for Strides {}
// SAFETY: as above.
unsafe impl DeviceRepr for RowStrides {}

/// One strided tensor of a launch: its buffer's address and where its rows are, with the
/// extents of `[batch, heads, t]` it is read or written over.
#[derive(Debug, Clone, Copy)]
struct View {
    ptr: DevicePtr,
    layout: AttentionLayout,
    batch: usize,
    heads: usize,
    t: usize,
}

/// A stride as the kernels take it: 0 for a dimension of extent ≤ 1 (its stride is never used
/// and need not be in bounds); otherwise `(extent − 1)·stride` lies inside the buffer (checked
/// by `validate()`), so it fits an i64.
fn stride(extent: usize, s: usize) -> i64 {
    if extent <= 1 {
        0
    } else {
        s as i64
    }
}

impl View {
    /// A view of q, out or their gradients (`heads` heads).
    fn new(ptr: DevicePtr, layout: AttentionLayout, shape: &AttentionParams, t: usize) -> View {
        View {
            ptr,
            layout,
            batch: shape.batch,
            heads: shape.heads,
            t,
        }
    }

    /// A view of k, v or their gradients (`n_kv_heads` heads).
    fn kv(ptr: DevicePtr, layout: AttentionLayout, shape: &AttentionParams) -> View {
        View {
            heads: shape.n_kv_heads,
            ..View::new(ptr, layout, shape, shape.tk)
        }
    }

    fn strides(&self) -> Strides {
        Strides {
            batch: stride(self.batch, self.layout.batch_stride),
            head: stride(self.heads, self.layout.head_stride),
            seq: stride(self.t, self.layout.seq_stride),
        }
    }

    /// The address of row `(b0, h0, 0)` (in bounds: `b0 < batch`, `h0 < heads`, validated).
    fn at<T>(&self, b0: usize, h0: usize) -> DevicePtr {
        let s = self.strides();
        let elems = self.layout.offset + b0 * s.batch as usize + h0 * s.head as usize;
        self.ptr.byte_add(elems * std::mem::size_of::<T>())
    }

    fn push<T>(&self, b: &mut LaunchBuilder<'_>, b0: usize, h0: usize) {
        b.value(self.at::<T>(b0, h0)).value(self.strides());
    }
}

/// lse and delta: packed `[batch, heads, tq]` f32.
#[derive(Debug, Clone, Copy)]
struct Stats {
    heads: usize,
    tq: usize,
}

impl Stats {
    fn strides(&self) -> RowStrides {
        RowStrides {
            batch: (self.heads * self.tq) as i64,
            head: self.tq as i64,
        }
    }
    fn at(&self, p: DevicePtr, b0: usize, h0: usize) -> DevicePtr {
        p.byte_add((b0 * self.heads + h0) * self.tq * 4)
    }
}

/// `cu_seqlens` as the kernels take it: its address (null without) and entries per row.
#[derive(Debug, Clone, Copy)]
struct SeqStarts {
    ptr: DevicePtr,
    per_row: usize,
}

impl SeqStarts {
    fn new(
        stream: &Stream,
        shape: &AttentionParams,
        cu: Option<&dyn hip_rt::DeviceView<i32>>,
    ) -> Result<SeqStarts, OpError> {
        let per_row = shape.validate_cu_seqlens(cu.map(|c| c.len()))?;
        let ptr = match cu {
            Some(c) => ptr(stream, "cu_seqlens", c)?,
            None => DevicePtr::NULL,
        };
        Ok(SeqStarts { ptr, per_row })
    }

    /// Whether the launches take the starts (`cu_seqlens` given, with a row per batch).
    fn on(&self) -> bool {
        self.per_row > 0
    }

    /// The starts of batch `b0` (null without `cu_seqlens`).
    fn at(&self, b0: usize) -> DevicePtr {
        if self.per_row == 0 {
            DevicePtr::NULL
        } else {
            self.ptr.byte_add(b0 * self.per_row * 4)
        }
    }
}

/// The scalar tail every attention kernel shares: Tq, Tk, D, scale, causal, group (query
/// heads per key/value head), then cu_seqlens of this launch's first batch and its entries
/// per row (null and 0 without).
fn push_dims(
    b: &mut hip_rt::LaunchBuilder<'_>,
    shape: &AttentionParams,
    cu: &SeqStarts,
    b0: usize,
) {
    b.value(shape.tq as i32)
        .value(shape.tk as i32)
        .value(shape.head_dim as i32)
        .value(shape.scale)
        .value(i32::from(shape.causal))
        .value(shape.group() as i32)
        .value(cu.at(b0))
        .value(cu.per_row as i32);
}

/// The launches covering every batch and every one of `heads` heads: `(first batch, first
/// head, config)`. Head chunks start at multiples of `align` (the group size, so that a chunk
/// of query heads starts at a key/value head).
fn launches(
    grid_x: u32,
    batch: usize,
    heads: usize,
    align: usize,
) -> impl Iterator<Item = (usize, usize, LaunchConfig)> {
    let step = MAX_HEADS_PER_LAUNCH - MAX_HEADS_PER_LAUNCH % align.clamp(1, MAX_HEADS_PER_LAUNCH);
    head_chunks(batch, MAX_HEADS_PER_LAUNCH).flat_map(move |(b0, nb)| {
        head_chunks(heads, step).map(move |(h0, nh)| {
            let cfg = LaunchConfig {
                // nb, nh ≤ MAX_HEADS_PER_LAUNCH < 2^16.
                grid: (grid_x, nh as u32, nb as u32),
                block: (BLOCK, 1, 1),
                shared_mem_bytes: 0,
            };
            (b0, h0, cfg)
        })
    })
}

/// [`AttentionForward`] on `stream`: `out = softmax(scale·q·kᵀ + mask)·v` and the natural-log
/// `lse` (f32) of each query row. Same semantics and validation as
/// [`crate::cpu::attention_forward`]; head_dim ≤ 128. Queues the work; no host sync.
pub fn attention_forward<T: DeviceElement>(
    stream: &Stream,
    a: AttentionForward<'_, OnDevice, T>,
) -> Result<(), OpError> {
    attention_forward_with(stream, a, AttentionKernel::Auto)
}

/// [`attention_forward`] with an explicit kernel family ([`AttentionKernel`]): `MatrixCore`
/// runs the matrix-core kernels (f16/bf16; on an arch with matrix cores or on hip-emu, else a
/// typed error), `Plain` the vector kernels, `Auto` what [`attention_forward`] picks.
pub fn attention_forward_with<T: DeviceElement>(
    stream: &Stream,
    a: AttentionForward<'_, OnDevice, T>,
    kernel: AttentionKernel,
) -> Result<(), OpError> {
    a.validate()?;
    let s = &a.params;
    let plan = AttentionPlan::new(s)?;
    let (pq, pk, pv) = (
        ptr(stream, "q", a.q)?,
        ptr(stream, "k", a.k)?,
        ptr(stream, "v", a.v)?,
    );
    let pout = ptr(stream, "out", a.out)?;
    let plse = ptr(stream, "lse", a.lse)?;
    let (lq, lk) = (
        AttentionLayout::packed(s.heads, s.tq, s.head_dim),
        AttentionLayout::packed(s.n_kv_heads, s.tk, s.head_dim),
    );
    let cu = SeqStarts::new(stream, s, a.cu_seqlens)?;
    forward::<T>(
        stream,
        s,
        &plan,
        [
            View::new(pq, lq, s, s.tq),
            View::kv(pk, lk, s),
            View::kv(pv, lk, s),
            View::new(pout, lq, s, s.tq),
        ],
        plse,
        &cu,
        kernel,
    )
}

/// [`AttentionForwardStrided`] on `stream`: q, k, v read through their layouts (e.g. straight
/// from the fused QKV projection `[B, T, 3, H, D]`, [`AttentionLayout::fused_qkv`]), `out`
/// written through `out_layout` (e.g. [`AttentionLayout::bthd`]; elements outside it are
/// untouched), `lse` packed `[B, H, tq]` f32 (overwritten). Same semantics as
/// [`crate::cpu::attention_forward_strided`]; head_dim ≤ 128. The layouts are checked to lie
/// inside their buffers; the output rows must not overlap one another (the CPU reference checks
/// that; here overlapping rows are written in an unspecified order, never out of bounds).
/// Queues the work; no host sync.
pub fn attention_forward_strided<T: DeviceElement>(
    stream: &Stream,
    a: AttentionForwardStrided<'_, OnDevice, T>,
) -> Result<(), OpError> {
    attention_forward_strided_with(stream, a, AttentionKernel::Auto)
}

/// [`attention_forward_strided`] with an explicit kernel family (see
/// [`attention_forward_with`]).
pub fn attention_forward_strided_with<T: DeviceElement>(
    stream: &Stream,
    a: AttentionForwardStrided<'_, OnDevice, T>,
    kernel: AttentionKernel,
) -> Result<(), OpError> {
    a.validate()?;
    let s = &a.params;
    let plan = AttentionPlan::new(s)?;
    let q = View::new(ptr(stream, "q", a.q.data)?, a.q.layout, s, s.tq);
    let k = View::kv(ptr(stream, "k", a.k.data)?, a.k.layout, s);
    let v = View::kv(ptr(stream, "v", a.v.data)?, a.v.layout, s);
    let out = View::new(ptr(stream, "out", a.out)?, a.out_layout, s, s.tq);
    let plse = ptr(stream, "lse", a.lse)?;
    let cu = SeqStarts::new(stream, s, a.cu_seqlens)?;
    forward::<T>(stream, s, &plan, [q, k, v, out], plse, &cu, kernel)
}

/// The matrix-core plan when `kernel` resolves to the matrix-core kernels for `T` and `shape`
/// on the stream's device (`None`: the vector kernels), or the typed error of a
/// [`AttentionKernel::MatrixCore`] request that cannot be served.
fn mc_plan<T: DeviceElement>(
    stream: &Stream,
    shape: &AttentionParams,
    kernel: AttentionKernel,
) -> Result<Option<McAttentionPlan>, OpError> {
    let device = stream.device();
    if !mc::use_matrix_cores(kernel, T::DTYPE, shape.head_dim, device.arch()) {
        return Ok(None);
    }
    if let Some(reason) = mc::refusal(T::DTYPE, device.arch(), device.is_emulated()) {
        return Err(OpError::NoKernel {
            op: AttentionParams::OP,
            reason,
        });
    }
    Ok(Some(McAttentionPlan::new(shape)))
}

/// A kernel of the matrix-core plan (`None` only for f32, which [`mc_plan`] refused).
fn mc_kernel(name: Option<&'static str>) -> Result<&'static str, OpError> {
    name.ok_or(OpError::NoKernel {
        op: AttentionParams::OP,
        reason: "the matrix-core attention takes f16 or bf16",
    })
}

/// The forward launches over validated views `[q, k, v, out]`.
fn forward<T: DeviceElement>(
    stream: &Stream,
    shape: &AttentionParams,
    plan: &AttentionPlan,
    views: [View; 4],
    plse: DevicePtr,
    cu: &SeqStarts,
    kernel: AttentionKernel,
) -> Result<(), OpError> {
    let mc = mc_plan::<T>(stream, shape, kernel)?;
    if plan.heads == 0 || shape.tq == 0 {
        return Ok(());
    }
    let f = match &mc {
        Some(p) => kernel_named(
            stream,
            mc::SOURCE,
            mc_kernel(p.forward_kernel(T::DTYPE, cu.on()))?,
        )?,
        None => kernel_named(
            stream,
            SOURCE,
            plan.kernel_for(AttentionStage::Forward, T::DTYPE, cu),
        )?,
    };
    let stats = Stats {
        heads: shape.heads,
        tq: shape.tq,
    };
    let group = shape.group();
    let [q, k, v, out] = views;
    let (fwd_blocks, threads) = match &mc {
        Some(p) => (p.fwd_blocks, p.fwd_threads),
        None if cu.on() => (plan.fwd_varlen_blocks, BLOCK),
        None => (plan.fwd_blocks, BLOCK),
    };
    for (b0, h0, mut cfg) in launches(fwd_blocks, shape.batch, shape.heads, group) {
        cfg.block = (threads, 1, 1);
        let mut b = stream.launch_builder(&f);
        q.push::<T>(&mut b, b0, h0);
        // h0 is a multiple of the group (launches()): key/value head h0 / group.
        k.push::<T>(&mut b, b0, h0 / group);
        v.push::<T>(&mut b, b0, h0 / group);
        out.push::<T>(&mut b, b0, h0);
        b.value(stats.at(plse, b0, h0)).value(stats.strides());
        push_dims(&mut b, shape, cu, b0);
        // SAFETY: the arguments are attention_fwd_d<bucket>_<T>'s (q, Strides, k, Strides, v,
        // Strides, out, Strides, lse, RowStrides; Tq, Tk, D: int; scale: float; causal, group:
        // int; cu: const int*; ncu: int) in order, which attention_mc_fwd_d<bucket>[_varlen]_<T>
        // share (kernels/attention_mc.hip; launched with the plan's block size, which its
        // __launch_bounds__ allows). validate() checked every view's rows
        // (b, h, t) with b < batch, h < its heads (heads for q and out, n_kv_heads for k and v),
        // t < its length, plus head_dim columns, lie inside its buffer, and lse's length; the
        // launch covers batches b0..b0 + grid.z, query heads h0..h0 + grid.y and key/value
        // heads (h0 + y) / group < n_kv_heads (heads = group · n_kv_heads), whose rows are
        // among those; cu holds batch × ncu ints (validated length) from batch b0 on, and the
        // kernel clamps every value it reads to 0..=Tq before using it; tq, tk ≤ MAX_T and
        // head_dim ≤ 128 fit an int; the buffers live on the stream's device and the
        // allocator was told the stream uses them.
        unsafe { b.launch(&cfg) }?;
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
    attention_backward_with(stream, a, AttentionKernel::Auto)
}

/// [`attention_backward`] with an explicit kernel family (see [`attention_forward_with`]; the
/// delta pre-pass is the vector kernel's either way).
pub fn attention_backward_with<T: DeviceElement>(
    stream: &Stream,
    a: AttentionBackward<'_, OnDevice, T>,
    kernel: AttentionKernel,
) -> Result<(), OpError> {
    a.validate()?;
    let s = &a.params;
    let plan = AttentionPlan::new(s)?;
    let (lq, lk) = (
        AttentionLayout::packed(s.heads, s.tq, s.head_dim),
        AttentionLayout::packed(s.n_kv_heads, s.tk, s.head_dim),
    );
    let inputs = [
        View::new(ptr(stream, "q", a.q)?, lq, s, s.tq),
        View::kv(ptr(stream, "k", a.k)?, lk, s),
        View::kv(ptr(stream, "v", a.v)?, lk, s),
        View::new(ptr(stream, "out", a.out)?, lq, s, s.tq),
        View::new(ptr(stream, "dout", a.dout)?, lq, s, s.tq),
    ];
    let plse = ptr(stream, "lse", a.lse)?;
    let grads = [
        View::new(ptr(stream, "dq", a.dq)?, lq, s, s.tq),
        View::kv(ptr(stream, "dk", a.dk)?, lk, s),
        View::kv(ptr(stream, "dv", a.dv)?, lk, s),
    ];
    let cu = SeqStarts::new(stream, s, a.cu_seqlens)?;
    backward::<T>(stream, s, &plan, inputs, plse, grads, &cu, kernel)
}

/// [`AttentionBackwardStrided`] on `stream`, from the forward's `out` and `lse`: every input
/// read through its layout; dq, dk, dv **written** (overwritten, not accumulated) into `dqkv`
/// through theirs (e.g. the fused `[B, T, 3, H, D]` gradient of the QKV projection,
/// [`AttentionLayout::fused_qkv`]); elements of `dqkv` outside the three views are untouched,
/// so no zeroing is needed when the views cover it. Same semantics as
/// [`crate::cpu::attention_backward_strided`]; head_dim ≤ 128; the gradient rows must not
/// overlap (as in [`attention_forward_strided`]). Takes a temporary f32 buffer of
/// `batch·heads·tq` from the device's allocator (see [`attention_backward`]). Deterministic.
pub fn attention_backward_strided<T: DeviceElement>(
    stream: &Stream,
    a: AttentionBackwardStrided<'_, OnDevice, T>,
) -> Result<(), OpError> {
    attention_backward_strided_with(stream, a, AttentionKernel::Auto)
}

/// [`attention_backward_strided`] with an explicit kernel family (see
/// [`attention_backward_with`]).
pub fn attention_backward_strided_with<T: DeviceElement>(
    stream: &Stream,
    a: AttentionBackwardStrided<'_, OnDevice, T>,
    kernel: AttentionKernel,
) -> Result<(), OpError> {
    a.validate()?;
    let s = &a.params;
    let plan = AttentionPlan::new(s)?;
    let inputs = [
        View::new(ptr(stream, "q", a.q.data)?, a.q.layout, s, s.tq),
        View::kv(ptr(stream, "k", a.k.data)?, a.k.layout, s),
        View::kv(ptr(stream, "v", a.v.data)?, a.v.layout, s),
        View::new(ptr(stream, "out", a.out.data)?, a.out.layout, s, s.tq),
        View::new(ptr(stream, "dout", a.dout.data)?, a.dout.layout, s, s.tq),
    ];
    let plse = ptr(stream, "lse", a.lse)?;
    let pd = ptr(stream, "dqkv", a.dqkv)?;
    let grads = [
        View::new(pd, a.dq, s, s.tq),
        View::kv(pd, a.dk, s),
        View::kv(pd, a.dv, s),
    ];
    let cu = SeqStarts::new(stream, s, a.cu_seqlens)?;
    backward::<T>(stream, s, &plan, inputs, plse, grads, &cu, kernel)
}

/// The backward launches over validated views: inputs `[q, k, v, out, dout]`, gradients
/// `[dq, dk, dv]`.
#[allow(clippy::too_many_arguments)]
fn backward<T: DeviceElement>(
    stream: &Stream,
    shape: &AttentionParams,
    plan: &AttentionPlan,
    inputs: [View; 5],
    plse: DevicePtr,
    grads: [View; 3],
    cu: &SeqStarts,
    kernel: AttentionKernel,
) -> Result<(), OpError> {
    let mc = mc_plan::<T>(stream, shape, kernel)?;
    if plan.heads == 0 || (shape.tq == 0 && shape.tk == 0) {
        return Ok(());
    }
    let dtype = T::DTYPE;
    let [q, k, v, out, dout] = inputs;
    let [dq, dk, dv] = grads;
    let stats = Stats {
        heads: shape.heads,
        tq: shape.tq,
    };
    let delta = DeviceBuffer::<f32>::alloc(stream, plan.heads * shape.tq)?; // = lse.len()
    let pdelta = ptr(stream, "delta", &delta)?;

    if shape.tq > 0 {
        let f = kernel_named(
            stream,
            SOURCE,
            dtype_kernel(names::ATTENTION_BWD_DOT, dtype),
        )?;
        for (b0, h0, cfg) in launches(blocks(shape.tq, DOT_ROWS), shape.batch, shape.heads, 1) {
            let mut b = stream.launch_builder(&f);
            out.push::<T>(&mut b, b0, h0);
            dout.push::<T>(&mut b, b0, h0);
            b.value(stats.at(pdelta, b0, h0))
                .value(stats.strides())
                .value(shape.tq as i32)
                .value(shape.head_dim as i32);
            // SAFETY: attention_bwd_dot_<T>(out, Strides, dout, Strides, delta, RowStrides;
            // Tq, D: int). The rows (b, h, t < tq) of out and dout of this launch's batches
            // and heads are inside their buffers (validate()); delta holds batch·heads·tq
            // floats laid out as lse; all buffers are on the stream's device.
            unsafe { b.launch(&cfg) }?;
        }
    }
    let (fdkdv, fdq, dkdv_blocks, dq_blocks, threads) = match &mc {
        Some(p) => (
            kernel_named(stream, mc::SOURCE, mc_kernel(p.dkdv_kernel(dtype))?)?,
            kernel_named(stream, mc::SOURCE, mc_kernel(p.dq_kernel(dtype, cu.on()))?)?,
            p.dkdv_blocks,
            p.dq_blocks,
            mc::MC_BWD_THREADS,
        ),
        None => (
            kernel_named(
                stream,
                SOURCE,
                plan.kernel(AttentionStage::BackwardDkDv, dtype),
            )?,
            kernel_named(
                stream,
                SOURCE,
                plan.kernel_for(AttentionStage::BackwardDq, dtype, cu),
            )?,
            plan.dkdv_blocks,
            plan.dq_blocks,
            BLOCK,
        ),
    };
    let group = shape.group();
    // Query head h0 (a multiple of the group) and key/value head h0 / group.
    let shared = |b: &mut LaunchBuilder<'_>, b0: usize, h0: usize| {
        q.push::<T>(b, b0, h0);
        k.push::<T>(b, b0, h0 / group);
        v.push::<T>(b, b0, h0 / group);
        dout.push::<T>(b, b0, h0);
        b.value(stats.at(plse, b0, h0))
            .value(stats.at(pdelta, b0, h0))
            .value(stats.strides());
    };
    // dk, dv: one block row per key/value head, looping over its group's query heads.
    for (b0, kh0, mut cfg) in launches(dkdv_blocks, shape.batch, shape.n_kv_heads, 1) {
        if dkdv_blocks == 0 {
            break;
        }
        cfg.block = (threads, 1, 1);
        let mut b = stream.launch_builder(&fdkdv);
        shared(&mut b, b0, kh0 * group);
        dk.push::<T>(&mut b, b0, kh0);
        dv.push::<T>(&mut b, b0, kh0);
        push_dims(&mut b, shape, cu, b0);
        // SAFETY: attention_bwd_dkdv_d<bucket>_<T>(q, Strides, k, Strides, v, Strides, dout,
        // Strides, lse, delta, RowStrides, dk, Strides, dv, Strides; Tq, Tk, D: int; scale:
        // float; causal, group: int; cu: const int*; ncu: int) in order (the argument list of
        // attention_mc_bwd_dkdv_d<bucket>_<T> too, 256 threads); the launch covers
        // key/value heads kh0..kh0 + grid.y < n_kv_heads and their query heads
        // (kh0 + y)·group + 0..group < heads; bounds as in the forward (validate() checked
        // every view), delta holds batch·heads·tq floats; all on the stream's device.
        unsafe { b.launch(&cfg) }?;
    }
    for (b0, h0, mut cfg) in launches(dq_blocks, shape.batch, shape.heads, group) {
        if dq_blocks == 0 {
            break;
        }
        cfg.block = (threads, 1, 1);
        let mut b = stream.launch_builder(&fdq);
        shared(&mut b, b0, h0);
        dq.push::<T>(&mut b, b0, h0);
        push_dims(&mut b, shape, cu, b0);
        // SAFETY: attention_bwd_dq_d<bucket>_<T>(q, Strides, k, Strides, v, Strides, dout,
        // Strides, lse, delta, RowStrides, dq, Strides; Tq, Tk, D: int; scale: float; causal,
        // group: int; cu: const int*; ncu: int) in order (and attention_mc_bwd_dq_d<bucket>
        // [_varlen]_<T>'s, 256 threads); bounds as in the forward.
        unsafe { b.launch(&cfg) }?;
    }
    // `delta` goes back to the allocator on drop; ptr() recorded its use on this stream.
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::kernel_names;

    fn shape(tq: usize, tk: usize, head_dim: usize) -> AttentionParams {
        AttentionParams {
            batch: 2,
            heads: 3,
            n_kv_heads: 3,
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
                for (stage, prefix) in [
                    (AttentionStage::Forward, "attention_fwd_d"),
                    (AttentionStage::BackwardDkDv, "attention_bwd_dkdv_d"),
                    (AttentionStage::BackwardDq, "attention_bwd_dq_d"),
                ] {
                    let k = p.kernel(stage, dtype);
                    assert_eq!(k, format!("{prefix}{bucket}_{}", dtype.name()));
                    assert!(names.contains(&k), "{k}");
                    let kv = p.varlen_kernel(stage, dtype);
                    let variant = match stage {
                        AttentionStage::BackwardDkDv => "",
                        _ => "_varlen",
                    };
                    assert_eq!(kv, format!("{prefix}{bucket}{variant}_{}", dtype.name()));
                    assert!(names.contains(&kv), "{kv}");
                }
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
        assert_eq!(p.fwd_varlen_blocks, 16);
        let p = AttentionPlan::new(&shape(1000, 17, 32)).unwrap();
        assert_eq!((p.fwd_blocks, p.fwd_varlen_blocks), (8, 8));
        let p = AttentionPlan::new(&shape(1000, 17, 65)).unwrap();
        assert_eq!((p.fwd_blocks, p.fwd_varlen_blocks), (16, 16));
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
    fn views_fold_the_offset_and_first_batch_and_head_into_the_pointer() {
        let s = AttentionParams {
            batch: 3,
            ..shape(5, 5, 8)
        };
        let fused = AttentionLayout::fused_qkv(super::super::Qkv::K, 5, 3, 8);
        let v = View::new(DevicePtr::NULL, fused, &s, 5);
        // [B, T, 3, H, D] = [3, 5, 3, 3, 8]: k at offset H·D = 24, rows 3·H·D = 72 apart.
        assert_eq!(
            v.strides(),
            Strides {
                batch: 5 * 72,
                head: 8,
                seq: 72
            }
        );
        let at = v.at::<u16>(2, 1).as_raw() as usize;
        assert_eq!(at, 2 * (24 + 2 * 360 + 8));
        // Extent 1: the stride is never used, passed as 0 (need not be in bounds).
        let one = AttentionParams {
            batch: 1,
            heads: 1,
            n_kv_heads: 1,
            ..s
        };
        let wild = AttentionLayout {
            batch_stride: usize::MAX,
            head_stride: usize::MAX,
            ..fused
        };
        let v = View::new(DevicePtr::NULL, wild, &one, 1);
        assert_eq!(
            v.strides(),
            Strides {
                batch: 0,
                head: 0,
                seq: 0
            }
        );
        let stats = Stats { heads: 3, tq: 5 };
        assert_eq!(stats.strides(), RowStrides { batch: 15, head: 5 });
        assert_eq!(
            stats.at(DevicePtr::NULL, 2, 1).as_raw() as usize,
            (2 * 15 + 5) * 4
        );
    }

    #[test]
    fn launches_cover_every_batch_and_head_within_the_grid_limits() {
        let s = AttentionParams {
            batch: 2,
            heads: MAX_HEADS_PER_LAUNCH + 1,
            n_kv_heads: MAX_HEADS_PER_LAUNCH + 1,
            ..shape(4, 4, 8)
        };
        let l: Vec<_> = launches(7, s.batch, s.heads, 1)
            .map(|(b0, h0, c)| (b0, h0, c.grid))
            .collect();
        let m = MAX_HEADS_PER_LAUNCH;
        assert_eq!(l, vec![(0, 0, (7, m as u32, 2)), (0, m, (7, 1, 2)),]);
        let s = AttentionParams {
            batch: m + 2,
            heads: 3,
            n_kv_heads: 3,
            ..s
        };
        let l: Vec<_> = launches(1, s.batch, s.heads, 1)
            .map(|(b0, h0, c)| (b0, h0, c.grid))
            .collect();
        assert_eq!(l, vec![(0, 0, (1, 3, m as u32)), (m, 0, (1, 3, 2))]);
    }

    #[test]
    fn query_head_launches_start_at_a_key_value_head() {
        // group 7: 65535 = 7 · 9362 + 1, so chunks of 65534 query heads (9362 groups).
        let l: Vec<_> = launches(1, 1, 2 * MAX_HEADS_PER_LAUNCH, 7)
            .map(|(_, h0, c)| (h0, c.grid.1))
            .collect();
        assert_eq!(l, vec![(0, 65534), (65534, 65534), (131068, 2)]);
        assert!(l.iter().all(|(h0, _)| h0 % 7 == 0));
    }

    #[test]
    fn head_chunks_split_at_the_grid_limit() {
        let chunks: Vec<_> =
            head_chunks(2 * MAX_HEADS_PER_LAUNCH + 5, MAX_HEADS_PER_LAUNCH).collect();
        assert_eq!(
            chunks,
            vec![
                (0, MAX_HEADS_PER_LAUNCH),
                (MAX_HEADS_PER_LAUNCH, MAX_HEADS_PER_LAUNCH),
                (2 * MAX_HEADS_PER_LAUNCH, 5)
            ]
        );
        assert_eq!(head_chunks(0, 7).count(), 0);
    }
}
