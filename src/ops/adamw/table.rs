//! The few-launch optimizer: AdamW, the global L2 norm (with clipping) and the non-finite check
//! over any number of tensors, one launch each, from tensor tables in device memory
//! (`adamw_tab_<T>`, `multi_l2norm_tab_<T>`, `multi_l2norm_finalize_clip_f32`,
//! `multi_nonfinite_tab_<T>` in `kernels/adamw.hip`).
//!
//! The by-value launchers ([`super::adamw`], [`super::l2_norm`]) carry their table in the kernel
//! arguments, [`super::ADAMW_TABLE_ROWS`] / [`super::REF_TABLE_ROWS`] rows per launch: GPT-2
//! 124M's 148 tensors take 7 AdamW launches and 4 + 1 for the norm. Here the table sits in a
//! device buffer that [`OptimizerTables`] keeps and refills with one asynchronous copy from a
//! pinned staging buffer, so the kernel-argument limit does not apply: any tensor count is one
//! launch. A clipped step is 3 launches (norm partials, finalize + clip, AdamW) plus that copy,
//! with no host round trip (the norm and the clip scale stay in device memory).
//!
//! Upload and launch are separate so that a captured graph (`hip_rt::Graph`) can hold the
//! launches while the step's scalars (learning rate, bias corrections) are refreshed before each
//! replay by an upload outside the graph: [`OptimizerTables::upload_adamw`] then
//! [`OptimizerTables::launch_adamw`] (the graph's node). [`adamw_tabled`] and
//! [`l2_norm_tabled`] do both, for eager use. A table's device address stays the same while its
//! size (tensor count) does, so a graph that captured a launch keeps reading the latest upload.
//!
//! Never run on a GPU: the kernels are compiled and statically checked for gfx906; the device
//! tests run them on hip-emu against the CPU reference and the by-value launchers (bit-identical:
//! same rows, same arithmetic).

use bytemuck::{Pod, Zeroable};
use hip_rt::memory::buffer::{DeviceBuffer, DeviceView, DeviceViewMut};
use hip_rt::{DevicePtr, LaunchConfig, PinnedHostBuffer, Stream};

use super::device::{
    adamw_rows, chunk_starts, tensor_rows, AdamwDesc, KernelScalars, TensorRef, BLOCK,
    BLOCKS_PER_CU, SOURCE,
};
use super::{AdamW, AdamWParams, CHUNK};
use crate::embedded::kernel_names::adamw as names;
use crate::ops::launch::{dtype_kernel, grid_for, kernel_named, ptr};
use crate::ops::OpError;
use crate::params::{check_len, invalid, DType, DeviceElement, OnDevice};

/// The step's scalars at the head of the AdamW table (`AdamwHeader` in `kernels/adamw.hip`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
struct AdamwHeader {
    count: i64,
    total_chunks: i64,
    beta1: f32,
    one_minus_beta1: f32,
    beta2: f32,
    one_minus_beta2: f32,
    eps: f32,
    bias2_sqrt: f32,
    maximize: i32,
    amsgrad: i32,
}

/// 8-byte words of the AdamW table: the header, then one row per tensor.
fn adamw_words(header: &AdamwHeader, rows: &[AdamwDesc]) -> Vec<u64> {
    // Both are 8-byte aligned with sizes that are multiples of 8 (48 and 72 bytes).
    let mut words: Vec<u64> = bytemuck::cast_slice(std::slice::from_ref(header)).to_vec();
    words.extend_from_slice(bytemuck::cast_slice(rows));
    words
}

/// Set each row's first chunk (empty tensors are never in `rows`); returns the chunk total.
fn number_chunks<R>(rows: &mut [R], numel: impl Fn(&R) -> i64, set: impl Fn(&mut R, i64)) -> i64 {
    let lens: Vec<usize> = rows.iter().map(|r| numel(r) as usize).collect();
    let (starts, total) = chunk_starts(&lens, CHUNK);
    for (r, first) in rows.iter_mut().zip(starts) {
        set(r, first);
    }
    total
}

/// A table in device memory and its pinned staging copy (same length, reused).
#[derive(Default)]
struct Upload {
    staging: Option<PinnedHostBuffer<u64>>,
    device: Option<DeviceBuffer<u64>>,
}

