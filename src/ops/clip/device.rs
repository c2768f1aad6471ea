//! The clip grad_scale on the device (`kernels/clip.hip`): one thread reads the norm (and the
//! loss scale) from device memory and writes AdamW's `grad_scale` there, so clipping needs no
//! host round trip: `l2_norm` → `clip_grad_scale` → `adamw` with `grad_scale`.
//!
//! Never run on a GPU: compiled and statically checked for gfx906; the device tests run on
//! hip-emu (the CPU-emulated HIP device, `tests/device_trainops.rs`).

use super::ClipGradScale;
use crate::embedded::kernel_names::clip as names;
use crate::ops::launch::{kernel_named, ptr};
use crate::ops::OpError;
use crate::params::OnDevice;
use hip_rt::{DevicePtr, LaunchConfig, Stream};

/// [`ClipGradScale`] on `stream` ([`crate::cpu::clip_grad_scale`]'s semantics in f32; the loss
/// scale's value is not checked on the host). Queues one tiny kernel; no host sync.
pub fn clip_grad_scale(stream: &Stream, a: ClipGradScale<'_, OnDevice>) -> Result<(), OpError> {
    a.validate()?;
    let norm = ptr(stream, "norm", a.norm)?;
    let scale = match a.loss_scale {
        Some(s) => ptr(stream, "loss_scale", s)?,
        None => DevicePtr::NULL,
    };
    let out = ptr(stream, "grad_scale", &*a.grad_scale)?;
    let f = kernel_named(stream, "clip", names::CLIP_GRAD_SCALE_F32)?;
    let mut b = stream.launch_builder(&f);
    b.value(norm)
        .value(scale)
        .value(a.params.max_norm)
        .value(out);
    let cfg = LaunchConfig {
        grid: (1, 1, 1),
        block: (64, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: clip_grad_scale_f32(const float* norm, const float* loss_scale or null,
    // float max_norm, float* grad_scale): each pointer is a one-element f32 buffer on the
    // stream's device (validated); one thread reads and writes them.
    unsafe { b.launch(&cfg) }?;
    Ok(())
}
