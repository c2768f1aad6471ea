//! AdamW exactly as `torch.optim.AdamW` / `torch._fused_adamw_`, plus the multi-tensor trainer
//! helpers (non-finite check, global L2 norm). f64 internally; state is stored as f32.

use super::{AdamWConfig, AdamWStep, Element, ShapeError};

/// Where the f32 view of the parameter lives during one update.
enum Weights<'a, T> {
    /// The model parameters themselves are updated.
    Plain(&'a mut [T]),
    /// f32 master weights are updated and the model copy is rewritten from them.
    Master {
        master: &'a mut [f32],
        model: &'a mut [T],
    },
}

/// One AdamW step on `param` (f32/f16/bf16) with f32 state, in place.
///
/// Per element, in f64: `g = grad / grad_scale` (if given), negated if `maximize`;
/// `p ← p·(1 − lr·wd)`; `m ← β1·m + (1 − β1)·g`; `v ← β2·v + (1 − β2)·g²`;
/// with amsgrad `v̂ ← max(v̂, v)` and `denom = √v̂ / √(1 − β2^step) + eps` (else `√v`);
/// `p ← p − lr/(1 − β1^step) · m / denom`. Each stored value is rounded once.
/// With `found_inf` nothing is written at all. `max_exp_avg_sq` is given iff `amsgrad`.
/// `grad` is not modified (torch's fused kernel also writes the unscaled gradient back).
pub fn adamw<T: Element>(
    config: &AdamWConfig,
    step: &AdamWStep,
    param: &mut [T],
    grad: &[T],
    exp_avg: &mut [f32],
    exp_avg_sq: &mut [f32],
    max_exp_avg_sq: Option<&mut [f32]>,
) -> Result<(), ShapeError> {
    update(
        config,
        step,
        Weights::Plain(param),
        grad,
        exp_avg,
        exp_avg_sq,
        max_exp_avg_sq,
    )
}

/// [`adamw`] on f32 master weights `master`, then `param` (the f16/bf16/f32 model copy) is
/// overwritten with `master` rounded to its type. The model copy is not read.
#[allow(clippy::too_many_arguments)]
pub fn adamw_master<T: Element>(
    config: &AdamWConfig,
    step: &AdamWStep,
    master: &mut [f32],
    param: &mut [T],
    grad: &[T],
    exp_avg: &mut [f32],
    exp_avg_sq: &mut [f32],
    max_exp_avg_sq: Option<&mut [f32]>,
) -> Result<(), ShapeError> {
    update(
        config,
        step,
        Weights::Master {
            master,
            model: param,
        },
        grad,
        exp_avg,
        exp_avg_sq,
        max_exp_avg_sq,
    )
}

