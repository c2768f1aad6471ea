//! The one table of kernel symbols each `kernels/*.hip` exports.
//!
//! The manifest test (`tests/kernels_static.rs`) checks it against the embedded bundles in both
//! directions: every bundle has an entry here, and every listed symbol is in the code object of
//! every arch. Launchers look kernels up by these names.

/// The kernels one source file exports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelFile {
    /// File stem under `kernels/`.
    pub source: &'static str,
    /// Exported `extern "C"` kernel names.
    pub kernels: &'static [&'static str],
}

/// Every kernel source and its kernels.
pub const KERNEL_FILES: &[KernelFile] = &[
    KernelFile {
        source: "layernorm",
        kernels: &[
            "layernorm_fwd_f32",
            "layernorm_fwd_f16",
            "layernorm_fwd_bf16",
            "layernorm_bwd_f32",
            "layernorm_bwd_f16",
            "layernorm_bwd_bf16",
            "layernorm_bwd_dwdb_f32",
            "layernorm_bwd_dwdb_f16",
            "layernorm_bwd_dwdb_bf16",
        ],
    },
    KernelFile {
        source: "adamw",
        kernels: &[
            "adamw_f32",
            "adamw_f16",
            "adamw_bf16",
            "multi_nonfinite_f32",
            "multi_nonfinite_f16",
            "multi_nonfinite_bf16",
            "multi_l2norm_f32",
            "multi_l2norm_f16",
            "multi_l2norm_bf16",
            "multi_l2norm_finalize_f32",
        ],
    },
    KernelFile {
        source: "matmul",
        kernels: &[
            "matmul_nn_f32",
            "matmul_nt_f32",
            "matmul_tn_f32",
            "matmul_tt_f32",
            "matmul_nn_f16",
            "matmul_nt_f16",
            "matmul_tn_f16",
            "matmul_tt_f16",
            "matmul_nn_bf16",
            "matmul_nt_bf16",
            "matmul_tn_bf16",
            "matmul_tt_bf16",
            "matmul_small_nn_f32",
            "matmul_small_nt_f32",
            "matmul_small_tn_f32",
            "matmul_small_tt_f32",
            "matmul_small_nn_f16",
            "matmul_small_nt_f16",
            "matmul_small_tn_f16",
            "matmul_small_tt_f16",
            "matmul_small_nn_bf16",
            "matmul_small_nt_bf16",
            "matmul_small_tn_bf16",
            "matmul_small_tt_bf16",
        ],
    },
    KernelFile {
        source: "attention",
        kernels: &[
            "attention_fwd_d32_f32",
            "attention_fwd_d64_f32",
            "attention_fwd_d96_f32",
            "attention_fwd_d128_f32",
            "attention_bwd_dkdv_d32_f32",
            "attention_bwd_dq_d32_f32",
            "attention_bwd_dkdv_d64_f32",
            "attention_bwd_dq_d64_f32",
            "attention_bwd_dkdv_d96_f32",
            "attention_bwd_dq_d96_f32",
            "attention_bwd_dkdv_d128_f32",
            "attention_bwd_dq_d128_f32",
            "attention_bwd_dot_f32",
            "attention_fwd_d32_f16",
            "attention_fwd_d64_f16",
            "attention_fwd_d96_f16",
            "attention_fwd_d128_f16",
            "attention_bwd_dkdv_d32_f16",
            "attention_bwd_dq_d32_f16",
            "attention_bwd_dkdv_d64_f16",
            "attention_bwd_dq_d64_f16",
            "attention_bwd_dkdv_d96_f16",
            "attention_bwd_dq_d96_f16",
            "attention_bwd_dkdv_d128_f16",
            "attention_bwd_dq_d128_f16",
            "attention_bwd_dot_f16",
            "attention_fwd_d32_bf16",
            "attention_fwd_d64_bf16",
            "attention_fwd_d96_bf16",
            "attention_fwd_d128_bf16",
            "attention_bwd_dkdv_d32_bf16",
            "attention_bwd_dq_d32_bf16",
            "attention_bwd_dkdv_d64_bf16",
            "attention_bwd_dq_d64_bf16",
            "attention_bwd_dkdv_d96_bf16",
            "attention_bwd_dq_d96_bf16",
            "attention_bwd_dkdv_d128_bf16",
            "attention_bwd_dq_d128_bf16",
            "attention_bwd_dot_bf16",
        ],
    },
    KernelFile {
        source: "encoder",
        kernels: &[
            "encoder_links_i32",
            "encoder_fwd_f32",
            "encoder_bwd_dwte_f32",
            "encoder_bwd_dwpe_f32",
            "encoder_fwd_f16",
            "encoder_bwd_dwte_f16",
            "encoder_bwd_dwpe_f16",
            "encoder_fwd_bf16",
            "encoder_bwd_dwte_bf16",
            "encoder_bwd_dwpe_bf16",
        ],
    },
    KernelFile {
        source: "gelu",
        kernels: &[
            "gelu_fwd_f32",
            "gelu_bwd_f32",
            "residual_add_f32",
            "gelu_fwd_f16",
            "gelu_bwd_f16",
            "residual_add_f16",
            "gelu_fwd_bf16",
            "gelu_bwd_bf16",
            "residual_add_bf16",
        ],
    },
    KernelFile {
        source: "crossentropy",
        kernels: &[
            "crossentropy_count_i32",
            "crossentropy_mean_f32",
            "crossentropy_f32",
            "crossentropy_f16",
            "crossentropy_bf16",
        ],
    },
    KernelFile {
        source: "bias",
        kernels: &[
            "bias_bwd_partial_f32",
            "bias_bwd_final_f32",
            "bias_add_f32",
            "bias_bwd_partial_f16",
            "bias_bwd_final_f16",
            "bias_add_f16",
            "bias_bwd_partial_bf16",
            "bias_bwd_final_bf16",
            "bias_add_bf16",
        ],
    },
    KernelFile {
        source: "clip",
        kernels: &["clip_grad_scale_f32"],
    },
];

/// The kernels of `kernels/<source>.hip`, if the table lists it.
pub fn kernel_names(source: &str) -> Option<&'static [&'static str]> {
    KERNEL_FILES
        .iter()
        .find(|f| f.source == source)
        .map(|f| f.kernels)
}
