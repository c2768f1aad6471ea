//! The clip coefficient and AdamW's grad_scale on the CPU, in f64.

use super::{ClipGradScale, CLIP_EPS};
use crate::params::{invalid, Host, ShapeError};

fn check_positive(name: &'static str, v: f64) -> Result<(), ShapeError> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(invalid("clip", name, v, "must be finite and > 0"))
    }
}

/// `min(1, max_norm / (norm + 1e-6))`: the factor every gradient is multiplied by.
///
/// A NaN `norm` gives NaN (torch's `clamp(max = 1)` propagates it); an infinite one gives 0.
/// `max_norm` must be finite and positive.
pub fn clip_coefficient(norm: f64, max_norm: f64) -> Result<f64, ShapeError> {
    check_positive("max_norm", max_norm)?;
    let c = max_norm / (norm + CLIP_EPS);
    Ok(if c.is_nan() { c } else { c.min(1.0) })
}

/// AdamW's `grad_scale` (gradients are divided by it) that both removes a loss scale `s` and
/// clips: `grad_scale = s / clip_coefficient(norm / s, max_norm)`, in f64, rounded to f32.
/// Dividing by it equals PyTorch's unscale-then-multiply up to one rounding. A NaN norm gives
/// NaN, an infinite one +inf (such a step is skipped through `found_inf`).
pub fn clip_grad_scale(a: ClipGradScale<'_, Host>) -> Result<(), ShapeError> {
    a.validate()?;
    let s = a.loss_scale.map_or(1.0, |s| f64::from(s[0]));
    check_positive("loss_scale", s)?;
    let c = clip_coefficient(f64::from(a.norm[0]) / s, f64::from(a.params.max_norm))?;
    a.grad_scale[0] = (s / c) as f32;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::clip::{ClipGradScale, ClipParams, CLIP_EPS};

    #[test]
    fn coefficient_clamps_at_one_and_propagates_nan() {
        assert_eq!(clip_coefficient(0.5, 1.0).unwrap(), 1.0);
        assert_eq!(clip_coefficient(4.0 - CLIP_EPS, 1.0).unwrap(), 0.25);
        assert!(clip_coefficient(f64::NAN, 1.0).unwrap().is_nan());
        assert_eq!(clip_coefficient(f64::INFINITY, 1.0).unwrap(), 0.0);
        assert!(clip_coefficient(1.0, 0.0).is_err());
        assert!(clip_coefficient(1.0, f64::NAN).is_err());
        // Loss scale 1024 and an unscaled norm of 4 with max_norm 1: divide by 4096.
        let run = |norm: f32, max_norm, scale: Option<f32>| {
            let mut g = [0.0f32];
            clip_grad_scale(ClipGradScale::<Host> {
                params: ClipParams { max_norm },
                norm: &[norm],
                loss_scale: scale.as_ref().map(std::slice::from_ref),
                grad_scale: &mut g,
            })
            .map(|()| g[0])
        };
        let g = run(1024.0 * 4.0, 1.0, Some(1024.0)).unwrap();
        assert!((g - 4096.0).abs() < 1e-2, "{g}");
        assert_eq!(run(1.0, 2.0, None).unwrap(), 1.0);
        let e = run(1.0, 2.0, Some(-1.0)).unwrap_err();
        assert!(e.to_string().contains("loss_scale = -1"), "{e}");
    }
}
