//! Fused multi-tensor AdamW and the trainer helpers (non-finite check, global L2 norm) on the
//! device (`kernels/adamw.hip`). [`adamw`] takes the CPU reference's argument struct
//! ([`crate::cpu::adamw`]) plus the stream; `grad_scale` and `found_inf` are read by the kernel
//! from device memory, so a loss-scaled step needs no host sync.
//!
//! No launcher here waits for the host: the tensor tables travel by value in the kernel
//! arguments ([`ADAMW_TABLE_ROWS`] / [`REF_TABLE_ROWS`] rows per launch; longer lists take
//! several launches), and scratch comes from the device's stream-ordered allocator.
//!
//! Never run on a GPU: the chunk tables are unit-tested, the kernels are compiled and statically
//! checked for gfx906, the device tests have not run.

use super::{AdamW, AdamWParams};
use crate::embedded::kernel_names::adamw as names;
use crate::ops::launch::{grid_for, kernel, kernel_named, ptr};
use crate::ops::OpError;
use crate::params::{check_len, DeviceElement, OnDevice};
use hip_rt::memory::buffer::{DeviceBuffer, DeviceView, DeviceViewMut};
use hip_rt::{DevicePtr, DeviceRepr, Function, LaunchBuilder, LaunchConfig, Stream};

pub(super) const SOURCE: &str = "adamw";
/// Elements per chunk (one block's unit of work).
pub const CHUNK: usize = 1 << 16;
/// Tensors per AdamW launch (`kAdamwTableRows` in `kernels/adamw.hip`).
pub const ADAMW_TABLE_ROWS: usize = 24;
/// Tensors per non-finite or L2 norm launch (`kRefTableRows` in `kernels/adamw.hip`).
pub const REF_TABLE_ROWS: usize = 48;
/// Threads per block of every kernel in `kernels/adamw.hip`.
pub(super) const BLOCK: u32 = 256;
/// Grid cap, in blocks per compute unit (blocks walk the chunks grid-stride).
pub(super) const BLOCKS_PER_CU: u32 = 8;

/// A tensor row of the AdamW kernel's table (`AdamwTensor` in `kernels/adamw.hip`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub(super) struct AdamwDesc {
    pub(super) param: u64,
    pub(super) grad: u64,
    pub(super) exp_avg: u64,
    pub(super) exp_avg_sq: u64,
    pub(super) max_exp_avg_sq: u64,
    pub(super) master: u64,
    pub(super) numel: i64,
    pub(super) first_chunk: i64,
    /// This tensor's `1 − lr·weight_decay` (its own lr and weight decay, rounded from f64).
    pub(super) decay: f32,
    /// This tensor's `lr / (1 − β1^step)`.
    pub(super) step_size: f32,
}

/// A tensor row of the helpers' table (`TensorRef` in `kernels/adamw.hip`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub(super) struct TensorRef {
    pub(super) data: u64,
    pub(super) numel: i64,
    pub(super) first_chunk: i64,
    pub(super) reserved: i64,
}

/// A table passed by value in the kernel arguments (`AdamwTable` / `RefTable` in
/// `kernels/adamw.hip`): `N` rows, the unused ones zero.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
struct Table<R, const N: usize> {
    rows: [R; N],
}

// SAFETY: `#[repr(C)]` arrays of 24 `AdamwDesc` (six u64 device addresses, two i64 and two f32,
// 72 bytes, no padding) = the kernel's `struct AdamwTable { AdamwTensor rows[24]; }` (1728
// bytes); any bit pattern is valid and nothing in it is a host pointer.
unsafe impl DeviceRepr for Table<AdamwDesc, ADAMW_TABLE_ROWS> {}
// SAFETY: `#[repr(C)]` arrays of 48 `TensorRef` (one u64 device address and three i64, 32
// bytes, no padding) = the kernel's `struct RefTable { TensorRef rows[48]; }` (1536 bytes).
unsafe impl DeviceRepr for Table<TensorRef, REF_TABLE_ROWS> {}

