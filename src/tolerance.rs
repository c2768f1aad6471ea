//! Comparison tolerances, per rule and output dtype, in one place with the reasons. Each op picks
//! the [`Rule`] that describes how its kernels compute (see `docs/ADDING-AN-OP.md`); a new op
//! adds a rule here only when none fits, with its reason.
//!
//! A value `got` matches `expected` iff `|got − expected| ≤ atol + rtol·|expected|`, or both are
//! NaN, or both are the same infinity (an `lse` of −inf for a fully masked row).
//!
//! Expected values are exact (f64) results rounded once to the output dtype. The implementations
//! checked against them are the CPU reference (f64, so at most one rounding flip away) and the
//! device kernels, which accumulate in f32. The tolerances therefore have three parts:
//!
//! 1. **Storage rounding**: torch.testing's defaults for the output dtype: f32 rtol 1.3e-6,
//!    f16 rtol 1e-3, bf16 rtol 1.6e-2, atol 1e-5. One unit in the last place is at most 2^-10
//!    (f16) or 2^-7 (bf16) relative, so a single rounding flip always fits.
//! 2. **f32 accumulation** (widened, reductions only): a sum of `L` terms of magnitude O(1)
//!    (inputs are N(0, 1)) accumulated in f32 has rounding error of order `u·L`
//!    (`u = 2^-24`; random-walk standard deviation ≈ 0.7·u·L for a sequential sum). Where the
//!    result cancels to near zero the relative term does not help, so `atol` grows by
//!    `4·u·L` (≈ 6σ): 1.2e-4 at L = 512. Elementwise ops (AdamW) get no such term.
//! 3. **Attention backward in f16/bf16** (widened): FlashAttention-style kernels round `P` and
//!    `dS` to the storage type before the second matmul, an error of one storage unit roundoff
//!    per term that adds up like a random walk: `atol` grows by `u_dtype·√L`.
//!    hip-kernels' own attention kernels (`kernels/attention.hip`) round nothing before the
//!    output (P and dS stay f32), so their device tests hold the backward to
//!    [`Rule::Reduction`] (`L = max(tq, tk, head_dim)`; worst error ÷ tolerance seen on hip-emu
//!    for the fused-QKV backward: f32 0.09, f16 0.86, bf16 0.39), as do the strided golden
//!    cases. The packed golden cases keep this rule: their tolerance must also admit a
//!    FlashAttention-style kernel (`tests/cpu_f32_model.rs` models one).
//!
//! **AdamW in f32** is tightened instead: the default atol 1e-5 would be a tenth of the optimizer
//! state (`exp_avg_sq` ≈ 1e-4) and hide a wrong moment update. The state is an elementwise f32
//! expression of values ≤ 1e-1 (gradients ≈ 1e-2 after unscaling), so its error is below
//! `u·1e-1` ≈ 6e-9: `atol = 1e-8`. The parameter `p·(1 − lr·wd) − update` can cancel to near 0
//! from `|p|` up to ≈ 5 (N(0, 1) draws), an error of about `2·u·|p|` ≈ 6e-7: `atol = 1e-6`,
//! still a thousandth of a typical update (lr ≥ 1e-2 in the cases).
//!
//! **Layer norm `dx`** is `rstd·(g·w − mean(g·w) − x̂·mean(g·w·x̂))`: the bracket is formed in
//! f32 from O(1) terms, so its absolute error is what part 2 allows, and the final product
//! multiplies that error by `rstd`. With N(0, 1) rows `rstd` ≈ 1 and nothing changes, but a row
//! of (nearly) constant values has `rstd` up to `1/√eps` (≈ 316 at eps = 1e-5): with one column,
//! `x̂ = 0` and the exact bracket is `g·w − g·w = 0`, yet a kernel that contracts `g·w − m` into
//! one fma (hipcc and clang do by default) gets the rounding error of `g·w` (≈ `u·|g·w|`)
//! instead, times 316 ≈ 1.5e-5. That is the correct f32 result of the formula, not a kernel
//! bug, so [`layernorm_dx_tolerance`] scales `atol` by `max(1, rstd)` for each row.
//!
//! **Softmax cross-entropy gradients** ([`softmax_gradient`]): `dlogits = (p − onehot)·s` with
//! `s = dloss/n` (n counted rows) can be ~1e-7 for a 50257-wide row, far below the default
//! atol, so the absolute floor scales with `s`; `p = exp(x − lse)` inherits the relative error
//! of `lse`'s sum of V exponentials (`4·u·V`, rule 2 as a relative term).
//!
//! **Linear cross-entropy** ([`linear_crossentropy`]): the device stores the logits `h·Wᵀ` and
//! their gradient in the storage type between its GEMMs (as the plain path, matmul to logits
//! then the fused cross-entropy, does); the f64 reference rounds nothing. A logit rounded to
//! `T` moves by at most `u_T·X` (X = the largest |logit| of the case), which moves a loss by at
//! most `2·u_T·X` and each `p_j` by a relative `2·u_T·X`; the stored gradient adds `u_T`
//! relative and the kernel's f32 softmax `4·u·V` (as above). So, with `s = dloss/n`:
//! losses and the loss get `atol += 2·u_T·X` over rule 2 with `L = C + V`; `dh = Σ_j g_j·W_j`
//! (`Σ_j |g_j| ≤ 2s`) gets `atol += 2s·Wmax·(u_T·(2X + 1) + 4u·V)` plus rule 2 over `V` terms
//! of size `s·Wmax`; `dW_j (+)= Σ_i g_ij·h_i` the same per row, times the `N` rows, with
//! `Hmax`. For f32 these are rule 2; for bf16 (`u_T = 2^-8`, X ≈ 4) about 7% of `s·Wmax`,
//! still far below the `O(s·Wmax)` error of a wrong or missing chunk.

