// kernels/rope.hip — rotary position embedding, in place on strided q or k views, forward
// (rotation by +angle) and backward (the same kernel by −angle).
//
// NEVER RUN ON A GPU: compiled and statically checked for gfx906 only; executed on the CPU by
// hip-emu (the emulated HIP device) in the device tests, against the CPU reference.
//
//   rope_<T>(x, pos, freqs, tokens, seq, heads, offset, batch_stride, seq_stride, head_stride,
//            half, interleaved, sign, vec)
// Token t = b·seq + s (b < tokens/seq) has position pos[t] (int32, any value: packed sequences
// restart at 0) and heads h < `heads` whose rows start at
// offset + b·batch_stride + s·seq_stride + h·head_stride (elements; the vocabulary of
// ops::AttentionLayout, so q and k are rotated where the projection wrote them, no copy).
// Pair i < half (R = 2·half rotary dims; dims R.. of the row are not touched) is the elements
// (i, i + half) of the row (HF's rotate_half) or (2i, 2i + 1) (`interleaved`, GPT-J/ChatGLM),
// rotated by a = sign·pos·freqs[i]: (x1, x2) -> (x1·cos a − x2·sin a, x2·cos a + x1·sin a).
// sign is +1 forward, −1 backward (the gradient of a rotation is the opposite rotation).
//
// Angles: pos·f is formed exactly as hi + lo (hi = the f32 product, lo = its rounding error by
// fma), sin/cos of hi (the accurate library functions, full range reduction) then corrected to
// first order in lo: the result is the rotation of the exact f32 angle pos·f to f32 accuracy,
// for any position (a plain f32 product would be off by up to pos·2⁻²⁴ rad).
//
// Threads: one per (token, group of P pairs); its P angles are computed once and applied to
// every head of the token in turn (rows are visited head by head: lanes of a wave cover
// consecutive pairs of the same head, coalesced). Vector layout (`vec`, decided by the launcher:
// half even, the view's start and every stride multiples of 4 elements, the buffer aligned):
// P = 2, one access of 2 + 2 elements (rotate_half) or 4 elements (interleaved) per head;
// otherwise P = 1, scalar accesses. Each element of the rotated dims is read once and written
// once: 2·sizeof(T) bytes per element, the minimum of an in-place op (`cargo xtask isa-report
// --only rope`: 8.00 B per f32 element in both pair layouts; 41–42 VGPRs, 0 scratch, 0 spills).
#include "common.h"

