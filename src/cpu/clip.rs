//! Gradient clipping by the global L2 norm (`torch.nn.utils.clip_grad_norm_`), and the AdamW
//! `grad_scale` that applies it together with a loss scale.

use super::ShapeError;

/// Added to the norm before dividing, as `clip_grad_norm_` does.
pub const CLIP_EPS: f64 = 1e-6;

fn check_positive(name: &'static str, v: f64) -> Result<(), ShapeError> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(ShapeError::Invalid {
            op: "clip",
            name,
            value: v.to_string(),
            reason: "must be finite and > 0",
        })
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

/// AdamW's `grad_scale` (gradients are divided by it, [`crate::params::AdamWStep`]) that both
/// removes a loss scale and clips: with `norm` the L2 norm of the gradients as stored (still
/// multiplied by `loss_scale`), the unscaled norm is `norm / loss_scale` and the result is
/// `loss_scale / clip_coefficient(norm / loss_scale, max_norm)`, rounded to f32.
///
/// This is what the device computes from `l2_norm`'s output without a host round trip.
/// Dividing by it equals PyTorch's unscale-then-multiply up to one rounding. A NaN `norm` gives
/// NaN, an infinite one gives +inf (the step should be skipped: `found_inf`).
pub fn clip_grad_scale(norm: f64, max_norm: f64, loss_scale: f64) -> Result<f32, ShapeError> {
    check_positive("loss_scale", loss_scale)?;
    let c = clip_coefficient(norm / loss_scale, max_norm)?;
    Ok((loss_scale / c) as f32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coefficient_clamps_at_one_and_propagates_nan() {
        assert_eq!(clip_coefficient(0.5, 1.0).unwrap(), 1.0);
        assert_eq!(clip_coefficient(4.0 - CLIP_EPS, 1.0).unwrap(), 0.25);
        assert!(clip_coefficient(f64::NAN, 1.0).unwrap().is_nan());
        assert_eq!(clip_coefficient(f64::INFINITY, 1.0).unwrap(), 0.0);
        assert!(clip_coefficient(1.0, 0.0).is_err());
        assert!(clip_coefficient(1.0, f64::NAN).is_err());
        // Loss scale 1024 and an unscaled norm of 4 with max_norm 1: divide by 4096.
        let g = clip_grad_scale(1024.0 * (4.0 - CLIP_EPS), 1.0, 1024.0).unwrap();
        assert!((g - 4096.0).abs() < 1e-3, "{g}");
        assert_eq!(clip_grad_scale(1.0, 2.0, 1.0).unwrap(), 1.0);
        let e = clip_grad_scale(1.0, 2.0, -1.0).unwrap_err();
        assert!(e.to_string().contains("loss_scale = -1"), "{e}");
    }
}
