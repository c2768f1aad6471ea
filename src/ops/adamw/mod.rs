//! Fused multi-tensor AdamW (torch.optim.AdamW's semantics) and the trainer helpers (non-finite
//! check, global L2 norm): the op's parameters and argument structs ([`AdamW`],
//! [`AdamWTensor`]), shared by the CPU reference ([`crate::cpu`]) and the launchers
//! (`kernels/adamw.hip`).

pub(crate) mod cpu;
mod device;
#[cfg(feature = "golden")]
mod golden;

pub use device::{adamw, l2_norm, non_finite, ADAMW_TABLE_ROWS, CHUNK, REF_TABLE_ROWS};
#[cfg(feature = "golden")]
pub use golden::AdamWCase;
#[cfg(feature = "golden")]
pub(crate) use golden::GOLDEN;

use crate::params::{check_len, invalid, opt_numel, ShapeError, Space, TensorLen};

// Each struct runs itself on its space (`ops::Run`): the CPU reference, or the launcher.
crate::ops::run::launch! {
    AdamW['a, 'b] T => adamw, adamw;
}

/// AdamW hyper-parameters, with torch.optim.AdamW's meaning (decoupled weight decay), and the
/// step number.
///
/// Held in `f64` like torch's Python floats; kernels take them as `f32` (bias corrections are
/// computed in f64 on the host first).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWParams {
    /// Learning rate (≥ 0).
    pub lr: f64,
    /// First-moment decay, in [0, 1).
    pub beta1: f64,
    /// Second-moment decay, in [0, 1).
    pub beta2: f64,
    /// Added to the bias-corrected √v (≥ 0).
    pub eps: f64,
    /// Decoupled weight decay (≥ 0): `p ← p·(1 − lr·weight_decay)` first.
    pub weight_decay: f64,
    /// Maximize the objective (the gradient is negated).
    pub maximize: bool,
    /// Use the running maximum of `v` in the denominator (needs `max_exp_avg_sq`).
    pub amsgrad: bool,
    /// Step number after increment (≥ 1): the first update uses 1.
    pub step: u64,
}

impl Default for AdamWParams {
    /// torch.optim.AdamW's defaults (lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 1e-2),
    /// step 1.
    fn default() -> Self {
        Self {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 1e-2,
            maximize: false,
            amsgrad: false,
            step: 1,
        }
    }
}

impl AdamWParams {
    /// Operation name used in errors.
    pub const OP: &'static str = "adamw";

    /// Check the hyper-parameters (torch's ranges) and the step.
    pub fn validate(&self) -> Result<(), ShapeError> {
        let op = Self::OP;
        if !(self.lr.is_finite() && self.lr >= 0.0) {
            return Err(invalid(op, "lr", self.lr, "must be finite and >= 0"));
        }
        for (name, b) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(0.0..1.0).contains(&b) {
                return Err(invalid(op, name, b, "must be in [0, 1)"));
            }
        }
        if !(self.eps.is_finite() && self.eps >= 0.0) {
            return Err(invalid(op, "eps", self.eps, "must be finite and >= 0"));
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return Err(invalid(
                op,
                "weight_decay",
                self.weight_decay,
                "must be finite and >= 0",
            ));
        }
        if self.step == 0 {
            return Err(invalid(
                op,
                "step",
                0,
                "must be >= 1 (the step count after increment)",
            ));
        }
        Ok(())
    }
}

/// The tensors of one parameter in an AdamW step. `max_exp_avg_sq` is given iff `amsgrad`; with
/// `master` (f32 master weights) the update runs on `master` and `param` (the model copy) is
/// overwritten with it rounded to `T` (and not read).
///
/// `weight_decay` and `lr_scale` override the call's hyper-parameters for this tensor alone, as
/// torch's param groups do (a group with `weight_decay = 0` for biases and layer norms, a group
/// with its own `lr`): tensors that differ only in these still go in one [`AdamW`] call, one
/// launch per [`ADAMW_TABLE_ROWS`] tensors on the device. See [`AdamWTensor::hyper`].
pub struct AdamWTensor<'a, S: Space, T: hip_rt::Element> {
    /// Parameters (the model copy when `master` is given), updated in place.
    pub param: S::Out<'a, T>,
    /// Gradients, same length and type.
    pub grad: S::In<'a, T>,
    /// First moment (f32).
    pub exp_avg: S::Out<'a, f32>,
    /// Second moment (f32).
    pub exp_avg_sq: S::Out<'a, f32>,
    /// Running max of the second moment (f32), amsgrad only.
    pub max_exp_avg_sq: Option<S::Out<'a, f32>>,
    /// f32 master weights.
    pub master: Option<S::Out<'a, f32>>,
    /// This tensor's decoupled weight decay (finite, ≥ 0) in place of
    /// [`AdamWParams::weight_decay`]; `None`: the call's.
    pub weight_decay: Option<f64>,
    /// This tensor's learning rate is `lr · lr_scale` (finite, ≥ 0); `None`: 1.
    pub lr_scale: Option<f64>,
}

