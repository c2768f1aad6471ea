// kernels/clip.hip — gradient clipping without a host round trip: AdamW's device-side
// grad_scale from the global L2 norm (multi_l2norm_finalize_f32's output, kernels/adamw.hip).
//
// NEVER RUN ON A GPU: compiled and statically checked for gfx906 only; executed on the CPU by
// hip-emu (the emulated HIP device) in the device tests, against the CPU reference.
//
// clip_grad_scale_f32(norm, loss_scale, max_norm, grad_scale), one thread:
//   s = loss_scale ? *loss_scale : 1      (the gradients as stored are multiplied by s)
//   c = min(1, max_norm / (*norm / s + 1e-6))   (torch.nn.utils.clip_grad_norm_; NaN stays NaN)
//   *grad_scale = s / c                   (AdamW divides the gradients by it: unscale + clip)
// An infinite norm gives c = 0 and grad_scale = +inf (such a step is skipped via found_inf).
// Belongs with the AdamW kernels; a file of its own while kernels/adamw.hip is being changed
// elsewhere.
//
// Resource usage on gfx906 (hipcc 5.2 / clang 15, -O3), from the build's resource table
// (`cargo test --test kernels_static -- --nocapture` prints it):
//   kernel                    VGPRs  SGPRs  LDS B  waves/SIMD  scratch  spills
//   clip_grad_scale_f32           6     11      0          10        0       0
#include "common.h"

HIPK_KERNEL(clip_grad_scale_f32, 64)
(const float* norm, const float* loss_scale, float max_norm, float* grad_scale) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  const float s = loss_scale != nullptr ? *loss_scale : 1.0f;
  float c = max_norm / (*norm / s + 1e-6f);
  if (!(c != c)) c = fminf(c, 1.0f);
  *grad_scale = s / c;
}
