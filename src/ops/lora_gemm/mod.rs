//! The skinny GEMMs of a LoRA adapter: parameters and argument structs ([`LoraForward`],
//! [`LoraBackward`]) shared by the CPU reference ([`crate::cpu`]) and the launchers (the
//! kernels of `kernels/lora_gemm.hip`, see [`plan`] for their launch geometry and traffic).
//!
//! An adapted target `y = x·W (+ b)` with `x` `[N, in]`, `y` `[N, out]`, `A` `[r, in]` and `B`
//! `[out, r]` (PEFT's `lora_A` / `lora_B` layout) and scale `s` adds, forward,
//! `u = x·Aᵀ` (`[N, r]`, saved for the backward) and `y += s·u·Bᵀ`; backward, with the
//! output gradient `dy` and `dx` holding the base GEMM's `dy·Wᵀ`: `du = s·dy·B`,
//! `dB (+)= s·dyᵀ·u`, `dA (+)= duᵀ·x` and `dx += du·A`. One dimension of every product is r
//! (1 to [`MAX_RANK`] on the skinny kernels): the big operands (`x`, `dy`, `y`, `dx`) are read
//! once, the small ones staged per block.
//!
//! `y` and `dy` may be a column block of a wider row-major tensor ([`LoraParams::ldy`]): a
//! target whose output is stacked with others (LLaMA's q, k and v in one `[N, (H + 2K)·D]`
//! tensor) passes a view starting at its block's first column and the stacked width as the
//! row stride; nothing is copied.

pub(crate) mod cpu;
mod device;
#[cfg(feature = "golden")]
mod golden;
pub mod plan;

pub use device::{lora_backward, lora_backward_with, lora_forward, lora_forward_with};
#[cfg(feature = "golden")]
pub(crate) use golden::GOLDEN;
#[cfg(feature = "golden")]
pub use golden::{LoraBackwardCase, LoraForwardCase};

pub(crate) use device::{skinny_applies, skinny_matmul};

