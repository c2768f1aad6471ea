//! Fused multi-tensor AdamW and the trainer helpers (non-finite check, global L2 norm) on the
//! device (`kernels/adamw.hip`). [`adamw`] / [`adamw_master`] take the CPU reference's arguments
//! ([`crate::cpu::adamw`], [`crate::cpu::adamw_master`]) plus the stream; [`adamw_multi`] updates
//! many tensors in one launch with `grad_scale` and `found_inf` read from device memory, so a
//! loss-scaled step needs no host sync.
//!
//! Never run on a GPU: the chunk tables are unit-tested, the kernels are compiled and statically
//! checked for gfx906, the device tests have not run.

use super::launch::{grid_for, kernel, kernel_named, ptr, DeviceElement};
use super::OpError;
use crate::params::{check_len, AdamWConfig, AdamWStep};
use hip_rt::memory::buffer::{DeviceBuffer, DeviceView, DeviceViewMut};
use hip_rt::{DevicePtr, DeviceRepr, Function, LaunchBuilder, LaunchConfig, Stream};

const SOURCE: &str = "adamw";
/// Elements per chunk (one block's unit of work).
pub const CHUNK: usize = 1 << 16;
/// Threads per block of every kernel in `kernels/adamw.hip`.
const BLOCK: u32 = 256;
/// Grid cap, in blocks per compute unit (blocks walk the chunks grid-stride).
const BLOCKS_PER_CU: u32 = 8;

/// One tensor of a fused AdamW launch. `max_exp_avg_sq` is given iff `amsgrad`; with `master`
/// (f32 master weights) the update runs on `master` and `param` (the model copy) is overwritten
/// with it rounded to `T` (and not read).
pub struct AdamwTensor<'a, T: DeviceElement> {
    /// Parameters (the model copy when `master` is given).
    pub param: &'a mut dyn DeviceViewMut<T>,
    /// Gradients, same length and type.
    pub grad: &'a dyn DeviceView<T>,
    /// First moment (f32).
    pub exp_avg: &'a mut dyn DeviceViewMut<f32>,
    /// Second moment (f32).
    pub exp_avg_sq: &'a mut dyn DeviceViewMut<f32>,
    /// Running max of the second moment (f32), amsgrad only.
    pub max_exp_avg_sq: Option<&'a mut dyn DeviceViewMut<f32>>,
    /// f32 master weights.
    pub master: Option<&'a mut dyn DeviceViewMut<f32>>,
}

/// Per-step inputs of [`adamw_multi`], the scaler's values left in device memory.
pub struct DeviceStep<'a> {
    /// Step number after increment (≥ 1).
    pub step: u64,
    /// One f32: gradients are divided by it (a loss scaler's scale). `None` = 1.
    pub grad_scale: Option<&'a dyn DeviceView<f32>>,
    /// One f32: when non-zero at run time the kernel changes nothing. `None` = 0.
    pub found_inf: Option<&'a dyn DeviceView<f32>>,
}

/// A tensor row of the AdamW kernel's table (`AdamwTensor` in `kernels/adamw.hip`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
struct AdamwDesc {
    param: u64,
    grad: u64,
    exp_avg: u64,
    exp_avg_sq: u64,
    max_exp_avg_sq: u64,
    master: u64,
    numel: i64,
    first_chunk: i64,
}

// SAFETY: `#[repr(C)]`, six u64 device addresses and two i64 = the kernel's struct of six
// pointers and two int64_t (64 bytes, no padding, any bit pattern valid).
unsafe impl DeviceRepr for AdamwDesc {}

/// A tensor row of the helpers' table (`TensorRef` in `kernels/adamw.hip`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
struct TensorRef {
    data: u64,
    numel: i64,
    first_chunk: i64,
    reserved: i64,
}

// SAFETY: `#[repr(C)]`, one u64 device address and three i64 = the kernel's struct of one
// pointer and three int64_t (32 bytes, no padding, any bit pattern valid).
unsafe impl DeviceRepr for TensorRef {}

