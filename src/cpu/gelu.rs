//! GELU with PyTorch's `approximate='tanh'` (GPT-2's `gelu_new`), forward and backward, f64
//! internally.

use super::{Element, ShapeError};
use crate::params::check_len;

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

/// The one parameter of an elementwise op (GELU, residual add): the length of every tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ElementwiseParams {
    /// Elements of each tensor (may be 0).
    pub len: usize,
}

impl ElementwiseParams {
    /// Check that each named tensor has `len` elements.
    pub fn validate(
        &self,
        op: &'static str,
        tensors: &[(&'static str, usize)],
    ) -> Result<(), ShapeError> {
        tensors
            .iter()
            .try_for_each(|&(name, got)| check_len(op, name, self.len, got))
    }
}

/// Arguments of [`gelu_forward`].
#[derive(Debug)]
pub struct GeluForward<'a, T> {
    /// Length.
    pub params: ElementwiseParams,
    /// Input.
    pub x: &'a [T],
    /// Output, same length as `x` (overwritten).
    pub out: &'a mut [T],
}

/// `out = gelu_tanh(x)` elementwise, each value rounded once.
pub fn gelu_forward<T: Element>(args: GeluForward<'_, T>) -> Result<(), ShapeError> {
    args.params
        .validate("gelu", &[("x", args.x.len()), ("out", args.out.len())])?;
    for (o, x) in args.out.iter_mut().zip(args.x) {
        *o = T::from_f64(gelu_tanh(x.to_f64()));
    }
    Ok(())
}

/// Arguments of [`gelu_backward`].
#[derive(Debug)]
pub struct GeluBackward<'a, T> {
    /// Length.
    pub params: ElementwiseParams,
    /// The forward's input.
    pub x: &'a [T],
    /// Gradient of the forward's output.
    pub dout: &'a [T],
    /// Gradient of `x` (overwritten).
    pub dx: &'a mut [T],
}

/// `dx = dout · gelu_tanh'(x)` elementwise, each value rounded once.
pub fn gelu_backward<T: Element>(args: GeluBackward<'_, T>) -> Result<(), ShapeError> {
    args.params.validate(
        "gelu",
        &[
            ("x", args.x.len()),
            ("dout", args.dout.len()),
            ("dx", args.dx.len()),
        ],
    )?;
    for ((d, x), g) in args.dx.iter_mut().zip(args.x).zip(args.dout) {
        *d = T::from_f64(g.to_f64() * gelu_tanh_grad(x.to_f64()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
        gelu_backward(GeluBackward {
            params: ElementwiseParams { len: 2 },
            x: &[0.0f32, 0.0],
            dout: &[2.0, -4.0],
            dx: &mut dx,
        })
        .unwrap();
        assert_eq!(dx, [1.0, -2.0]);
        let e = gelu_forward(GeluForward {
            params: ElementwiseParams { len: 3 },
            x: &[0.0f32; 3],
            out: &mut [0.0; 2],
        })
        .unwrap_err();
        assert!(e.to_string().contains("`out` has 2 elements"), "{e}");
    }
}