impl Upload {
    /// Queue a copy of `words` into the device table (reallocated only when its length changes);
    /// waits on the host only if the previous copy from the staging buffer is still pending.
    fn put(&mut self, stream: &Stream, words: &[u64]) -> Result<DevicePtr, OpError> {
        let fits = self
            .staging
            .as_ref()
            .is_some_and(|s| s.len() == words.len())
            && self.device.as_ref().is_some_and(|d| {
                d.len() == words.len() && d.device().ordinal() == stream.device().ordinal()
            });
        if !fits {
            self.staging = Some(PinnedHostBuffer::new(stream.device(), words.len())?);
            self.device = Some(DeviceBuffer::alloc(stream, words.len())?);
        }
        let (Some(staging), Some(device)) = (self.staging.as_mut(), self.device.as_mut()) else {
            // Both were set just above when either was missing.
            return Err(invalid(AdamWParams::OP, "table", "unallocated", "internal error").into());
        };
        staging.as_mut_slice()?.copy_from_slice(words);
        stream.copy_htod_async(staging, device)?;
        ptr(stream, "table", &*device)
    }

    fn address(&self, stream: &Stream) -> Result<DevicePtr, OpError> {
        match &self.device {
            Some(d) => ptr(stream, "table", d),
            None => Err(invalid(
                AdamWParams::OP,
                "OptimizerTables",
                "empty",
                "call the matching upload_* first",
            )
            .into()),
        }
    }
}

/// What the last upload of a table holds: dtype, tensor rows and chunk total.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Shape {
    dtype: DType,
    rows: usize,
    chunks: i64,
}

/// The clip of [`OptimizerTables::launch_norm`]: `grad_scale = s / min(1, max_norm / (norm/s +
/// 1e-6))` with `s` the loss scale (`clip_grad_norm_` and AdamW's unscale in one factor, as
/// [`crate::ops::clip_grad_scale`]).
pub struct NormClip<'a> {
    /// `max_norm` (finite, > 0).
    pub max_norm: f32,
    /// Optional `[1]`: the loss scale the gradients carry.
    pub loss_scale: Option<&'a dyn DeviceView<f32>>,
    /// `[1]`: AdamW's `grad_scale` (overwritten).
    pub grad_scale: &'a mut dyn DeviceViewMut<f32>,
}

/// The device-side tables of the few-launch optimizer, kept across steps (see the module docs):
/// one for AdamW, one for the norm and non-finite check, and the norm's per-chunk partial sums.
#[derive(Default)]
pub struct OptimizerTables {
    adamw: Upload,
    adamw_shape: Option<Shape>,
    refs: Upload,
    refs_shape: Option<Shape>,
    partials: Option<DeviceBuffer<f32>>,
}

impl OptimizerTables {
    /// Empty tables; the first uploads allocate them.
    pub fn new() -> Self {
        Self::default()
    }

    /// Validates `a` as [`super::adamw`] does and uploads its table: the step's scalars (from
    /// `a.params`) and one row per non-empty tensor with its own decay and step size. One
    /// asynchronous host-to-device copy; no launch, no host sync (unless the previous upload's
    /// copy is still pending). `grad_scale` and `found_inf` are not part of the table: they are
    /// [`OptimizerTables::launch_adamw`]'s arguments.
    pub fn upload_adamw<T: DeviceElement>(
        &mut self,
        stream: &Stream,
        a: &AdamW<'_, '_, OnDevice, T>,
    ) -> Result<(), OpError> {
        a.validate()?;
        let mut rows = adamw_rows(stream, a)?;
        let chunks = number_chunks(&mut rows, |r| r.numel, |r, f| r.first_chunk = f);
        let s = KernelScalars::new(&a.params);
        let header = AdamwHeader {
            count: rows.len() as i64,
            total_chunks: chunks,
            beta1: s.beta1,
            one_minus_beta1: s.one_minus_beta1,
            beta2: s.beta2,
            one_minus_beta2: s.one_minus_beta2,
            eps: s.eps,
            bias2_sqrt: s.bias2_sqrt,
            maximize: i32::from(a.params.maximize),
            amsgrad: i32::from(a.params.amsgrad),
        };
        self.adamw.put(stream, &adamw_words(&header, &rows))?;
        self.adamw_shape = Some(Shape {
            dtype: T::DTYPE,
            rows: rows.len(),
            chunks,
        });
        Ok(())
    }

