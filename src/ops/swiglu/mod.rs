//! SwiGLU, the gate of a LLaMA MLP: `h = silu(g) ∘ u` with `silu(g) = g·σ(g)`, from the gate and
//! up projections — two `[rows, F]` buffers, or the two halves of one fused gate-up output
//! `[rows, 2F]` whose rows are `[gate(0..F), up(F..2F)]` (a single GEMM against the stacked
//! weight, GLM's `gate_up_proj`). The backward writes `dg` and `du` in the same layout. The
//! parameters and argument structs are shared by the CPU reference ([`crate::cpu`]) and the
//! launchers (`kernels/swiglu.hip`).

pub(crate) mod cpu;
mod device;
#[cfg(feature = "golden")]
mod golden;

pub use device::{swiglu_backward, swiglu_forward};
#[cfg(feature = "golden")]
pub(crate) use golden::GOLDEN;
#[cfg(feature = "golden")]
pub use golden::{SwigluBackwardCase, SwigluForwardCase};

use crate::params::{check_len, checked_len, ShapeError, Space, TensorLen};

// Each struct runs itself on its space (`ops::Run`): the CPU reference, or the launcher.
crate::ops::run::launch! {
    SwigluForward['a] T => swiglu_forward, swiglu_forward;
    SwigluBackward['a] T => swiglu_backward, swiglu_backward;
}

/// Dimensions of SwiGLU (forward and backward).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SwigluParams {
    /// Rows (tokens; may be 0).
    pub rows: usize,
    /// Width F of `h`, of the gate and of the up projection (may be 0).
    pub ffn: usize,
}

impl SwigluParams {
    /// Operation name used in errors.
    pub const OP: &'static str = "swiglu";

    /// Elements of `h` and `dh`: `rows·F`.
    pub fn h_len(&self) -> Result<usize, ShapeError> {
        checked_len(Self::OP, "h", &[self.rows, self.ffn])
    }

    /// Elements of a fused gate-up tensor: `rows·2F`.
    pub fn fused_len(&self) -> Result<usize, ShapeError> {
        checked_len(Self::OP, "gate_up", &[self.rows, 2, self.ffn])
    }
}

/// The gate and up projections SwiGLU reads.
pub enum GateUp<'a, S: Space, T: hip_rt::Element> {
    /// Two `[rows, F]` buffers.
    Separate {
        /// `g` `[rows, F]`.
        gate: S::In<'a, T>,
        /// `u` `[rows, F]`.
        up: S::In<'a, T>,
    },
    /// One `[rows, 2F]` buffer, each row the gate's F values then the up projection's F.
    Fused {
        /// `[rows, 2F]`.
        gate_up: S::In<'a, T>,
    },
}

/// Where the backward writes `dg` and `du` (overwritten, never read).
pub enum GateUpGrad<'a, S: Space, T: hip_rt::Element> {
    /// Two `[rows, F]` buffers.
    Separate {
        /// `dg` `[rows, F]`.
        dgate: S::Out<'a, T>,
        /// `du` `[rows, F]`.
        dup: S::Out<'a, T>,
    },
    /// One `[rows, 2F]` buffer, each row `dg` then `du` (the fused GEMM's output gradient).
    Fused {
        /// `[rows, 2F]`.
        dgate_up: S::Out<'a, T>,
    },
}

impl<S: Space, T: hip_rt::Element> GateUp<'_, S, T> {
    fn validate(&self, p: &SwigluParams) -> Result<(), ShapeError> {
        match self {
            GateUp::Separate { gate, up } => {
                check_len(SwigluParams::OP, "gate", p.h_len()?, gate.numel())?;
                check_len(SwigluParams::OP, "up", p.h_len()?, up.numel())
            }
            GateUp::Fused { gate_up } => {
                check_len(SwigluParams::OP, "gate_up", p.fused_len()?, gate_up.numel())
            }
        }
    }
}

impl<S: Space, T: hip_rt::Element> GateUpGrad<'_, S, T> {
    fn validate(&self, p: &SwigluParams) -> Result<(), ShapeError> {
        match self {
            GateUpGrad::Separate { dgate, dup } => {
                check_len(SwigluParams::OP, "dgate", p.h_len()?, dgate.numel())?;
                check_len(SwigluParams::OP, "dup", p.h_len()?, dup.numel())
            }
            GateUpGrad::Fused { dgate_up } => check_len(
                SwigluParams::OP,
                "dgate_up",
                p.fused_len()?,
                dgate_up.numel(),
            ),
        }
    }
}

/// `h = silu(g) ∘ u`.
pub struct SwigluForward<'a, S: Space, T: hip_rt::Element> {
    /// Rows and F.
    pub params: SwigluParams,
    /// `g` and `u`.
    pub input: GateUp<'a, S, T>,
    /// `h` `[rows, F]` (overwritten).
    pub h: S::Out<'a, T>,
}

impl<S: Space, T: hip_rt::Element> SwigluForward<'_, S, T> {
    /// Check every length.
    pub fn validate(&self) -> Result<(), ShapeError> {
        self.input.validate(&self.params)?;
        check_len(SwigluParams::OP, "h", self.params.h_len()?, self.h.numel())
    }
}

/// `dg = dh ∘ u ∘ σ(g)·(1 + g·(1 − σ(g)))`, `du = dh ∘ silu(g)`.
pub struct SwigluBackward<'a, S: Space, T: hip_rt::Element> {
    /// Rows and F.
    pub params: SwigluParams,
    /// The forward's `g` and `u`.
    pub input: GateUp<'a, S, T>,
    /// Gradient of `h` `[rows, F]`.
    pub dh: S::In<'a, T>,
    /// `dg` and `du` (overwritten).
    pub grad: GateUpGrad<'a, S, T>,
}

impl<S: Space, T: hip_rt::Element> SwigluBackward<'_, S, T> {
    /// Check every length.
    pub fn validate(&self) -> Result<(), ShapeError> {
        self.input.validate(&self.params)?;
        check_len(
            SwigluParams::OP,
            "dh",
            self.params.h_len()?,
            self.dh.numel(),
        )?;
        self.grad.validate(&self.params)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::Host;

    #[test]
    fn fused_inputs_need_two_f_per_row() {
        let x = [0.0f32; 6];
        let mut h = [0.0f32; 2];
        let a = SwigluForward::<Host, f32> {
            params: SwigluParams { rows: 2, ffn: 1 },
            input: GateUp::Fused { gate_up: &x },
            h: &mut h,
        };
        let e = a.validate().unwrap_err();
        assert!(e.to_string().contains("`gate_up` has 6 elements"), "{e}");
    }
}