/// Rows with a `first_chunk`, grouped into launches of at most `N` rows.
trait Row: Copy + Default {
    fn numel(&self) -> i64;
    fn set_first_chunk(&mut self, first: i64);
}

impl Row for AdamwDesc {
    fn numel(&self) -> i64 {
        self.numel
    }
    fn set_first_chunk(&mut self, first: i64) {
        self.first_chunk = first;
    }
}

impl Row for TensorRef {
    fn numel(&self) -> i64 {
        self.numel
    }
    fn set_first_chunk(&mut self, first: i64) {
        self.first_chunk = first;
    }
}

/// One launch's worth of rows: the by-value table, its row count, its chunk count, and the
/// global index of its first chunk.
struct Group<R, const N: usize> {
    table: Table<R, N>,
    count: usize,
    chunks: i64,
    first_global_chunk: i64,
}

/// Split `rows` (non-empty tensors) into launches of at most `N` rows, numbering each group's
/// chunks from 0.
fn groups<R: Row, const N: usize>(rows: &[R]) -> Vec<Group<R, N>> {
    let mut global = 0i64;
    rows.chunks(N)
        .map(|part| {
            let lens: Vec<usize> = part.iter().map(|r| r.numel() as usize).collect();
            let (starts, chunks) = chunk_starts(&lens, CHUNK);
            let mut table = Table {
                rows: [R::default(); N],
            };
            for ((slot, row), first) in table.rows.iter_mut().zip(part).zip(starts) {
                *slot = *row;
                slot.set_first_chunk(first);
            }
            let g = Group {
                table,
                count: part.len(),
                chunks,
                first_global_chunk: global,
            };
            global += chunks;
            g
        })
        .collect()
}

/// The first chunk of each tensor and the total, for tensors of `lens` elements and chunks of
/// `chunk`. Empty tensors own no chunk.
pub(super) fn chunk_starts(lens: &[usize], chunk: usize) -> (Vec<i64>, i64) {
    let mut next = 0i64;
    let starts = lens
        .iter()
        .map(|&n| {
            let first = next;
            next += n.div_ceil(chunk) as i64;
            first
        })
        .collect();
    (starts, next)
}

/// Hyper-parameters as the kernel takes them: f32 values computed in f64 from the config and
/// the step (bias corrections included).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct KernelScalars {
    pub(super) beta1: f32,
    pub(super) one_minus_beta1: f32,
    pub(super) beta2: f32,
    pub(super) one_minus_beta2: f32,
    pub(super) eps: f32,
    pub(super) decay: f32,
    pub(super) step_size: f32,
    pub(super) bias2_sqrt: f32,
}

impl KernelScalars {
    pub(super) fn new(c: &AdamWParams) -> KernelScalars {
        let t = c.step as f64;
        KernelScalars {
            beta1: c.beta1 as f32,
            one_minus_beta1: (1.0 - c.beta1) as f32,
            beta2: c.beta2 as f32,
            one_minus_beta2: (1.0 - c.beta2) as f32,
            eps: c.eps as f32,
            decay: (1.0 - c.lr * c.weight_decay) as f32,
            step_size: (c.lr / (1.0 - c.beta1.powf(t))) as f32,
            bias2_sqrt: (1.0 - c.beta2.powf(t)).sqrt() as f32,
        }
    }
}

