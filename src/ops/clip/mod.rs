//! Gradient clipping by the global L2 norm (`torch.nn.utils.clip_grad_norm_`) without a host
//! round trip: AdamW's device-side `grad_scale` from [`crate::ops::l2_norm`]'s output. The
//! argument struct ([`ClipGradScale`]) is shared by the CPU reference ([`crate::cpu`]) and the launcher
//! (`kernels/clip.hip`).

pub(crate) mod cpu;
mod device;
#[cfg(feature = "golden")]
mod golden;

pub use device::clip_grad_scale;
#[cfg(feature = "golden")]
pub use golden::ClipCase;
#[cfg(feature = "golden")]
pub(crate) use golden::GOLDEN;

use crate::params::{check_len, invalid, ShapeError, Space, TensorLen};

// Each struct runs itself on its space (`ops::Run`): the CPU reference, or the launcher.
crate::ops::run::launch! {
    ClipGradScale['a] => clip_grad_scale, clip_grad_scale;
}

/// Added to the norm before dividing, as `clip_grad_norm_` does.
pub const CLIP_EPS: f64 = 1e-6;

/// The clipping threshold.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClipParams {
    /// `max_norm` of `clip_grad_norm_` (finite, > 0).
    pub max_norm: f32,
}

/// `grad_scale = s / min(1, max_norm / (norm/s + 1e-6))` with `s` the loss scale (1 if absent):
/// dividing the stored (scaled) gradients by it unscales and clips them at once.
pub struct ClipGradScale<'a, S: Space> {
    /// `max_norm`.
    pub params: ClipParams,
    /// `[1]`: the L2 norm of the gradients as stored (still multiplied by the loss scale).
    pub norm: S::In<'a, f32>,
    /// Optional `[1]`: the loss scale the gradients carry (GradScaler's scale).
    pub loss_scale: Option<S::In<'a, f32>>,
    /// `[1]`: AdamW's `grad_scale` (overwritten).
    pub grad_scale: S::Out<'a, f32>,
}

impl<S: Space> ClipGradScale<'_, S> {
    /// Check `max_norm` and the three one-element tensors.
    pub fn validate(&self) -> Result<(), ShapeError> {
        let m = self.params.max_norm;
        if !(m.is_finite() && m > 0.0) {
            return Err(invalid("clip", "max_norm", m, "must be finite and > 0"));
        }
        check_len("clip", "norm", 1, self.norm.numel())?;
        if let Some(s) = &self.loss_scale {
            check_len("clip", "loss_scale", 1, s.numel())?;
        }
        check_len("clip", "grad_scale", 1, self.grad_scale.numel())
    }
}