/// The first chunk of each tensor and the total, for tensors of `lens` elements and chunks of
/// `chunk`. Empty tensors own no chunk.
fn chunk_starts(lens: &[usize], chunk: usize) -> (Vec<i64>, i64) {
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
struct KernelScalars {
    beta1: f32,
    one_minus_beta1: f32,
    beta2: f32,
    one_minus_beta2: f32,
    eps: f32,
    decay: f32,
    step_size: f32,
    bias2_sqrt: f32,
}

impl KernelScalars {
    fn new(c: &AdamWConfig, step: u64) -> KernelScalars {
        let t = step as f64;
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

/// One fused AdamW step over every tensor in `tensors`, in one launch. Every tensor is validated
/// like [`crate::cpu::adamw`] before anything runs; `grad_scale` and `found_inf`, when given, must
/// hold exactly one f32 each and are read by the kernel (no host sync).
pub fn adamw_multi<T: DeviceElement>(
    stream: &Stream,
    config: &AdamWConfig,
    step: &DeviceStep<'_>,
    tensors: &mut [AdamwTensor<'_, T>],
) -> Result<(), OpError> {
    let host_step = AdamWStep::new(step.step);
    for t in tensors.iter() {
        config.validate(
            &host_step,
            t.param.len(),
            t.grad.len(),
            t.exp_avg.len(),
            t.exp_avg_sq.len(),
            t.max_exp_avg_sq.as_ref().map(|m| m.len()),
            t.master.as_ref().map(|m| m.len()),
        )?;
    }
    let scalar_ptr =
        |what: &'static str, v: Option<&dyn DeviceView<f32>>| -> Result<DevicePtr, OpError> {
            match v {
                None => Ok(DevicePtr::NULL),
                Some(v) => {
                    check_len(AdamWConfig::OP, what, 1, v.len())?;
                    ptr(stream, what, v)
                }
            }
        };
    let grad_scale = scalar_ptr("grad_scale", step.grad_scale)?;
    let found_inf = scalar_ptr("found_inf", step.found_inf)?;
    let live: Vec<&AdamwTensor<'_, T>> = tensors.iter().filter(|t| t.param.len() > 0).collect();
    let (starts, total) = chunk_starts(
        &live.iter().map(|t| t.param.len()).collect::<Vec<_>>(),
        CHUNK,
    );
    let mut table = Vec::with_capacity(live.len());
    for (t, first_chunk) in live.iter().zip(starts) {
        let opt = |what, v: &Option<&mut dyn DeviceViewMut<f32>>| match v {
            Some(v) => ptr(stream, what, &**v).map(|p| p.0),
            None => Ok(0),
        };
        table.push(AdamwDesc {
            param: ptr(stream, "param", &*t.param)?.0,
            grad: ptr(stream, "grad", t.grad)?.0,
            exp_avg: ptr(stream, "exp_avg", &*t.exp_avg)?.0,
            exp_avg_sq: ptr(stream, "exp_avg_sq", &*t.exp_avg_sq)?.0,
            max_exp_avg_sq: opt("max_exp_avg_sq", &t.max_exp_avg_sq)?,
            master: opt("master", &t.master)?,
            numel: t.param.len() as i64,
            first_chunk,
        });
    }
    if table.is_empty() {
        return Ok(());
    }
    let f = kernel::<T>(stream, SOURCE, "adamw")?;
    let device_table = DeviceBuffer::from_slice(stream, &table)?;
    let s = KernelScalars::new(config, step.step);
    let (cfg, mut b) = chunked_launch(stream, &f, &device_table, total);
    for v in [
        s.beta1,
        s.one_minus_beta1,
        s.beta2,
        s.one_minus_beta2,
        s.eps,
        s.decay,
        s.step_size,
        s.bias2_sqrt,
    ] {
        b.value(v);
    }
    b.value(i32::from(config.maximize))
        .value(i32::from(config.amsgrad))
        .value(grad_scale)
        .value(found_inf);
    // SAFETY: adamw_<T>'s parameters in order (table pointer, int count, int64_t total_chunks,
    // int64_t chunk, eight floats, int maximize, int amsgrad, grad_scale and found_inf pointers
    // or null). The table holds `count` rows whose pointers are the validated buffers (equal
    // lengths, max_exp_avg_sq present iff amsgrad, all on this device and recorded on this
    // stream) and whose chunk ranges tile 0..total; the table buffer is freed stream-ordered
    // after the kernel.
    unsafe { b.launch(&cfg) }?;
    Ok(())
}

/// [`crate::cpu::adamw`] on the device, host-side `step` (a `grad_scale` is copied to the device;
/// `found_inf` skips the launch).
#[allow(clippy::too_many_arguments)]
pub fn adamw<'a, T: DeviceElement>(
    stream: &Stream,
    config: &AdamWConfig,
    step: &AdamWStep,
    param: &'a mut dyn DeviceViewMut<T>,
    grad: &'a dyn DeviceView<T>,
    exp_avg: &'a mut dyn DeviceViewMut<f32>,
    exp_avg_sq: &'a mut dyn DeviceViewMut<f32>,
    max_exp_avg_sq: Option<&'a mut dyn DeviceViewMut<f32>>,
) -> Result<(), OpError> {
    let t = AdamwTensor {
        param,
        grad,
        exp_avg,
        exp_avg_sq,
        max_exp_avg_sq,
        master: None,
    };
    host_step(stream, config, step, t)
}

/// [`crate::cpu::adamw_master`] on the device: the update runs on the f32 `master` weights and
/// `param` (the model copy) is overwritten with them rounded to `T`.
#[allow(clippy::too_many_arguments)]
pub fn adamw_master<'a, T: DeviceElement>(
    stream: &Stream,
    config: &AdamWConfig,
    step: &AdamWStep,
    master: &'a mut dyn DeviceViewMut<f32>,
    param: &'a mut dyn DeviceViewMut<T>,
    grad: &'a dyn DeviceView<T>,
    exp_avg: &'a mut dyn DeviceViewMut<f32>,
    exp_avg_sq: &'a mut dyn DeviceViewMut<f32>,
    max_exp_avg_sq: Option<&'a mut dyn DeviceViewMut<f32>>,
) -> Result<(), OpError> {
    let t = AdamwTensor {
        param,
        grad,
        exp_avg,
        exp_avg_sq,
        max_exp_avg_sq,
        master: Some(master),
    };
    host_step(stream, config, step, t)
}

fn host_step<T: DeviceElement>(
    stream: &Stream,
    config: &AdamWConfig,
    step: &AdamWStep,
    t: AdamwTensor<'_, T>,
) -> Result<(), OpError> {
    config.validate(
        step,
        t.param.len(),
        t.grad.len(),
        t.exp_avg.len(),
        t.exp_avg_sq.len(),
        t.max_exp_avg_sq.as_ref().map(|m| m.len()),
        t.master.as_ref().map(|m| m.len()),
    )?;
    if step.found_inf {
        return Ok(());
    }
    let scale = step
        .grad_scale
        .map(|s| DeviceBuffer::from_slice(stream, &[s]))
        .transpose()?;
    let dstep = DeviceStep {
        step: step.step,
        grad_scale: scale.as_ref().map(|b| b as &dyn DeviceView<f32>),
        found_inf: None,
    };
    adamw_multi(stream, config, &dstep, &mut [t])
}

/// The helpers' table for `tensors` (empty ones left out) and its chunk count.
fn tensor_table<T: DeviceElement>(
    stream: &Stream,
    tensors: &[&dyn DeviceView<T>],
) -> Result<(Vec<TensorRef>, i64), OpError> {
    let live: Vec<&&dyn DeviceView<T>> = tensors.iter().filter(|t| !t.is_empty()).collect();
    let (starts, total) = chunk_starts(&live.iter().map(|t| t.len()).collect::<Vec<_>>(), CHUNK);
    let mut table = Vec::with_capacity(live.len());
    for (t, first_chunk) in live.into_iter().zip(starts) {
        let data = ptr(stream, "tensors", *t)?.0;
        table.push(TensorRef {
            data,
            numel: t.len() as i64,
            first_chunk,
            reserved: 0,
        });
    }
    Ok((table, total))
}

/// The launch of a chunked multi-tensor kernel of `kernels/adamw.hip` over `total` chunks:
/// one block per chunk up to [`BLOCKS_PER_CU`] per compute unit (blocks walk the rest
/// grid-stride), and a builder holding the leading arguments every such kernel takes (table
/// pointer, int row count, int64_t total_chunks, int64_t chunk).
fn chunked_launch<'a, R: hip_rt::Element>(
    stream: &'a Stream,
    function: &'a Function,
    table: &DeviceBuffer<R>,
    total: i64,
) -> (LaunchConfig, LaunchBuilder<'a>) {
    let grid = grid_for(
        total as u64,
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
    b.value(table.device_ptr())
        .value(table.len() as i32)
        .value(total)
        .value(CHUNK as i64);
    (cfg, b)
}

/// Sets `found_inf[0]` to 1.0 if any element of any tensor is NaN or ±inf, else 0.0, on the
/// device (no host sync): [`crate::cpu::non_finite`] with the answer left in device memory.
pub fn non_finite<T: DeviceElement>(
    stream: &Stream,
    tensors: &[&dyn DeviceView<T>],
    found_inf: &mut impl DeviceViewMut<f32>,
) -> Result<(), OpError> {
    check_len(AdamWConfig::OP, "found_inf", 1, found_inf.len())?;
    let out = ptr(stream, "found_inf", found_inf)?;
    let (table, total) = tensor_table(stream, tensors)?;
    let f = kernel::<T>(stream, SOURCE, "multi_nonfinite")?;
    stream.memset_zero(found_inf)?;
    if table.is_empty() {
        return Ok(());
    }
    let device_table = DeviceBuffer::from_slice(stream, &table)?;
    let (cfg, mut b) = chunked_launch(stream, &f, &device_table, total);
    b.value(out);
    // SAFETY: multi_nonfinite_<T>'s parameters (table pointer, int count, int64_t total_chunks,
    // int64_t chunk, float* found_inf); the table rows point at the given tensors (on this device,
    // recorded on this stream) with their lengths and chunk ranges tiling 0..total; found_inf
    // holds one f32.
    unsafe { b.launch(&cfg) }?;
    Ok(())
}

/// Writes `norm[0]` = √(Σ x²) over every element of every tensor, on the device (no host sync):
/// [`crate::cpu::l2_norm`] with the answer left in device memory, as f32. Squares are summed in
/// f32 per 64 Ki-element chunk and the chunk sums in f64, in a fixed order (deterministic).
pub fn l2_norm<T: DeviceElement>(
    stream: &Stream,
    tensors: &[&dyn DeviceView<T>],
    norm: &mut impl DeviceViewMut<f32>,
) -> Result<(), OpError> {
    check_len(AdamWConfig::OP, "norm", 1, norm.len())?;
    let out = ptr(stream, "norm", norm)?;
    let (table, total) = tensor_table(stream, tensors)?;
    let partial_kernel = kernel::<T>(stream, SOURCE, "multi_l2norm")?;
    let finalize = kernel_named(stream, SOURCE, "multi_l2norm_finalize_f32")?;
    let partials: DeviceBuffer<f32> = DeviceBuffer::alloc(stream, total as usize)?;
    if !table.is_empty() {
        let device_table = DeviceBuffer::from_slice(stream, &table)?;
        let (cfg, mut b) = chunked_launch(stream, &partial_kernel, &device_table, total);
        b.value(partials.device_ptr());
        // SAFETY: multi_l2norm_<T>'s parameters (table pointer, int count, int64_t total_chunks,
        // int64_t chunk, float* partials); the table is as in `non_finite`, and `partials` holds
        // one f32 per chunk.
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
    // float* out); `partials` holds `total` values written by the launch before on this stream
    // (never read when total is 0), `norm` holds one f32.
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
    fn kernel_scalars_carry_the_bias_corrections() {
        let c = AdamWConfig {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.1,
            ..AdamWConfig::default()
        };
        let s = KernelScalars::new(&c, 1);
        assert_eq!(s.step_size, (1e-3f64 / 0.1) as f32);
        assert_eq!(s.bias2_sqrt, 0.001f64.sqrt() as f32);
        assert_eq!(s.decay, (1.0 - 1e-4f64) as f32);
        assert_eq!(
            (s.one_minus_beta1, s.one_minus_beta2),
            (0.1f64 as f32, (1.0 - 0.999f64) as f32)
        );
        let late = KernelScalars::new(&c, 100_000);
        assert_eq!((late.step_size, late.bias2_sqrt), (1e-3, 1.0));
    }

    #[test]
    fn table_rows_have_the_kernels_layout() {
        assert_eq!(std::mem::size_of::<AdamwDesc>(), 64);
        assert_eq!(std::mem::size_of::<TensorRef>(), 32);
        assert_eq!(std::mem::offset_of!(AdamwDesc, numel), 48);
        assert_eq!(std::mem::offset_of!(TensorRef, first_chunk), 16);
    }
}