crate::ops::run::launch! {
    LoraForward['a] T => lora_forward, lora_forward;
    LoraBackward['a] T => lora_backward, lora_backward;
}

use crate::params::{check_len, checked_len, invalid, ShapeError, Space, TensorLen};

/// The largest rank the skinny kernels take (their widest rank class); larger ranks run on
/// the GEMM ([`LoraKernel::Gemm`]), which [`LoraKernel::Auto`] picks for them.
pub const MAX_RANK: usize = 64;

/// Dimensions and scale of one adapted target.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoraParams {
    /// Rows N (every batch and sequence position), may be 0.
    pub rows: usize,
    /// Input features of the target (`x`'s columns).
    pub d_in: usize,
    /// Output features of the target (`y`'s columns).
    pub d_out: usize,
    /// Adapter rank r (at least 1).
    pub rank: usize,
    /// Scale s of the adapter's product (PEFT's `lora_alpha / r`), finite.
    pub scale: f32,
    /// Backward: add into `da` and `db` (gradient accumulation) instead of overwriting them.
    pub accumulate: bool,
    /// Row stride (elements) of `y` (forward) and `dy` (backward), at least `d_out`; `None`:
    /// `d_out` (packed). Elements between the rows' `d_out` columns are neither read nor
    /// written.
    pub ldy: Option<usize>,
}

impl LoraParams {
    /// Operation name of the forward, used in errors.
    pub const FORWARD: &'static str = "lora_forward";
    /// Operation name of the backward, used in errors.
    pub const BACKWARD: &'static str = "lora_backward";

    /// A target of `rows` positions, `d_in` → `d_out` features, rank `rank`, scale `scale`,
    /// gradients overwritten (see [`LoraParams::accumulating`]).
    pub fn new(rows: usize, d_in: usize, d_out: usize, rank: usize, scale: f32) -> Self {
        Self {
            rows,
            d_in,
            d_out,
            rank,
            scale,
            accumulate: false,
            ldy: None,
        }
    }

    /// The same with `y` / `dy` rows `ldy` elements apart (a column block of a wider tensor,
    /// see [`LoraParams::ldy`]).
    pub fn strided(self, ldy: usize) -> Self {
        Self {
            ldy: Some(ldy),
            ..self
        }
    }

    /// The row stride of `y` and `dy`.
    pub fn row_stride(&self) -> usize {
        self.ldy.unwrap_or(self.d_out)
    }

    /// The same, adding into `da` and `db` instead of overwriting them.
    pub fn accumulating(self) -> Self {
        Self {
            accumulate: true,
            ..self
        }
    }

    fn check(&self, op: &'static str) -> Result<(), ShapeError> {
        if self.rank == 0 {
            return Err(invalid(op, "rank", 0, "an adapter has rank 1 or more"));
        }
        if self.d_in == 0 || self.d_out == 0 {
            return Err(invalid(
                op,
                "d_in / d_out",
                format!("{} / {}", self.d_in, self.d_out),
                "a target has at least one input and one output feature",
            ));
        }
        if !self.scale.is_finite() {
            return Err(invalid(op, "scale", self.scale, "must be finite"));
        }
        if let Some(ld) = self.ldy {
            if ld < self.d_out || i64::try_from(ld).is_err() {
                return Err(invalid(
                    op,
                    "ldy",
                    ld,
                    "the row stride of y / dy must be at least d_out (and fit an i64)",
                ));
            }
        }
        Ok(())
    }

    /// Check that `y` (or `dy`, named `tensor`) of `len` elements holds every row: exactly
    /// `rows·d_out` when packed, at least `(rows − 1)·ldy + d_out` when strided.
    fn check_y(
        &self,
        op: &'static str,
        tensor: &'static str,
        len: usize,
    ) -> Result<(), ShapeError> {
        let Some(ld) = self.ldy else {
            return check_len(
                op,
                tensor,
                checked_len(op, tensor, &[self.rows, self.d_out])?,
                len,
            );
        };
        let reach = match self.rows {
            0 => 0,
            n => (n - 1)
                .checked_mul(ld)
                .and_then(|v| v.checked_add(self.d_out))
                .ok_or(ShapeError::Overflow { op, tensor })?,
        };
        if len < reach {
            return Err(ShapeError::Invalid {
                op,
                name: tensor,
                value: format!(
                    "{len} elements (rows {} with row stride {ld} reach {reach})",
                    self.rows
                ),
                reason:
                    "the buffer ends before the last row's block; pass a longer view or fix ldy",
            });
        }
        Ok(())
    }

    fn lens(&self, op: &'static str) -> Result<Lens, ShapeError> {
        let (n, i, o, r) = (self.rows, self.d_in, self.d_out, self.rank);
        Ok(Lens {
            x: checked_len(op, "x", &[n, i])?,
            a: checked_len(op, "a", &[r, i])?,
            b: checked_len(op, "b", &[o, r])?,
            u: checked_len(op, "u", &[n, r])?,
        })
    }
}

struct Lens {
    x: usize,
    a: usize,
    b: usize,
    u: usize,
}

/// Which implementation runs the adapter's products on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LoraKernel {
    /// Through the GEMM tuner when tuning is on (each product is one tuned GEMM, the skinny
    /// kernels among its candidates); otherwise the rule of
    /// [`crate::ops::matmul::tuning::lora_rule`].
    #[default]
    Auto,
    /// The skinny kernels of `kernels/lora_gemm.hip` (rank ≤ [`MAX_RANK`]).
    Skinny,
    /// [`crate::ops::matmul()`] for every product.
    Gemm,
}

/// Forward of one adapted target: `u = x·Aᵀ`, then `y += scale·u·Bᵀ` (`u` rounded to T
/// before the second product, as it is stored).
pub struct LoraForward<'a, S: Space, T: hip_rt::Element> {
    /// Dimensions and scale (`accumulate` is not used).
    pub params: LoraParams,
    /// Target input `[rows, d_in]`.
    pub x: S::In<'a, T>,
    /// `lora_A` `[rank, d_in]`.
    pub a: S::In<'a, T>,
    /// `lora_B` `[d_out, rank]`.
    pub b: S::In<'a, T>,
    /// `x·Aᵀ` `[rows, rank]`, overwritten (keep it for the backward).
    pub u: S::Out<'a, T>,
    /// Target output `[rows, d_out]` (the base product; rows [`LoraParams::ldy`] apart), added
    /// to.
    pub y: S::Out<'a, T>,
}