impl<'a, S: Space, T: hip_rt::Element> AdamWTensor<'a, S, T> {
    /// One tensor with its gradient and moments: no amsgrad state, no master weights, the
    /// call's weight decay and learning rate (set the optional fields with the `with_` methods).
    pub fn new(
        param: S::Out<'a, T>,
        grad: S::In<'a, T>,
        exp_avg: S::Out<'a, f32>,
        exp_avg_sq: S::Out<'a, f32>,
    ) -> Self {
        Self {
            param,
            grad,
            exp_avg,
            exp_avg_sq,
            max_exp_avg_sq: None,
            master: None,
            weight_decay: None,
            lr_scale: None,
        }
    }

    /// The same, updating f32 master weights (`param` then receives their rounded copy).
    pub fn with_master(self, master: S::Out<'a, f32>) -> Self {
        Self {
            master: Some(master),
            ..self
        }
    }

    /// The same with amsgrad's running maximum of the second moment.
    pub fn with_max_exp_avg_sq(self, max_exp_avg_sq: S::Out<'a, f32>) -> Self {
        Self {
            max_exp_avg_sq: Some(max_exp_avg_sq),
            ..self
        }
    }

    /// The same with this tensor's own decoupled weight decay (0 for biases and norms).
    pub fn with_weight_decay(self, weight_decay: f64) -> Self {
        Self {
            weight_decay: Some(weight_decay),
            ..self
        }
    }

    /// The same with this tensor's learning rate scaled by `lr_scale`.
    pub fn with_lr_scale(self, lr_scale: f64) -> Self {
        Self {
            lr_scale: Some(lr_scale),
            ..self
        }
    }

    /// The hyper-parameters this tensor is updated with: `c` with `lr · lr_scale` and this
    /// tensor's `weight_decay` when given (exactly `c` when neither is), validated.
    pub fn hyper(&self, c: &AdamWParams) -> Result<AdamWParams, ShapeError> {
        let op = AdamWParams::OP;
        for (name, v) in [
            ("AdamWTensor::weight_decay", self.weight_decay),
            ("AdamWTensor::lr_scale", self.lr_scale),
        ] {
            if let Some(v) = v.filter(|v| !(v.is_finite() && *v >= 0.0)) {
                return Err(invalid(op, name, v, "must be finite and >= 0 (or None)"));
            }
        }
        let h = AdamWParams {
            lr: self.lr_scale.map_or(c.lr, |s| c.lr * s),
            weight_decay: self.weight_decay.unwrap_or(c.weight_decay),
            ..*c
        };
        h.validate()?;
        Ok(h)
    }

    /// Check the lengths and the presence of `max_exp_avg_sq` (iff `amsgrad`).
    pub fn validate(&self, amsgrad: bool) -> Result<(), ShapeError> {
        let op = AdamWParams::OP;
        let param = self.param.numel();
        check_len(op, "grad", param, self.grad.numel())?;
        check_len(op, "exp_avg", param, self.exp_avg.numel())?;
        check_len(op, "exp_avg_sq", param, self.exp_avg_sq.numel())?;
        match (amsgrad, opt_numel(&self.max_exp_avg_sq)) {
            (true, Some(len)) => check_len(op, "max_exp_avg_sq", param, len)?,
            (false, None) => {}
            (true, None) => {
                return Err(ShapeError::Presence {
                    op,
                    tensor: "max_exp_avg_sq",
                    required: true,
                    fix: "amsgrad needs the running maximum of exp_avg_sq",
                })
            }
            (false, Some(_)) => {
                return Err(ShapeError::Presence {
                    op,
                    tensor: "max_exp_avg_sq",
                    required: false,
                    fix: "set amsgrad = true or drop it",
                })
            }
        }
        if let Some(len) = opt_numel(&self.master) {
            check_len(op, "master", param, len)?;
        }
        Ok(())
    }
}

