//! The rule that picks the LoRA adapter's implementation when the tuner is off (with tuning on,
//! each of the adapter's products is a tuned GEMM and the skinny kernels compete as the
//! `hipk-skinny` candidate).

use crate::ops::lora_gemm::{LoraKernel, LoraParams, MAX_RANK};

/// [`LoraKernel::Skinny`] for ranks 1 to [`MAX_RANK`] whose feature counts fit the kernels'
/// 32-bit column arguments, else [`LoraKernel::Gemm`].
///
/// Why by rule: each skinny kernel reads its big operand (`x`, `dy`, `y`, `dx`) once and moves
/// at least 80 % of the bytes it must (static, at N = C = 4096, see docs/PERFORMANCE.md), where
/// a 128×128 GEMM tile computes on r of its 128 columns (or rows) and splits the long
/// reductions over N across few tiles. No DCU has timed the two; the tuner's `hipk-skinny`
/// candidate is how a device decides.
pub fn lora_rule(p: &LoraParams) -> LoraKernel {
    let fits = |n: usize| n <= i32::MAX as usize;
    if (1..=MAX_RANK).contains(&p.rank) && fits(p.d_in) && fits(p.d_out) {
        LoraKernel::Skinny
    } else {
        LoraKernel::Gemm
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skinny_up_to_rank_64_then_the_gemm() {
        let p = LoraParams::new(4096, 4096, 4096, 8, 2.0);
        assert_eq!(lora_rule(&p), LoraKernel::Skinny);
        assert_eq!(lora_rule(&LoraParams { rank: 64, ..p }), LoraKernel::Skinny);
        assert_eq!(lora_rule(&LoraParams { rank: 65, ..p }), LoraKernel::Gemm);
        assert_eq!(lora_rule(&LoraParams { rank: 0, ..p }), LoraKernel::Gemm);
    }
}
