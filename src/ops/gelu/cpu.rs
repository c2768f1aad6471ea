//! GELU (tanh approximation) and the residual add on the CPU: f64, one rounding per value.

use super::{GeluBackward, GeluForward, ResidualAdd};
use crate::params::{DeviceElement, Host, ShapeError};

/// √(2/π).
const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
/// The cubic coefficient of the tanh approximation.
const GELU_CUBIC: f64 = 0.044_715;

/// `gelu(x) = ½·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))` in f64.
pub fn gelu_tanh(x: f64) -> f64 {
    let u = SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x);
    0.5 * x * (1.0 + u.tanh())
}

/// `d gelu(x) / dx = ½·(1 + tanh u) + ½·x·(1 − tanh² u)·√(2/π)·(1 + 3·0.044715·x²)` in f64.
pub fn gelu_tanh_grad(x: f64) -> f64 {
    let u = SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x);
    let th = u.tanh();
    0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * x * x)
}

/// `out = gelu_tanh(x)` elementwise, each value rounded once.
pub fn gelu_forward<T: DeviceElement>(a: GeluForward<'_, Host, T>) -> Result<(), ShapeError> {
    a.validate()?;
    for (o, x) in a.out.iter_mut().zip(a.x) {
        *o = T::from_f64(gelu_tanh(x.to_f64()));
    }
    Ok(())
}

/// `dx = dout · gelu_tanh'(x)` elementwise, each value rounded once.
pub fn gelu_backward<T: DeviceElement>(a: GeluBackward<'_, Host, T>) -> Result<(), ShapeError> {
    a.validate()?;
    for ((d, x), g) in a.dx.iter_mut().zip(a.x).zip(a.dout) {
        *d = T::from_f64(g.to_f64() * gelu_tanh_grad(x.to_f64()));
    }
    Ok(())
}

/// `out = a + b` elementwise, each sum rounded once.
pub fn residual_add<T: DeviceElement>(a: ResidualAdd<'_, Host, T>) -> Result<(), ShapeError> {
    a.validate()?;
    for ((o, x), y) in a.out.iter_mut().zip(a.a).zip(a.b) {
        *o = T::from_f64(x.to_f64() + y.to_f64());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::gelu::ElementwiseParams;

    #[test]
    fn known_values_and_derivative_by_differences() {
        assert_eq!(gelu_tanh(0.0), 0.0);
        // torch.nn.functional.gelu(torch.tensor(1.0, dtype=torch.float64), approximate='tanh')
        assert!((gelu_tanh(1.0) - 0.841_191_990_608_276_8).abs() < 1e-15);
        assert!((gelu_tanh(-3.0) - -0.003_637_392_081_772_994_3).abs() < 1e-15);
        for x in [-4.0, -1.3, -0.2, 0.0, 0.7, 2.5] {
            let h = 1e-6;
            let fd = (gelu_tanh(x + h) - gelu_tanh(x - h)) / (2.0 * h);
            assert!((fd - gelu_tanh_grad(x)).abs() < 1e-8, "{x}");
        }
        let mut dx = [0.0f32; 2];
        gelu_backward(GeluBackward::<Host, f32> {
            params: ElementwiseParams { len: 2 },
            x: &[0.0f32, 0.0],
            dout: &[2.0, -4.0],
            dx: &mut dx,
        })
        .unwrap();
        assert_eq!(dx, [1.0, -2.0]);
        let e = gelu_forward(GeluForward::<Host, f32> {
            params: ElementwiseParams { len: 3 },
            x: &[0.0f32; 3],
            out: &mut [0.0; 2],
        })
        .unwrap_err();
        assert!(e.to_string().contains("`out` has 2 elements"), "{e}");
    }
}