    /// One AdamW launch over the last uploaded table (whatever its tensor count). `grad_scale`
    /// and `found_inf` hold one f32 each when given (read by the kernel, as in
    /// [`super::adamw`]). Queues the kernel; no host sync.
    ///
    /// # Safety
    /// Every tensor of the last [`OptimizerTables::upload_adamw`] must still be allocated when
    /// the kernel runs (the table holds their addresses; a captured graph replays this launch
    /// with whatever the table holds then).
    pub unsafe fn launch_adamw<T: DeviceElement>(
        &self,
        stream: &Stream,
        grad_scale: Option<&dyn DeviceView<f32>>,
        found_inf: Option<&dyn DeviceView<f32>>,
    ) -> Result<(), OpError> {
        let shape = self.shape(self.adamw_shape, T::DTYPE, "upload_adamw")?;
        let one = |what: &'static str, v: Option<&dyn DeviceView<f32>>| match v {
            None => Ok(DevicePtr::NULL),
            Some(v) => {
                check_len(AdamWParams::OP, what, 1, v.len())?;
                ptr(stream, what, v)
            }
        };
        let (grad_scale, found_inf) =
            (one("grad_scale", grad_scale)?, one("found_inf", found_inf)?);
        if shape.rows == 0 {
            return Ok(());
        }
        let table = self.adamw.address(stream)?;
        let header_bytes = std::mem::size_of::<AdamwHeader>();
        let f = kernel_named(stream, SOURCE, dtype_kernel(names::ADAMW_TAB, T::DTYPE))?;
        let mut b = stream.launch_builder(&f);
        b.value(table)
            .value(table.byte_add(header_bytes))
            .value(CHUNK as i64)
            .value(grad_scale)
            .value(found_inf);
        // SAFETY: adamw_tab_<T>(const AdamwHeader*, const AdamwTensor* rows, int64_t chunk,
        // grad_scale, found_inf): the table buffer holds the header then `rows` rows (uploaded
        // before on this stream, so the copy precedes the kernel), built by `adamw_rows` from
        // validated tensors of dtype T whose chunk ranges tile 0..total_chunks; the caller
        // guarantees they are still allocated; grad_scale and found_inf are null or one f32.
        unsafe { b.launch(&chunked_config(stream, shape.chunks)) }?;
        Ok(())
    }

    /// Uploads the table of `tensors` (their addresses and lengths; empty ones left out) for
    /// [`OptimizerTables::launch_norm`] and [`OptimizerTables::launch_non_finite`], and sizes the
    /// norm's partial sums (one f32 per 64 Ki-element chunk, from the device's allocator). One
    /// asynchronous host-to-device copy; no launch.
    pub fn upload_norm<T: DeviceElement>(
        &mut self,
        stream: &Stream,
        tensors: &[&dyn DeviceView<T>],
    ) -> Result<(), OpError> {
        let mut rows: Vec<TensorRef> = tensor_rows(stream, tensors)?;
        let chunks = number_chunks(&mut rows, |r| r.numel, |r, f| r.first_chunk = f);
        self.refs.put(stream, bytemuck::cast_slice(&rows))?;
        let need = (chunks as usize).max(1);
        if self.partials.as_ref().map(|p| p.len()) != Some(need) {
            self.partials = Some(DeviceBuffer::alloc(stream, need)?);
        }
        self.refs_shape = Some(Shape {
            dtype: T::DTYPE,
            rows: rows.len(),
            chunks,
        });
        Ok(())
    }

    /// `norm[0] = √(Σ x²)` over every tensor of the last [`OptimizerTables::upload_norm`]: one
    /// launch for the per-chunk sums (f32 per chunk) and one that adds them in f64, in chunk
    /// order (deterministic, the same figure as [`super::l2_norm`]), and with `clip` also writes
    /// the clip's `grad_scale` (no third launch). No host sync.
    ///
    /// # Safety
    /// Every tensor of the last `upload_norm` must still be allocated when the kernels run.
    pub unsafe fn launch_norm<T: DeviceElement>(
        &self,
        stream: &Stream,
        norm: &mut dyn DeviceViewMut<f32>,
        clip: Option<NormClip<'_>>,
    ) -> Result<(), OpError> {
        let shape = self.shape(self.refs_shape, T::DTYPE, "upload_norm")?;
        check_len(AdamWParams::OP, "norm", 1, norm.len())?;
        let out = ptr(stream, "norm", &*norm)?;
        let clip = match clip {
            None => None,
            Some(c) => {
                let m = c.max_norm;
                if !(m.is_finite() && m > 0.0) {
                    return Err(invalid("clip", "max_norm", m, "must be finite and > 0").into());
                }
                check_len("clip", "grad_scale", 1, c.grad_scale.len())?;
                let scale = match c.loss_scale {
                    Some(s) => {
                        check_len("clip", "loss_scale", 1, s.len())?;
                        ptr(stream, "loss_scale", s)?
                    }
                    None => DevicePtr::NULL,
                };
                Some((m, scale, ptr(stream, "grad_scale", &*c.grad_scale)?))
            }
        };
        let Some(partials) = self.partials.as_ref() else {
            return Err(self.shape(None, T::DTYPE, "upload_norm").unwrap_err());
        };
        let partials = ptr(stream, "partials", partials)?;
        if shape.rows > 0 {
            let table = self.refs.address(stream)?;
            let f = kernel_named(
                stream,
                SOURCE,
                dtype_kernel(names::MULTI_L2NORM_TAB, T::DTYPE),
            )?;
            let mut b = stream.launch_builder(&f);
            b.value(table)
                .value(shape.rows as i32)
                .value(shape.chunks)
                .value(CHUNK as i64)
                .value(partials);
            // SAFETY: multi_l2norm_tab_<T>(const TensorRef* rows, int count, int64_t
            // total_chunks, int64_t chunk, float* partials): the table holds `rows` rows of
            // dtype-T tensors (uploaded before on this stream) tiling 0..total_chunks, which the
            // caller guarantees are allocated; partials holds max(1, total_chunks) f32.
            unsafe { b.launch(&chunked_config(stream, shape.chunks)) }?;
        }
        let cfg = LaunchConfig {
            grid: (1, 1, 1),
            block: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        match clip {
            None => {
                let f = kernel_named(stream, SOURCE, names::MULTI_L2NORM_FINALIZE_F32)?;
                let mut b = stream.launch_builder(&f);
                b.value(partials).value(shape.chunks).value(out);
                // SAFETY: multi_l2norm_finalize_f32(const float* partials, int64_t count,
                // float* out): `chunks` partials written by the launch before on this stream
                // (none read when 0); `norm` holds one f32.
                unsafe { b.launch(&cfg) }?;
            }
            Some((max_norm, loss_scale, grad_scale)) => {
                let f = kernel_named(stream, SOURCE, names::MULTI_L2NORM_FINALIZE_CLIP_F32)?;
                let mut b = stream.launch_builder(&f);
                b.value(partials)
                    .value(shape.chunks)
                    .value(out)
                    .value(loss_scale)
                    .value(max_norm)
                    .value(grad_scale);
                // SAFETY: multi_l2norm_finalize_clip_f32(const float* partials, int64_t count,
                // float* norm, const float* loss_scale or null, float max_norm, float*
                // grad_scale): partials as above; norm, loss_scale and grad_scale one f32 each.
                unsafe { b.launch(&cfg) }?;
            }
        }
        Ok(())
    }

    /// `found_inf[0] = 1.0` if any element of the last [`OptimizerTables::upload_norm`]'s tensors
    /// is NaN or ±inf, else 0.0: an async memset and one launch. No host sync.
    ///
    /// # Safety
    /// Every tensor of the last `upload_norm` must still be allocated when the kernel runs.
    pub unsafe fn launch_non_finite<T: DeviceElement>(
        &self,
        stream: &Stream,
        found_inf: &mut dyn DeviceViewMut<f32>,
    ) -> Result<(), OpError> {
        let shape = self.shape(self.refs_shape, T::DTYPE, "upload_norm")?;
        check_len(AdamWParams::OP, "found_inf", 1, found_inf.len())?;
        let out = ptr(stream, "found_inf", &*found_inf)?;
        stream.memset_zero(&mut *found_inf)?;
        if shape.rows == 0 {
            return Ok(());
        }
        let table = self.refs.address(stream)?;
        let f = kernel_named(
            stream,
            SOURCE,
            dtype_kernel(names::MULTI_NONFINITE_TAB, T::DTYPE),
        )?;
        let mut b = stream.launch_builder(&f);
        b.value(table)
            .value(shape.rows as i32)
            .value(shape.chunks)
            .value(CHUNK as i64)
            .value(out);
        // SAFETY: multi_nonfinite_tab_<T>(const TensorRef* rows, int count, int64_t
        // total_chunks, int64_t chunk, float* found_inf): the table as in `launch_norm`;
        // found_inf holds one f32.
        unsafe { b.launch(&chunked_config(stream, shape.chunks)) }?;
        Ok(())
    }

    /// The shape of an uploaded table, checked against the launch's dtype.
    fn shape(
        &self,
        shape: Option<Shape>,
        dtype: DType,
        upload: &'static str,
    ) -> Result<Shape, OpError> {
        match shape {
            Some(s) if s.dtype == dtype => Ok(s),
            Some(s) => Err(invalid(
                AdamWParams::OP,
                "launch dtype",
                format!("{dtype:?} (the table holds {:?} tensors)", s.dtype),
                "must be the dtype of the tensors of the last upload",
            )
            .into()),
            None => Err(invalid(
                AdamWParams::OP,
                "OptimizerTables",
                format!("empty (launched before {upload})"),
                "call the matching upload_* first",
            )
            .into()),
        }
    }
}

