//! AdamW exactly as `torch.optim.AdamW` / `torch._fused_adamw_`, plus the multi-tensor trainer
//! helpers (non-finite check, global L2 norm). f64 internally; state is stored as f32.

use super::{AdamW, AdamWParams, AdamWTensor};
use crate::params::{invalid, DeviceElement, Element, Host, ShapeError};

/// [`AdamW`] on host slices, exactly as `torch.optim.AdamW` / `torch._fused_adamw_`: f64 per
/// element, each stored value rounded once; state is f32. `grad_scale` must be finite and > 0.
/// With a non-zero `found_inf` nothing at all is written. `grad` is not modified (torch's fused
/// kernel also writes the unscaled gradient back).
pub fn adamw<T: DeviceElement>(a: AdamW<'_, '_, Host, T>) -> Result<(), ShapeError> {
    a.validate()?;
    let inv_scale = match a.grad_scale {
        None => 1.0,
        Some(s) if s[0].is_finite() && s[0] > 0.0 => 1.0 / f64::from(s[0]),
        Some(s) => {
            return Err(invalid(
                AdamWParams::OP,
                "grad_scale",
                s[0],
                "must be finite and > 0",
            ))
        }
    };
    if a.found_inf.is_some_and(|f| f[0] != 0.0) {
        return Ok(());
    }
    for t in a.tensors.iter_mut() {
        let hyper = t.hyper(&a.params)?;
        update(&hyper, inv_scale, t);
    }
    Ok(())
}

/// One tensor's update (validated by the caller).
fn update<T: DeviceElement>(c: &AdamWParams, inv_scale: f64, t: &mut AdamWTensor<'_, Host, T>) {
    let len = t.param.len();
    let step = c.step as f64;
    let bias1 = 1.0 - c.beta1.powf(step);
    let bias2_sqrt = (1.0 - c.beta2.powf(step)).sqrt();
    let step_size = c.lr / bias1;
    let decay = 1.0 - c.lr * c.weight_decay;
    let sign = if c.maximize { -1.0 } else { 1.0 };
    let (grad, exp_avg, exp_avg_sq) = (t.grad, &mut *t.exp_avg, &mut *t.exp_avg_sq);
    let mut max_sq = t.max_exp_avg_sq.as_deref_mut();
    let mut master = t.master.as_deref_mut();
    for i in 0..len {
        let g = sign * grad[i].to_f64() * inv_scale;
        let p = match master.as_deref() {
            None => t.param[i].to_f64(),
            Some(master) => f64::from(master[i]),
        } * decay;
        let m = c.beta1 * f64::from(exp_avg[i]) + (1.0 - c.beta1) * g;
        let v = c.beta2 * f64::from(exp_avg_sq[i]) + (1.0 - c.beta2) * g * g;
        let v_used = match max_sq.as_deref_mut() {
            Some(mx) => {
                let vm = maximum(f64::from(mx[i]), v);
                mx[i] = vm as f32;
                vm
            }
            None => v,
        };
        let p = p - step_size * m / (v_used.sqrt() / bias2_sqrt + c.eps);
        exp_avg[i] = m as f32;
        exp_avg_sq[i] = v as f32;
        if let Some(master) = master.as_deref_mut() {
            master[i] = p as f32;
        }
        t.param[i] = T::from_f64(p);
    }
}