/// One AdamW step over every tensor in `tensors`.
///
/// Per element: `g = grad / grad_scale` (if given), negated if `maximize`; `p ← p·(1 − lr·wd)`;
/// `m ← β1·m + (1 − β1)·g`; `v ← β2·v + (1 − β2)·g²`; with amsgrad `v̂ ← max(v̂, v)` and
/// `denom = √v̂ / √(1 − β2^step) + eps` (else `√v`); `p ← p − lr/(1 − β1^step) · m / denom`.
/// When `found_inf` holds a non-zero value nothing at all is written. `grad_scale` and
/// `found_inf` are one-element f32 tensors so that a device step reads them from device memory
/// (a loss scaler's values, no host sync).
pub struct AdamW<'a, 'b, S: Space, T: hip_rt::Element> {
    /// Hyper-parameters and step.
    pub params: AdamWParams,
    /// One f32: gradients are divided by it (finite, > 0; checked on the host only). `None` = 1.
    pub grad_scale: Option<S::In<'a, f32>>,
    /// One f32: when non-zero the step changes nothing. `None` = 0.
    pub found_inf: Option<S::In<'a, f32>>,
    /// The parameters to update.
    pub tensors: &'b mut [AdamWTensor<'a, S, T>],
}

impl<S: Space, T: hip_rt::Element> AdamW<'_, '_, S, T> {
    /// Check the hyper-parameters, the one-element scalars and every tensor (the CPU reference
    /// and the launcher call this first).
    pub fn validate(&self) -> Result<(), ShapeError> {
        self.params.validate()?;
        let op = AdamWParams::OP;
        if let Some(len) = opt_numel(&self.grad_scale) {
            check_len(op, "grad_scale", 1, len)?;
        }
        if let Some(len) = opt_numel(&self.found_inf) {
            check_len(op, "found_inf", 1, len)?;
        }
        self.tensors.iter().try_for_each(|t| {
            t.validate(self.params.amsgrad)?;
            t.hyper(&self.params).map(|_| ())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::Host;

    #[test]
    fn the_builder_sets_exactly_the_fields_it_names() {
        let (mut p, g, mut m, mut v, mut w) = (
            [0.0f32; 2],
            [0.0f32; 2],
            [0.0f32; 2],
            [0.0f32; 2],
            [0.0f32; 2],
        );
        let t = AdamWTensor::<Host, f32>::new(&mut p, &g, &mut m, &mut v);
        assert!(t.master.is_none() && t.max_exp_avg_sq.is_none());
        assert_eq!((t.weight_decay, t.lr_scale), (None, None));
        let t = t
            .with_master(&mut w)
            .with_weight_decay(0.0)
            .with_lr_scale(2.0);
        assert!(t.master.is_some() && t.max_exp_avg_sq.is_none());
        assert_eq!((t.weight_decay, t.lr_scale), (Some(0.0), Some(2.0)));
        let c = AdamWParams::default();
        let h = t.hyper(&c).unwrap();
        assert_eq!((h.lr, h.weight_decay), (c.lr * 2.0, 0.0));
    }

    #[test]
    fn validation_names_the_values() {
        let (mut p, g, mut m, mut v) = ([0.0f32; 3], [0.0f32; 3], [0.0f32; 3], [0.0f32; 3]);
        let t = AdamWTensor::<Host, f32> {
            param: &mut p,
            grad: &g,
            exp_avg: &mut m,
            exp_avg_sq: &mut v,
            max_exp_avg_sq: None,
            master: None,
            weight_decay: None,
            lr_scale: Some(-0.5),
        };
        let e = t.hyper(&AdamWParams::default()).unwrap_err();
        assert!(
            e.to_string().contains("AdamWTensor::lr_scale = -0.5"),
            "{e}"
        );
        let e = t.validate(true).unwrap_err();
        assert!(
            e.to_string().contains("`max_exp_avg_sq` must be given"),
            "{e}"
        );
        let e = AdamWParams {
            step: 0,
            ..AdamWParams::default()
        }
        .validate()
        .unwrap_err();
        assert!(e.to_string().contains("step = 0"), "{e}");
        let two = [1.0f32, 2.0];
        let a = AdamW::<Host, f32> {
            params: AdamWParams::default(),
            grad_scale: Some(&two),
            found_inf: None,
            tensors: &mut [],
        };
        let e = a.validate().unwrap_err();
        assert!(e.to_string().contains("`grad_scale` has 2 elements"), "{e}");
    }
}
