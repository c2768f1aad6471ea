//! Elementwise ops of the training step: GELU with PyTorch's `approximate='tanh'` (GPT-2's
//! `gelu_new`), forward and backward, and the residual add. Parameters and argument structs
//! ([`GeluForward`], [`GeluBackward`], [`ResidualAdd`]), shared by the CPU reference ([`crate::cpu`])
//! and the launchers (`kernels/gelu.hip`).

pub(crate) mod cpu;
mod device;
#[cfg(feature = "golden")]
mod golden;

pub use device::{gelu_backward, gelu_forward, residual_add};
#[cfg(feature = "golden")]
pub use golden::ElementwiseCase;
#[cfg(feature = "golden")]
pub(crate) use golden::GOLDEN;

use crate::params::{check_len, ShapeError, Space, TensorLen};

// Each struct runs itself on its space (`ops::Run`): the CPU reference, or the launcher.
crate::ops::run::launch! {
    GeluForward['a] T => gelu_forward, gelu_forward;
    GeluBackward['a] T => gelu_backward, gelu_backward;
    ResidualAdd['a] T => residual_add, residual_add;
}

/// The one parameter of an elementwise op: the length of every tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ElementwiseParams {
    /// Elements of each tensor (may be 0).
    pub len: usize,
}

impl ElementwiseParams {
    /// Check that each named tensor has `len` elements.
    fn validate(
        &self,
        op: &'static str,
        tensors: &[(&'static str, usize)],
    ) -> Result<(), ShapeError> {
        tensors
            .iter()
            .try_for_each(|&(name, got)| check_len(op, name, self.len, got))
    }
}

/// `out = gelu_tanh(x)`.
pub struct GeluForward<'a, S: Space, T: hip_rt::Element> {
    /// Length.
    pub params: ElementwiseParams,
    /// Input.
    pub x: S::In<'a, T>,
    /// Output (overwritten).
    pub out: S::Out<'a, T>,
}

impl<S: Space, T: hip_rt::Element> GeluForward<'_, S, T> {
    /// Check every length.
    pub fn validate(&self) -> Result<(), ShapeError> {
        self.params
            .validate("gelu", &[("x", self.x.numel()), ("out", self.out.numel())])
    }
}

/// `dx = dout · gelu_tanh'(x)`.
pub struct GeluBackward<'a, S: Space, T: hip_rt::Element> {
    /// Length.
    pub params: ElementwiseParams,
    /// The forward's input.
    pub x: S::In<'a, T>,
    /// Gradient of the forward's output.
    pub dout: S::In<'a, T>,
    /// Gradient of `x` (overwritten).
    pub dx: S::Out<'a, T>,
}

impl<S: Space, T: hip_rt::Element> GeluBackward<'_, S, T> {
    /// Check every length.
    pub fn validate(&self) -> Result<(), ShapeError> {
        self.params.validate(
            "gelu",
            &[
                ("x", self.x.numel()),
                ("dout", self.dout.numel()),
                ("dx", self.dx.numel()),
            ],
        )
    }
}

/// `out = a + b` (the residual stream).
pub struct ResidualAdd<'a, S: Space, T: hip_rt::Element> {
    /// Length.
    pub params: ElementwiseParams,
    /// First addend.
    pub a: S::In<'a, T>,
    /// Second addend.
    pub b: S::In<'a, T>,
    /// `a + b` (overwritten).
    pub out: S::Out<'a, T>,
}

impl<S: Space, T: hip_rt::Element> ResidualAdd<'_, S, T> {
    /// Check every length.
    pub fn validate(&self) -> Result<(), ShapeError> {
        self.params.validate(
            "residual_add",
            &[
                ("a", self.a.numel()),
                ("b", self.b.numel()),
                ("out", self.out.numel()),
            ],
        )
    }
}
