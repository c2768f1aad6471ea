//! The CPU reference: the oracle every device kernel is judged against.
//!
//! Same operation names and arguments as the device launchers in [`crate::ops`], with slices
//! instead of device buffers; shapes and hyper-parameters come from [`crate::params`].
//!
//! Numerics: every reduction and every intermediate is computed in **f64** from the exact
//! widening of the stored inputs, and each output is rounded once (via f32, as torch casts) to its
//! storage type. Kernels accumulate in f32, so this reference is strictly more accurate than what
//! it checks. Work is split over threads with `std::thread::scope` when it is large enough to pay.
//!
//! Errors: every function validates all lengths and parameters before touching any output and
//! returns [`ShapeError`] naming the tensor and the values; it never panics on bad input.

mod adamw;
mod attention;
mod attention_strided;
mod bias;
mod clip;
mod crossentropy;
mod encoder;
mod error;
pub mod exact;
mod gelu;
mod layernorm;
mod matmul;
mod residual;

pub use crate::params::{
    AdamWConfig, AdamWStep, AttentionShape, DType, Element, LayerNormShape, MatmulShape, ShapeError,
};
pub use adamw::{adamw, adamw_master, l2_norm, non_finite};
pub use attention::{attention_backward, attention_forward};
pub use attention_strided::{
    attention_backward_strided, attention_forward_strided, AttentionBackwardStrided,
    AttentionForwardStrided, AttentionLayout, Qkv, Strided,
};
pub use bias::{
    bias_backward, matmul_bias, BiasBackward, BiasParams, MatmulBias, MatmulBiasParams,
};
pub use clip::{clip_coefficient, clip_grad_scale, ClipGradScale, ClipParams, CLIP_EPS};
pub use crossentropy::{
    softmax_cross_entropy, CrossEntropyParams, SoftmaxCrossEntropy, IGNORE_INDEX,
};
pub use encoder::{
    encoder_backward, encoder_forward, EncoderBackward, EncoderForward, EncoderParams,
};
pub use error::OpError;
pub use gelu::{
    gelu_backward, gelu_forward, gelu_tanh, gelu_tanh_grad, ElementwiseParams, GeluBackward,
    GeluForward,
};
pub use layernorm::{layernorm_backward, layernorm_forward};
pub use matmul::matmul;
pub use residual::{
    residual_add, residual_layernorm_forward, ResidualAdd, ResidualLayerNormForward,
    ResidualLayerNormParams,
};

/// Below this many multiply-adds a call runs on the calling thread.
const PAR_MIN_WORK: usize = 1 << 16;

/// Run `f` on every item, spreading items over up to `available_parallelism` scoped threads when
/// `work` (total multiply-adds, roughly) is large enough.
fn par_for_each<I: Send>(items: Vec<I>, work: usize, f: impl Fn(I) + Sync) {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(items.len());
    if threads <= 1 || work < PAR_MIN_WORK {
        items.into_iter().for_each(f);
        return;
    }
    let per = items.len().div_ceil(threads);
    let mut groups: Vec<Vec<I>> = Vec::with_capacity(threads);
    let mut it = items.into_iter().peekable();
    while it.peek().is_some() {
        groups.push(it.by_ref().take(per).collect());
    }
    let f = &f;
    std::thread::scope(|s| {
        for g in groups {
            s.spawn(move || g.into_iter().for_each(f));
        }
    });
}

/// Exact widening of a storage slice to f64.
fn widen<T: Element>(x: &[T]) -> Vec<f64> {
    x.iter().map(|v| v.to_f64()).collect()
}

/// Round each f64 once into its storage slot (lengths were validated by the caller).
fn narrow<T: Element>(src: &[f64], dst: &mut [T]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = T::from_f64(*s);
    }
}