use crate::params::DType;

/// A closeness criterion `|got − expected| ≤ atol + rtol·|expected|`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    /// Relative tolerance.
    pub rtol: f64,
    /// Absolute tolerance.
    pub atol: f64,
}

/// f32 unit roundoff.
const U_F32: f64 = 1.0 / (1u64 << 24) as f64;

impl Tolerance {
    /// torch.testing.assert_close's defaults for a dtype.
    pub const fn torch_default(dtype: DType) -> Tolerance {
        match dtype {
            DType::F32 => Tolerance {
                rtol: 1.3e-6,
                atol: 1e-5,
            },
            DType::F16 => Tolerance {
                rtol: 1e-3,
                atol: 1e-5,
            },
            DType::BF16 => Tolerance {
                rtol: 1.6e-2,
                atol: 1e-5,
            },
        }
    }

    /// Whether `got` is close enough to `expected`.
    pub fn allows(&self, got: f64, expected: f64) -> bool {
        if got.is_nan() || expected.is_nan() {
            return got.is_nan() && expected.is_nan();
        }
        if got.is_infinite() || expected.is_infinite() {
            return got == expected;
        }
        (got - expected).abs() <= self.atol + self.rtol * expected.abs()
    }
}

/// Unit roundoff of a storage type (half an ulp at 1).
pub const fn unit_roundoff(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => U_F32,
        DType::F16 => 1.0 / 2048.0,
        DType::BF16 => 1.0 / 256.0,
    }
}

/// How an op's outputs are computed, which decides their tolerance (reasons in the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// Storage rounding plus f32 accumulation over the reduction (matmul, layer norm, attention
    /// forward; elementwise ops with `reduction_len` 1).
    Reduction,
    /// [`Rule::Reduction`], widened for f16/bf16 inputs by FlashAttention's rounding of `P` and
    /// `dS` to the storage type (attention backward).
    RoundedIntermediates,
    /// An optimizer step: f32 state and parameters tightened (AdamW).
    Optimizer,
}

/// The tolerance for an output of an op following `rule`, stored as `dtype`, whose elements are
/// reductions over `reduction_len` terms (1 for elementwise outputs). Reasons in the module docs.
///
/// `tensor` is the output's schema name (`out`, `lse`, `param`, `exp_avg`, ...); `dtype` is its
/// own dtype (f32 for `lse`, `mean`, `rstd` and optimizer state); `input_dtype` is the op's
/// storage dtype (it decides the [`Rule::RoundedIntermediates`] widening).
pub fn tolerance(
    rule: Rule,
    tensor: &str,
    dtype: DType,
    input_dtype: DType,
    reduction_len: usize,
) -> Tolerance {
    let base = Tolerance::torch_default(dtype);
    let l = reduction_len.max(1) as f64;
    match rule {
        Rule::Optimizer if dtype == DType::F32 && tensor == "param" => Tolerance {
            rtol: base.rtol,
            atol: 1e-6,
        },
        Rule::Optimizer if dtype == DType::F32 => Tolerance {
            rtol: base.rtol,
            atol: 1e-8,
        },
        Rule::Optimizer => base,
        Rule::RoundedIntermediates if input_dtype != DType::F32 => Tolerance {
            rtol: base.rtol,
            atol: base.atol + 4.0 * U_F32 * l + unit_roundoff(input_dtype) * l.sqrt(),
        },
        _ => Tolerance {
            rtol: base.rtol,
            atol: base.atol + 4.0 * U_F32 * l,
        },
    }
}

/// The tolerance for the layer-norm backward's `dx` on a row whose saved `rstd` is `rstd`:
/// [`tolerance`]'s `atol` times `max(1, rstd)`, because `dx` is `rstd` times a bracket whose
/// f32 error that `atol` bounds (module docs). `cols` is the row length (the reduction length).
pub fn layernorm_dx_tolerance(dtype: DType, cols: usize, rstd: f64) -> Tolerance {
    let base = tolerance(Rule::Reduction, "dx", dtype, dtype, cols);
    let scale = if rstd.is_finite() {
        rstd.abs().max(1.0)
    } else {
        1.0
    };
    Tolerance {
        rtol: base.rtol,
        atol: base.atol * scale,
    }
}