fn update<T: Element>(
    c: &AdamWConfig,
    s: &AdamWStep,
    mut w: Weights<'_, T>,
    grad: &[T],
    exp_avg: &mut [f32],
    exp_avg_sq: &mut [f32],
    mut max_sq: Option<&mut [f32]>,
) -> Result<(), ShapeError> {
    let (len, master_len) = match &w {
        Weights::Plain(p) => (p.len(), None),
        Weights::Master { master, model } => (model.len(), Some(master.len())),
    };
    c.validate(
        s,
        len,
        grad.len(),
        exp_avg.len(),
        exp_avg_sq.len(),
        max_sq.as_deref().map(<[f32]>::len),
        master_len,
    )?;
    if s.found_inf {
        return Ok(());
    }
    let step = s.step as f64;
    let bias1 = 1.0 - c.beta1.powf(step);
    let bias2_sqrt = (1.0 - c.beta2.powf(step)).sqrt();
    let step_size = c.lr / bias1;
    let decay = 1.0 - c.lr * c.weight_decay;
    let inv_scale = s.grad_scale.map_or(1.0, |g| 1.0 / f64::from(g));
    let sign = if c.maximize { -1.0 } else { 1.0 };
    for i in 0..len {
        let g = sign * grad[i].to_f64() * inv_scale;
        let p = match &w {
            Weights::Plain(p) => p[i].to_f64(),
            Weights::Master { master, .. } => f64::from(master[i]),
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
        match &mut w {
            Weights::Plain(param) => param[i] = T::from_f64(p),
            Weights::Master { master, model } => {
                master[i] = p as f32;
                model[i] = T::from_f64(p);
            }
        }
    }
    Ok(())
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

    #[test]
    fn first_step_moves_by_lr_times_sign() {
        // Step 1 without decay: m̂ = g, v̂ = g², so p moves by −lr·g/(|g| + eps) ≈ −lr·sign(g).
        let c = AdamWConfig {
            lr: 0.1,
            weight_decay: 0.0,
            eps: 0.0,
            ..AdamWConfig::default()
        };
        let (mut p, mut m, mut v) = ([1.0f32, 1.0], [0.0f32; 2], [0.0f32; 2]);
        adamw(
            &c,
            &AdamWStep::new(1),
            &mut p,
            &[0.5, -2.0],
            &mut m,
            &mut v,
            None,
        )
        .unwrap();
        assert_eq!(p, [0.9, 1.1]);
        let b1c = 1.0 - 0.9f64;
        assert_eq!(m, [(b1c * 0.5) as f32, (b1c * -2.0) as f32]);
        let cm = AdamWConfig {
            maximize: true,
            ..c
        };
        let (mut p, mut m, mut v) = ([1.0f32], [0.0f32], [0.0f32]);
        let s = AdamWStep {
            grad_scale: Some(4.0),
            ..AdamWStep::new(1)
        };
        adamw(&cm, &s, &mut p, &[2.0], &mut m, &mut v, None).unwrap();
        // g = 2 / 4 = 0.5, negated by maximize.
        assert_eq!(
            (p, m, v),
            (
                [1.1],
                [(b1c * -0.5) as f32],
                [((1.0 - 0.999f64) * 0.25) as f32]
            )
        );
    }

    #[test]
    fn found_inf_changes_nothing_and_amsgrad_keeps_the_max() {
        let c = AdamWConfig {
            amsgrad: true,
            ..AdamWConfig::default()
        };
        let (mut p, mut m, mut v, mut mx) = ([f16::from_f32(1.5)], [0.25f32], [0.5f32], [2.0f32]);
        let s = AdamWStep {
            found_inf: true,
            ..AdamWStep::new(3)
        };
        adamw(&c, &s, &mut p, &[f16::NAN], &mut m, &mut v, Some(&mut mx)).unwrap();
        assert_eq!((p[0].to_f32(), m, v, mx), (1.5, [0.25], [0.5], [2.0]));
        adamw(
            &c,
            &AdamWStep::new(3),
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
        let c = AdamWConfig {
            amsgrad: true,
            ..AdamWConfig::default()
        };
        let mut p = [1.0f32; 3];
        let (mut m, mut v) = ([0.0f32; 3], [0.25, f32::NAN, 0.25]);
        let mut mx = [f32::NAN, 0.5, 0.5];
        adamw(
            &c,
            &AdamWStep::new(2),
            &mut p,
            &[0.1, 0.1, 0.1],
            &mut m,
            &mut v,
            Some(&mut mx),
        )
        .unwrap();
        assert!(mx[0].is_nan() && p[0].is_nan(), "{mx:?} {p:?}");
        assert!(mx[1].is_nan() && p[1].is_nan(), "{mx:?} {p:?}");
        assert_eq!(mx[2], 0.5);
        assert!(p[2].is_finite() && p[2] < 1.0, "{p:?}");
    }

    #[test]
    fn master_weights_write_the_rounded_model_copy() {
        let c = AdamWConfig {
            lr: 1e-3,
            ..AdamWConfig::default()
        };
        let (mut master, mut model) = ([1.0f32, -3.0], [bf16::ZERO; 2]);
        let (mut m, mut v) = ([0.0f32; 2], [0.0f32; 2]);
        let g = [bf16::from_f32(0.01), bf16::from_f32(-0.02)];
        adamw_master(
            &c,
            &AdamWStep::new(1),
            &mut master,
            &mut model,
            &g,
            &mut m,
            &mut v,
            None,
        )
        .unwrap();
        // The same update on f32 params gives the master weights; the model copy is their rounding.
        let (mut p32, mut m32, mut v32) = ([1.0f32, -3.0], [0.0f32; 2], [0.0f32; 2]);
        adamw(
            &c,
            &AdamWStep::new(1),
            &mut p32,
            &g.map(|x| x.to_f32()),
            &mut m32,
            &mut v32,
            None,
        )
        .unwrap();
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