/// One block per chunk up to [`BLOCKS_PER_CU`] per compute unit, as the by-value launchers.
fn chunked_config(stream: &Stream, chunks: i64) -> LaunchConfig {
    let grid = grid_for(
        chunks as u64,
        1,
        stream.device().compute_units(),
        BLOCKS_PER_CU,
    );
    LaunchConfig {
        grid: (grid, 1, 1),
        block: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// [`AdamW`] on `stream` in one launch whatever the tensor count: [`OptimizerTables::upload_adamw`]
/// then [`OptimizerTables::launch_adamw`]. Same results as [`super::adamw`], bit for bit.
pub fn adamw_tabled<T: DeviceElement>(
    stream: &Stream,
    a: AdamW<'_, '_, OnDevice, T>,
    tables: &mut OptimizerTables,
) -> Result<(), OpError> {
    tables.upload_adamw(stream, &a)?;
    // SAFETY: the tensors just uploaded are borrowed by `a` until this returns, and the kernel is
    // queued before; the allocator was told they are used on `stream` (`adamw_rows` records
    // them), so their memory is not reused before the kernel ran.
    unsafe { tables.launch_adamw::<T>(stream, a.grad_scale, a.found_inf) }
}

/// [`super::l2_norm`] over any number of tensors in one launch plus the final reduction (and
/// with `clip`, the clip's `grad_scale` from the same final launch): upload then launch.
pub fn l2_norm_tabled<T: DeviceElement>(
    stream: &Stream,
    tensors: &[&dyn DeviceView<T>],
    norm: &mut dyn DeviceViewMut<f32>,
    clip: Option<NormClip<'_>>,
    tables: &mut OptimizerTables,
) -> Result<(), OpError> {
    tables.upload_norm(stream, tensors)?;
    // SAFETY: as in `adamw_tabled`: the tensors are borrowed until this returns and recorded on
    // `stream` by the upload.
    unsafe { tables.launch_norm::<T>(stream, norm, clip) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_and_rows_have_the_kernels_layout() {
        assert_eq!(std::mem::size_of::<AdamwHeader>(), 48);
        assert_eq!(std::mem::offset_of!(AdamwHeader, beta1), 16);
        assert_eq!(std::mem::offset_of!(AdamwHeader, maximize), 40);
        let header = AdamwHeader {
            count: 2,
            total_chunks: 3,
            ..AdamwHeader::default()
        };
        let rows = [AdamwDesc::default(), AdamwDesc::default()];
        let words = adamw_words(&header, &rows);
        assert_eq!(words.len(), (48 + 2 * 72) / 8);
        assert_eq!((words[0], words[1]), (2, 3));
    }

    #[test]
    fn chunks_are_numbered_across_every_row() {
        let mut rows: Vec<TensorRef> = [CHUNK as i64 + 1, 5, 2 * CHUNK as i64]
            .iter()
            .map(|&n| TensorRef {
                numel: n,
                ..TensorRef::default()
            })
            .collect();
        let total = number_chunks(&mut rows, |r| r.numel, |r, f| r.first_chunk = f);
        assert_eq!(total, 5);
        assert_eq!(
            rows.iter().map(|r| r.first_chunk).collect::<Vec<_>>(),
            [0, 2, 3]
        );
    }
}