/// The tolerance of a fused softmax cross-entropy gradient `(p − onehot)·scale` over `vocab`
/// classes stored as `dtype` (see the module docs).
pub fn softmax_gradient(dtype: DType, vocab: usize, scale: f64) -> Tolerance {
    let base = Tolerance::torch_default(dtype);
    Tolerance {
        rtol: base.rtol + 4.0 * U_F32 * vocab.max(1) as f64,
        atol: base.atol * scale,
    }
}

/// What [`linear_crossentropy`] needs to know of a case: sizes, the gradient scale
/// `s = dloss/n` and the largest magnitudes of the logits, `h` and `W`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinearCeBounds {
    /// Rows N.
    pub rows: usize,
    /// Hidden size C.
    pub dim: usize,
    /// Classes V.
    pub vocab: usize,
    /// `|dloss| / n` (the gradient's scale).
    pub scale: f64,
    /// Largest |h·Wᵀ| of the case.
    pub logit_max: f64,
    /// Largest |h|.
    pub h_max: f64,
    /// Largest |W|.
    pub w_max: f64,
}

/// The tolerance of `linear_crossentropy`'s `output` (`losses`, `loss`, `totals`, `dh`,
/// `dweight`) stored as `dtype`, for storage type `input_dtype` (see the module docs).
pub fn linear_crossentropy(
    output: &str,
    dtype: DType,
    input_dtype: DType,
    b: &LinearCeBounds,
) -> Tolerance {
    let ut = unit_roundoff(input_dtype);
    let v = b.vocab.max(1) as f64;
    let grad = |magnitude: f64, terms: usize| {
        let base = tolerance(Rule::Reduction, output, dtype, input_dtype, terms);
        let per_row =
            2.0 * b.scale * magnitude * (ut * (2.0 * b.logit_max + 1.0) + 4.0 * U_F32 * v);
        Tolerance {
            rtol: base.rtol,
            atol: base.atol * b.scale * magnitude + per_row,
        }
    };
    match output {
        "dh" => grad(b.w_max, b.vocab),
        "dweight" => {
            let t = grad(b.h_max, b.rows);
            Tolerance {
                rtol: t.rtol,
                atol: t.atol * b.rows.max(1) as f64,
            }
        }
        _ => {
            let base = tolerance(Rule::Reduction, output, dtype, input_dtype, b.dim + b.vocab);
            let rows = if output == "totals" {
                b.rows.max(1) as f64
            } else {
                1.0
            };
            Tolerance {
                rtol: base.rtol,
                atol: (base.atol + 2.0 * ut * b.logit_max) * rows,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allows_special_values_only_when_equal() {
        let t = Tolerance::torch_default(DType::F32);
        assert!(t.allows(f64::NAN, f64::NAN));
        assert!(!t.allows(0.0, f64::NAN));
        assert!(t.allows(f64::NEG_INFINITY, f64::NEG_INFINITY));
        assert!(!t.allows(f64::INFINITY, f64::NEG_INFINITY));
        assert!(!t.allows(-1e30, f64::NEG_INFINITY));
        assert!(t.allows(1.0 + 1e-6, 1.0));
        assert!(!t.allows(1.0 + 1e-4, 1.0));
    }

    #[test]
    fn one_ulp_of_each_dtype_fits_and_reductions_widen() {
        for d in DType::ALL {
            let t = Tolerance::torch_default(d);
            // An ulp just below 2 (the worst relative spacing) is 2·unit_roundoff relative to 1.
            assert!(t.allows(1.0 + 2.0 * unit_roundoff(d), 1.0), "{d}");
        }
        let short = tolerance(Rule::Reduction, "out", DType::F32, DType::F32, 1);
        let long = tolerance(Rule::Reduction, "out", DType::F32, DType::F32, 512);
        assert!(long.atol > 1e-4 && short.atol < 1.1e-5);
        assert_eq!(
            tolerance(Rule::Optimizer, "exp_avg", DType::F32, DType::F32, 1).atol,
            1e-8
        );
        assert_eq!(
            tolerance(Rule::Optimizer, "param", DType::F32, DType::F32, 1).atol,
            1e-6
        );
        assert!(
            tolerance(Rule::RoundedIntermediates, "dq", DType::F16, DType::F16, 64).atol
                > tolerance(Rule::RoundedIntermediates, "dq", DType::F32, DType::F32, 64).atol
        );
    }

    #[test]
    fn layernorm_dx_widens_by_rstd_only_above_one() {
        let base = tolerance(Rule::Reduction, "dx", DType::F32, DType::F32, 1);
        assert_eq!(layernorm_dx_tolerance(DType::F32, 1, 0.5), base);
        let eps = 1e-5f64;
        let flat = layernorm_dx_tolerance(DType::F32, 1, 1.0 / eps.sqrt());
        // The rounding of one g·w ≈ 0.8 in f32, times rstd = 316: the case seen on hip-emu.
        let err = 0.8 * U_F32 * 316.2;
        assert!(!base.allows(err, 0.0) && flat.allows(err, 0.0));
        assert!(!flat.allows(1e-2, 0.0), "still far below a wrong dx");
        assert_eq!(layernorm_dx_tolerance(DType::F32, 1, f64::NAN), base);
    }
}