/// [`AdamW`] on `stream`: one fused step over every tensor, [`ADAMW_TABLE_ROWS`] tensors per
/// launch. Every tensor is validated like [`crate::cpu::adamw`] before anything runs (the value
/// of `grad_scale` is not: it stays on the device); `grad_scale` and `found_inf`, when given,
/// hold one f32 each and are read by the kernel. Queues the work; no host sync.
pub fn adamw<T: DeviceElement>(
    stream: &Stream,
    a: AdamW<'_, '_, OnDevice, T>,
) -> Result<(), OpError> {
    a.validate()?;
    let (grad_scale, found_inf) = scalars(stream, &a)?;
    let rows = adamw_rows(stream, &a)?;
    if rows.is_empty() {
        return Ok(());
    }
    let f = kernel::<T>(stream, SOURCE, names::ADAMW)?;
    let s = KernelScalars::new(&a.params);
    for g in groups::<_, ADAMW_TABLE_ROWS>(&rows) {
        let (cfg, mut b) = chunked_launch(stream, &f, g.table, g.count, g.chunks);
        for v in [
            s.beta1,
            s.one_minus_beta1,
            s.beta2,
            s.one_minus_beta2,
            s.eps,
            s.bias2_sqrt,
        ] {
            b.value(v);
        }
        b.value(i32::from(a.params.maximize))
            .value(i32::from(a.params.amsgrad))
            .value(grad_scale)
            .value(found_inf);
        // SAFETY: adamw_<T>'s parameters in order (AdamwTable by value, int count, int64_t
        // total_chunks, int64_t chunk, six floats, int maximize, int amsgrad, grad_scale and
        // found_inf pointers or null). The table's first `count` rows point at validated buffers
        // (equal lengths, max_exp_avg_sq present iff amsgrad, all on this device and recorded on
        // this stream) and their chunk ranges tile 0..total_chunks; the rest are zero and never
        // read (find_tensor searches the first `count`).
        unsafe { b.launch(&cfg) }?;
    }
    Ok(())
}

/// The device addresses of `grad_scale` and `found_inf` (null when absent).
fn scalars<T: DeviceElement>(
    stream: &Stream,
    a: &AdamW<'_, '_, OnDevice, T>,
) -> Result<(DevicePtr, DevicePtr), OpError> {
    let scalar = |what: &'static str, v: Option<&dyn DeviceView<f32>>| match v {
        None => Ok(DevicePtr::NULL),
        Some(v) => ptr(stream, what, v),
    };
    Ok((
        scalar("grad_scale", a.grad_scale)?,
        scalar("found_inf", a.found_inf)?,
    ))
}

/// The kernel's rows for `a`'s non-empty tensors (first chunks not set), each with its own
/// `decay` and `step_size`; every buffer is recorded on `stream`.
pub(super) fn adamw_rows<T: DeviceElement>(
    stream: &Stream,
    a: &AdamW<'_, '_, OnDevice, T>,
) -> Result<Vec<AdamwDesc>, OpError> {
    let mut rows = Vec::with_capacity(a.tensors.len());
    for t in a.tensors.iter().filter(|t| t.param.len() > 0) {
        let own = KernelScalars::new(&t.hyper(&a.params)?);
        let opt = |what, v: &Option<&mut dyn DeviceViewMut<f32>>| match v {
            Some(v) => ptr(stream, what, &**v).map(|p| p.0),
            None => Ok(0),
        };
        rows.push(AdamwDesc {
            param: ptr(stream, "param", &*t.param)?.0,
            grad: ptr(stream, "grad", t.grad)?.0,
            exp_avg: ptr(stream, "exp_avg", &*t.exp_avg)?.0,
            exp_avg_sq: ptr(stream, "exp_avg_sq", &*t.exp_avg_sq)?.0,
            max_exp_avg_sq: opt("max_exp_avg_sq", &t.max_exp_avg_sq)?,
            master: opt("master", &t.master)?,
            numel: t.param.len() as i64,
            first_chunk: 0,
            decay: own.decay,
            step_size: own.step_size,
        });
    }
    Ok(rows)
}

/// The helpers' rows for `tensors` (empty ones left out).
pub(super) fn tensor_rows<T: DeviceElement>(
    stream: &Stream,
    tensors: &[&dyn DeviceView<T>],
) -> Result<Vec<TensorRef>, OpError> {
    let mut rows = Vec::with_capacity(tensors.len());
    for t in tensors.iter().filter(|t| !t.is_empty()) {
        rows.push(TensorRef {
            data: ptr(stream, "tensors", *t)?.0,
            numel: t.len() as i64,
            first_chunk: 0,
            reserved: 0,
        });
    }
    Ok(rows)
}