namespace {

constexpr int kBlock = 256;

/// cos and sin of sign·p·f, p·f formed exactly (see the header).
__device__ __forceinline__ void angle(float p, float f, float sign, float& c, float& s) {
  const float hi = p * f;
  const float lo = fmaf(p, f, -hi);
  const float sh = sinf(hi);
  const float ch = cosf(hi);
  c = ch - sh * lo;
  s = sign * (sh + ch * lo);
}

template <int P, bool kInterleaved, typename T>
__device__ __forceinline__ void rotate_row(T* row, int half, int i0,
                                           const float (&c)[P], const float (&s)[P]) {
  constexpr bool vec = P > 1;
  float a[P];
  float b[P];
  if constexpr (kInterleaved) {
    float v[2 * P];
    if constexpr (vec) {
      hipk::load_vec<2 * P>(row + 2 * i0, v);
    } else {
#pragma unroll
      for (int k = 0; k < 2 * P; ++k) v[k] = hipk::load_as_float(row, 2 * i0 + k);
    }
#pragma unroll
    for (int k = 0; k < P; ++k) {
      a[k] = v[2 * k] * c[k] - v[2 * k + 1] * s[k];
      b[k] = v[2 * k + 1] * c[k] + v[2 * k] * s[k];
      v[2 * k] = a[k];
      v[2 * k + 1] = b[k];
    }
    if constexpr (vec) {
      hipk::store_vec<2 * P>(row + 2 * i0, v);
    } else {
#pragma unroll
      for (int k = 0; k < 2 * P; ++k) hipk::store_from_float(row, 2 * i0 + k, v[k]);
    }
  } else {
    float x1[P];
    float x2[P];
    if constexpr (vec) {
      hipk::load_vec<P>(row + i0, x1);
      hipk::load_vec<P>(row + half + i0, x2);
    } else {
#pragma unroll
      for (int k = 0; k < P; ++k) {
        x1[k] = hipk::load_as_float(row, i0 + k);
        x2[k] = hipk::load_as_float(row, half + i0 + k);
      }
    }
#pragma unroll
    for (int k = 0; k < P; ++k) {
      a[k] = x1[k] * c[k] - x2[k] * s[k];
      b[k] = x2[k] * c[k] + x1[k] * s[k];
    }
    if constexpr (vec) {
      hipk::store_vec<P>(row + i0, a);
      hipk::store_vec<P>(row + half + i0, b);
    } else {
#pragma unroll
      for (int k = 0; k < P; ++k) {
        hipk::store_from_float(row, i0 + k, a[k]);
        hipk::store_from_float(row, half + i0 + k, b[k]);
      }
    }
  }
}

/// Every (token, group of P pairs) of the grid-stride walk; P = 2 in the vector layout.
template <int P, bool kInterleaved, typename T>
__device__ void rope_walk(T* x, const int* pos, const float* freqs, int64_t tokens, int64_t seq,
                          int heads, int64_t offset, int64_t batch_stride, int64_t seq_stride,
                          int64_t head_stride, int half, float sign) {
  constexpr bool kVec = P > 1;
  const int groups = half / P;
  const int64_t items = tokens * groups;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
#pragma unroll 1
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; item < items;
       item += stride) {
    const int64_t t = item / groups;
    const int i0 = static_cast<int>(item - t * groups) * P;
    const int64_t b = t / seq;
    const float p = static_cast<float>(pos[t]);
    float c[P];
    float s[P];
#pragma unroll
    for (int k = 0; k < P; ++k) angle(p, freqs[i0 + k], sign, c[k], s[k]);
    T* row = x + offset + b * batch_stride + (t - b * seq) * seq_stride;
    if constexpr (kVec && kInterleaved) {
      HIPK_HOT_LOOP_BEGIN("heads_interleaved elems=4 min_t=2 kind=memory");
    } else if constexpr (kVec) {
      HIPK_HOT_LOOP_BEGIN("heads_half elems=4 min_t=2 kind=memory");
    }
#pragma unroll 1
    for (int h = 0; h < heads; ++h) {
      rotate_row<P, kInterleaved>(row + h * head_stride, half, i0, c, s);
    }
    if constexpr (kVec && kInterleaved) {
      HIPK_HOT_LOOP_END("heads_interleaved");
    } else if constexpr (kVec) {
      HIPK_HOT_LOOP_END("heads_half");
    }
  }
}

template <typename T>
__device__ void rope_impl(T* x, const int* pos, const float* freqs, int64_t tokens, int64_t seq,
                          int heads, int64_t offset, int64_t batch_stride, int64_t seq_stride,
                          int64_t head_stride, int half, int interleaved, float sign, int vec) {
  // Layout and pair kind are compile-time: each hot loop moves exactly its own bytes.
  if (vec && interleaved) {
    rope_walk<2, true>(x, pos, freqs, tokens, seq, heads, offset, batch_stride, seq_stride,
                       head_stride, half, sign);
  } else if (vec) {
    rope_walk<2, false>(x, pos, freqs, tokens, seq, heads, offset, batch_stride, seq_stride,
                        head_stride, half, sign);
  } else if (interleaved) {
    rope_walk<1, true>(x, pos, freqs, tokens, seq, heads, offset, batch_stride, seq_stride,
                       head_stride, half, sign);
  } else {
    rope_walk<1, false>(x, pos, freqs, tokens, seq, heads, offset, batch_stride, seq_stride,
                        head_stride, half, sign);
  }
}

}  // namespace

#define ROPE_KERNELS(suffix, T)                                                                \
  HIPK_KERNEL(rope_##suffix, kBlock)                                                           \
  (T* x, const int* pos, const float* freqs, int64_t tokens, int64_t seq, int heads,           \
   int64_t offset, int64_t batch_stride, int64_t seq_stride, int64_t head_stride, int half,    \
   int interleaved, float sign, int vec) {                                                     \
    rope_impl<T>(x, pos, freqs, tokens, seq, heads, offset, batch_stride, seq_stride,          \
                 head_stride, half, interleaved, sign, vec);                                   \
  }

HIPK_DTYPES(ROPE_KERNELS)