impl<S: Space, T: hip_rt::Element> LoraForward<'_, S, T> {
    /// Check the parameters and every length.
    pub fn validate(&self) -> Result<(), ShapeError> {
        const OP: &str = LoraParams::FORWARD;
        self.params.check(OP)?;
        let l = self.params.lens(OP)?;
        check_len(OP, "x", l.x, self.x.numel())?;
        check_len(OP, "a", l.a, self.a.numel())?;
        check_len(OP, "b", l.b, self.b.numel())?;
        check_len(OP, "u", l.u, self.u.numel())?;
        self.params.check_y(OP, "y", self.y.numel())
    }
}

/// Backward of one adapted target: `du = scale·dy·B` (rounded to T, then used by the last two
/// products), `db (+)= scale·dyᵀ·u`, `da (+)= duᵀ·x`, `dx += du·A`.
pub struct LoraBackward<'a, S: Space, T: hip_rt::Element> {
    /// Dimensions, scale and `accumulate` (for `da` and `db`).
    pub params: LoraParams,
    /// Target input `[rows, d_in]`.
    pub x: S::In<'a, T>,
    /// Gradient of the target output `[rows, d_out]` (rows [`LoraParams::ldy`] apart).
    pub dy: S::In<'a, T>,
    /// `lora_A` `[rank, d_in]`.
    pub a: S::In<'a, T>,
    /// `lora_B` `[d_out, rank]`.
    pub b: S::In<'a, T>,
    /// The forward's `u = x·Aᵀ` `[rows, rank]`.
    pub u: S::In<'a, T>,
    /// `scale·dy·B` `[rows, rank]`, overwritten (scratch the caller owns).
    pub du: S::Out<'a, T>,
    /// Gradient of `lora_A` `[rank, d_in]`.
    pub da: S::Out<'a, T>,
    /// Gradient of `lora_B` `[d_out, rank]`.
    pub db: S::Out<'a, T>,
    /// Gradient of the target input `[rows, d_in]`, added to.
    pub dx: S::Out<'a, T>,
}

impl<S: Space, T: hip_rt::Element> LoraBackward<'_, S, T> {
    /// Check the parameters and every length.
    pub fn validate(&self) -> Result<(), ShapeError> {
        const OP: &str = LoraParams::BACKWARD;
        self.params.check(OP)?;
        let l = self.params.lens(OP)?;
        check_len(OP, "x", l.x, self.x.numel())?;
        self.params.check_y(OP, "dy", self.dy.numel())?;
        check_len(OP, "a", l.a, self.a.numel())?;
        check_len(OP, "b", l.b, self.b.numel())?;
        check_len(OP, "u", l.u, self.u.numel())?;
        check_len(OP, "du", l.u, self.du.numel())?;
        check_len(OP, "da", l.a, self.da.numel())?;
        check_len(OP, "db", l.b, self.db.numel())?;
        check_len(OP, "dx", l.x, self.dx.numel())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::Host;

    #[test]
    fn validation_names_the_bad_value() {
        let p = LoraParams::new(3, 4, 5, 2, 0.5);
        assert!(!p.accumulate && p.accumulating().accumulate);
        let (x, a, b) = (vec![0f32; 12], vec![0f32; 8], vec![0f32; 10]);
        let (mut u, mut y) = (vec![0f32; 6], vec![0f32; 15]);
        let ok = LoraForward::<Host, f32> {
            params: p,
            x: &x,
            a: &a,
            b: &b,
            u: &mut u,
            y: &mut y,
        };
        ok.validate().unwrap();
        let e = LoraForward::<Host, f32> {
            params: LoraParams { rank: 0, ..p },
            x: &x,
            a: &a,
            b: &b,
            u: &mut u,
            y: &mut y,
        }
        .validate()
        .unwrap_err();
        assert!(e.to_string().contains("rank = 0"), "{e}");
        let e = LoraForward::<Host, f32> {
            params: LoraParams {
                scale: f32::NAN,
                ..p
            },
            x: &x,
            a: &a,
            b: &b,
            u: &mut u,
            y: &mut y,
        }
        .validate()
        .unwrap_err();
        assert!(e.to_string().contains("scale"), "{e}");
        let e = LoraForward::<Host, f32> {
            params: p,
            x: &x,
            a: &b,
            b: &b,
            u: &mut u,
            y: &mut y,
        }
        .validate()
        .unwrap_err();
        assert!(e.to_string().contains("`a` has 10 elements"), "{e}");
    }
}