/// The launch of a chunked multi-tensor kernel of `kernels/adamw.hip` over `chunks` chunks:
/// one block per chunk up to [`BLOCKS_PER_CU`] per compute unit (blocks walk the rest
/// grid-stride), and a builder holding the leading arguments every such kernel takes (table by
/// value, int row count, int64_t total_chunks, int64_t chunk).
fn chunked_launch<'a, Tb: DeviceRepr>(
    stream: &'a Stream,
    function: &'a Function,
    table: Tb,
    count: usize,
    chunks: i64,
) -> (LaunchConfig, LaunchBuilder<'a>) {
    let grid = grid_for(
        chunks as u64,
        1,
        stream.device().compute_units(),
        BLOCKS_PER_CU,
    );
    let cfg = LaunchConfig {
        grid: (grid, 1, 1),
        block: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut b = stream.launch_builder(function);
    b.value(table)
        .value(count as i32)
        .value(chunks)
        .value(CHUNK as i64);
    (cfg, b)
}

/// Sets `found_inf[0]` to 1.0 if any element of any tensor is NaN or ±inf, else 0.0, on the
/// device: [`crate::cpu::non_finite`] with the answer left in device memory. Queues an async
/// memset and [`REF_TABLE_ROWS`] tensors per launch; no host sync.
pub fn non_finite<T: DeviceElement>(
    stream: &Stream,
    tensors: &[&dyn DeviceView<T>],
    found_inf: &mut dyn DeviceViewMut<f32>,
) -> Result<(), OpError> {
    check_len(AdamWParams::OP, "found_inf", 1, found_inf.len())?;
    let out = ptr(stream, "found_inf", &*found_inf)?;
    let rows = tensor_rows(stream, tensors)?;
    let f = kernel::<T>(stream, SOURCE, names::MULTI_NONFINITE)?;
    stream.memset_zero(&mut *found_inf)?;
    for g in groups::<_, REF_TABLE_ROWS>(&rows) {
        let (cfg, mut b) = chunked_launch(stream, &f, g.table, g.count, g.chunks);
        b.value(out);
        // SAFETY: multi_nonfinite_<T>'s parameters (RefTable by value, int count, int64_t
        // total_chunks, int64_t chunk, float* found_inf); the first `count` rows point at the
        // given tensors (on this device, recorded on this stream) with their lengths and chunk
        // ranges tiling 0..total_chunks; found_inf holds one f32.
        unsafe { b.launch(&cfg) }?;
    }
    Ok(())
}

/// Writes `norm[0]` = √(Σ x²) over every element of every tensor, on the device:
/// [`crate::cpu::l2_norm`] with the answer left in device memory, as f32. Squares are summed in
/// f32 per 64 Ki-element chunk and the chunk sums in f64, in a fixed order (deterministic).
/// Takes one f32 per chunk of scratch from the device's allocator (stream-ordered with the
/// caching allocator, the default; with the opt-in direct allocator its free waits for the
/// device). Otherwise no host sync.
pub fn l2_norm<T: DeviceElement>(
    stream: &Stream,
    tensors: &[&dyn DeviceView<T>],
    norm: &mut dyn DeviceViewMut<f32>,
) -> Result<(), OpError> {
    check_len(AdamWParams::OP, "norm", 1, norm.len())?;
    let out = ptr(stream, "norm", &*norm)?;
    let rows = tensor_rows(stream, tensors)?;
    let partial_kernel = kernel::<T>(stream, SOURCE, names::MULTI_L2NORM)?;
    let finalize = kernel_named(stream, SOURCE, names::MULTI_L2NORM_FINALIZE_F32)?;
    let groups = groups::<_, REF_TABLE_ROWS>(&rows);
    let total: i64 = groups.iter().map(|g| g.chunks).sum();
    let partials: DeviceBuffer<f32> = DeviceBuffer::alloc(stream, total as usize)?;
    for g in groups {
        let first = partials
            .device_ptr()
            .byte_add(g.first_global_chunk as usize * 4);
        let (cfg, mut b) = chunked_launch(stream, &partial_kernel, g.table, g.count, g.chunks);
        b.value(first);
        // SAFETY: multi_l2norm_<T>'s parameters (RefTable by value, int count, int64_t
        // total_chunks, int64_t chunk, float* partials); the table is as in `non_finite`, and
        // `partials` from this group's first global chunk holds one f32 per chunk of the group.
        unsafe { b.launch(&cfg) }?;
    }
    let cfg = LaunchConfig {
        grid: (1, 1, 1),
        block: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut b = stream.launch_builder(&finalize);
    b.value(partials.device_ptr()).value(total).value(out);
    // SAFETY: multi_l2norm_finalize_f32's parameters (const float* partials, int64_t count,
    // float* out); `partials` holds `total` values written by the launches before on this
    // stream (never read when total is 0), `norm` holds one f32.
    unsafe { b.launch(&cfg) }?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_tile_the_tensors_and_skip_empty_ones() {
        assert_eq!(chunk_starts(&[], 4), (vec![], 0));
        assert_eq!(chunk_starts(&[1, 4, 5, 0, 9], 4), (vec![0, 1, 2, 4, 4], 7));
        assert_eq!(chunk_starts(&[CHUNK * 3 + 1], CHUNK), (vec![0], 4));
    }

    #[test]
    fn long_lists_are_split_into_launches_numbered_from_zero() {
        let rows: Vec<TensorRef> = (0..REF_TABLE_ROWS + 3)
            .map(|i| TensorRef {
                data: 0x1000 + i as u64,
                numel: if i == 1 { CHUNK as i64 + 1 } else { 5 },
                ..TensorRef::default()
            })
            .collect();
        let g = groups::<_, REF_TABLE_ROWS>(&rows);
        assert_eq!(g.len(), 2);
        assert_eq!(
            (g[0].count, g[0].chunks, g[0].first_global_chunk),
            (48, 49, 0)
        );
        assert_eq!(
            (g[1].count, g[1].chunks, g[1].first_global_chunk),
            (3, 3, 49)
        );
        assert_eq!([0, 1, 2].map(|i| g[0].table.rows[i].first_chunk), [0, 1, 3]);
        assert_eq!(
            (g[1].table.rows[0].data, g[1].table.rows[0].first_chunk),
            (0x1000 + 48, 0)
        );
        assert_eq!(
            g[1].table.rows[3],
            TensorRef::default(),
            "unused rows are zero"
        );
        assert!(groups::<TensorRef, REF_TABLE_ROWS>(&[]).is_empty());
    }

    #[test]
    fn kernel_scalars_carry_the_bias_corrections() {
        let c = AdamWParams {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.1,
            ..AdamWParams::default()
        };
        let s = KernelScalars::new(&c);
        assert_eq!(s.step_size, (1e-3f64 / 0.1) as f32);
        assert_eq!(s.bias2_sqrt, 0.001f64.sqrt() as f32);
        assert_eq!(s.decay, (1.0 - 1e-4f64) as f32);
        assert_eq!(
            (s.one_minus_beta1, s.one_minus_beta2),
            (0.1f64 as f32, (1.0 - 0.999f64) as f32)
        );
        let late = KernelScalars::new(&AdamWParams { step: 100_000, ..c });
        assert_eq!((late.step_size, late.bias2_sqrt), (1e-3, 1.0));
    }

    #[test]
    fn tables_have_the_kernels_layout() {
        assert_eq!(std::mem::size_of::<AdamwDesc>(), 72);
        assert_eq!(std::mem::size_of::<TensorRef>(), 32);
        assert_eq!(std::mem::offset_of!(AdamwDesc, numel), 48);
        assert_eq!(std::mem::offset_of!(AdamwDesc, decay), 64);
        assert_eq!(std::mem::offset_of!(AdamwDesc, step_size), 68);
        assert_eq!(std::mem::offset_of!(TensorRef, first_chunk), 16);
        assert_eq!(
            std::mem::size_of::<Table<AdamwDesc, ADAMW_TABLE_ROWS>>(),
            1728
        );
        assert_eq!(
            std::mem::size_of::<Table<TensorRef, REF_TABLE_ROWS>>(),
            1536
        );
    }
}