/// `torch.maximum`: NaN when either operand is NaN (`f64::max` returns the other operand), as
/// AdamW's default single-tensor and foreach paths compute `max_exp_avg_sq` (checked with torch
/// 2.15 on the CPU; its fused path differs when only `exp_avg_sq` is NaN).
fn maximum(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

/// True iff any element of any tensor is NaN or ±inf (what a loss scaler checks before a step).
pub fn non_finite<T: Element>(tensors: &[&[T]]) -> bool {
    tensors
        .iter()
        .any(|t| t.iter().any(|x| !x.to_f64().is_finite()))
}

/// Global L2 norm `√(Σ x²)` over all elements of all tensors, accumulated in f64 (gradient
/// clipping). A non-finite element gives a non-finite norm.
pub fn l2_norm<T: Element>(tensors: &[&[T]]) -> f64 {
    tensors
        .iter()
        .flat_map(|t| t.iter())
        .map(|x| x.to_f64() * x.to_f64())
        .sum::<f64>()
        .sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    /// One plain (no master) tensor's step.
    #[allow(clippy::too_many_arguments)]
    fn step<T: DeviceElement>(
        c: &AdamWParams,
        grad_scale: Option<f32>,
        found_inf: bool,
        param: &mut [T],
        grad: &[T],
        exp_avg: &mut [f32],
        exp_avg_sq: &mut [f32],
        max_exp_avg_sq: Option<&mut [f32]>,
    ) -> Result<(), ShapeError> {
        let (gs, fi) = (grad_scale.map(|g| [g]), [f32::from(u8::from(found_inf))]);
        adamw(AdamW {
            params: *c,
            grad_scale: gs.as_ref().map(|g| &g[..]),
            found_inf: Some(&fi),
            tensors: &mut [AdamWTensor {
                param,
                grad,
                exp_avg,
                exp_avg_sq,
                max_exp_avg_sq,
                master: None,
                weight_decay: None,
                lr_scale: None,
            }],
        })
    }

    #[test]
    fn first_step_moves_by_lr_times_sign() {
        // Step 1 without decay: m̂ = g, v̂ = g², so p moves by −lr·g/(|g| + eps) ≈ −lr·sign(g).
        let c = AdamWParams {
            lr: 0.1,
            weight_decay: 0.0,
            eps: 0.0,
            ..AdamWParams::default()
        };
        let (mut p, mut m, mut v) = ([1.0f32, 1.0], [0.0f32; 2], [0.0f32; 2]);
        step(&c, None, false, &mut p, &[0.5, -2.0], &mut m, &mut v, None).unwrap();
        assert_eq!(p, [0.9, 1.1]);
        let b1c = 1.0 - 0.9f64;
        assert_eq!(m, [(b1c * 0.5) as f32, (b1c * -2.0) as f32]);
        let cm = AdamWParams {
            maximize: true,
            ..c
        };
        let (mut p, mut m, mut v) = ([1.0f32], [0.0f32], [0.0f32]);
        step(&cm, Some(4.0), false, &mut p, &[2.0], &mut m, &mut v, None).unwrap();
        // g = 2 / 4 = 0.5, negated by maximize.
        assert_eq!(
            (p, m, v),
            (
                [1.1],
                [(b1c * -0.5) as f32],
                [((1.0 - 0.999f64) * 0.25) as f32]
            )
        );
        let e = step(&cm, Some(0.0), false, &mut p, &[2.0], &mut m, &mut v, None).unwrap_err();
        assert!(e.to_string().contains("grad_scale = 0"), "{e}");
    }

    #[test]
    fn found_inf_changes_nothing_and_amsgrad_keeps_the_max() {
        let c = AdamWParams {
            amsgrad: true,
            step: 3,
            ..AdamWParams::default()
        };
        let (mut p, mut m, mut v, mut mx) = ([f16::from_f32(1.5)], [0.25f32], [0.5f32], [2.0f32]);
        step(
            &c,
            None,
            true,
            &mut p,
            &[f16::NAN],
            &mut m,
            &mut v,
            Some(&mut mx),
        )
        .unwrap();
        assert_eq!((p[0].to_f32(), m, v, mx), (1.5, [0.25], [0.5], [2.0]));
        step(
            &c,
            None,
            false,
            &mut p,
            &[f16::from_f32(0.1)],
            &mut m,
            &mut v,
            Some(&mut mx),
        )
        .unwrap();
        assert_eq!(mx, [2.0]);
        assert!(v[0] < 0.5);
    }

    #[test]
    fn amsgrad_propagates_a_nan_like_torch_maximum() {
        // torch.maximum(max_exp_avg_sq, exp_avg_sq) is NaN when either is NaN; f64::max and
        // fmaxf return the other operand and silently heal the state.
        let c = AdamWParams {
            amsgrad: true,
            step: 2,
            ..AdamWParams::default()
        };
        let mut p = [1.0f32; 3];
        let (mut m, mut v) = ([0.0f32; 3], [0.25, f32::NAN, 0.25]);
        let mut mx = [f32::NAN, 0.5, 0.5];
        let g = [0.1f32; 3];
        step(&c, None, false, &mut p, &g, &mut m, &mut v, Some(&mut mx)).unwrap();
        assert!(mx[0].is_nan() && p[0].is_nan(), "{mx:?} {p:?}");
        assert!(mx[1].is_nan() && p[1].is_nan(), "{mx:?} {p:?}");
        assert_eq!(mx[2], 0.5);
        assert!(p[2].is_finite() && p[2] < 1.0, "{p:?}");
    }

    #[test]
    fn master_weights_write_the_rounded_model_copy() {
        let c = AdamWParams {
            lr: 1e-3,
            ..AdamWParams::default()
        };
        let (mut master, mut model) = ([1.0f32, -3.0], [bf16::ZERO; 2]);
        let (mut m, mut v) = ([0.0f32; 2], [0.0f32; 2]);
        let g = [bf16::from_f32(0.01), bf16::from_f32(-0.02)];
        adamw(AdamW {
            params: c,
            grad_scale: None,
            found_inf: None,
            tensors: &mut [AdamWTensor {
                param: &mut model,
                grad: &g,
                exp_avg: &mut m,
                exp_avg_sq: &mut v,
                max_exp_avg_sq: None,
                master: Some(&mut master),
                weight_decay: None,
                lr_scale: None,
            }],
        })
        .unwrap();
        // The same update on f32 params gives the master weights; the model copy is their rounding.
        let (mut p32, mut m32, mut v32) = ([1.0f32, -3.0], [0.0f32; 2], [0.0f32; 2]);
        let g32 = g.map(|x| x.to_f32());
        step(&c, None, false, &mut p32, &g32, &mut m32, &mut v32, None).unwrap();
        assert_eq!((master, m, v), (p32, m32, v32));
        assert_eq!(model, p32.map(bf16::from_f32));
        assert!(
            master[0] < 1.0 && model[0] == bf16::ONE,
            "update below bf16 resolution stays in master"
        );
    }

    #[test]
    fn trainer_helpers() {
        let a = [3.0f32, 0.0];
        let b = [4.0f32];
        assert_eq!(l2_norm(&[&a[..], &b[..]]), 5.0);
        assert!(!non_finite(&[&a[..], &b[..]]));
        assert!(non_finite(&[&a[..], &[f32::INFINITY][..]]));
        assert!(non_finite::<bf16>(&[&[bf16::NAN][..]]));
    }
}
