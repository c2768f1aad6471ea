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

/// The clipping threshold.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClipParams {
    /// `max_norm` of `clip_grad_norm_` (finite, > 0).
    pub max_norm: f32,
}

/// Arguments of [`clip_grad_scale`]: one-element tensors, so that on the device the norm, the
/// loss scale and the result never leave device memory.
#[derive(Debug)]
pub struct ClipGradScale<'a> {
    /// `max_norm`.
    pub params: ClipParams,
    /// `[1]`: the L2 norm of the gradients as stored (still multiplied by the loss scale).
    pub norm: &'a [f32],
    /// Optional `[1]`: the loss scale the gradients carry (GradScaler's scale); 1 if absent.
    pub loss_scale: Option<&'a [f32]>,
    /// `[1]`: AdamW's `grad_scale` (overwritten).
    pub grad_scale: &'a mut [f32],
}

/// AdamW's `grad_scale` (gradients are divided by it, [`crate::params::AdamWStep`]) that both
/// removes a loss scale `s` and clips: the unscaled norm is `norm / s` and
/// `grad_scale = s / clip_coefficient(norm / s, max_norm)`, computed in f64 and rounded to f32.
///
/// The device computes the same from `l2_norm`'s output without a host round trip. Dividing by
/// it equals PyTorch's unscale-then-multiply up to one rounding. A NaN norm gives NaN, an
/// infinite one +inf (such a step is skipped through `found_inf`).
pub fn clip_grad_scale(args: ClipGradScale<'_>) -> Result<(), ShapeError> {
    let ClipGradScale {
        params,
        norm,
        loss_scale,
        grad_scale,
    } = args;
    let check = |name, len| crate::params::check_len("clip", name, 1, len);
    check("norm", norm.len())?;
    if let Some(s) = loss_scale {
        check("loss_scale", s.len())?;
    }
    check("grad_scale", grad_scale.len())?;
    let s = loss_scale.map_or(1.0, |s| f64::from(s[0]));
    check_positive("loss_scale", s)?;
    let c = clip_coefficient(f64::from(norm[0]) / s, f64::from(params.max_norm))?;
    grad_scale[0] = (s / c) as f32;
    Ok(())
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
        let run = |norm: f32, max_norm, scale: Option<f32>| {
            let mut g = [0.0f32];
            clip_grad_scale(ClipGradScale {
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
