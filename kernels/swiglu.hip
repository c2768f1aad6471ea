// kernels/swiglu.hip — the SwiGLU gate of a LLaMA MLP: h = silu(g)·u, forward and backward.
//
// NEVER RUN ON A GPU: compiled and statically checked for gfx906 only; executed on the CPU by
// hip-emu (the emulated HIP device) in the device tests, against the CPU reference.
//
//   swiglu_fwd_<T>(g, u, h, rows, F, in_stride):            h = silu(g)·u
//   swiglu_bwd_<T>(g, u, dh, dg, du, rows, F, in_stride, grad_stride):
//                                                           dg = dh·u·σ(g)·(1 + g·(1 − σ(g))),
//                                                           du = dh·silu(g)
// with silu(g) = g·σ(g), σ(g) = 1/(1 + e^−g). h and dh are [rows, F] (row stride F); g, u, dg
// and du are read and written with row stride `in_stride`: F for two separate [rows, F]
// buffers, 2F for the two halves of one fused gate-up output [rows, 2F] (the launcher passes
// u = g + F, du = dg + F: each row is [gate(0..F), up(F..2F)]). f32 math, one rounding per
// output; dg/du are overwritten, never read.
//
// Memory: a thread handles a pack of 16 bytes per tensor (4 f32 or 8 f16/bf16 elements) inside
// one row: one vector access per tensor when F is a multiple of the pack and every pointer and
// stride keeps packs aligned (the `vec` argument, decided by the launcher), else scalar
// accesses. Columns walk blockIdx.x / threadIdx.x, rows blockIdx.y grid-stride: no division.
// Bytes moved: each tensor once (3·sizeof(T) per element forward, 5 backward): 12.00 and 20.00 B
// per f32 element by `cargo xtask isa-report --only swiglu` (static, gfx906), 0 scratch, 0 spills.
#include "common.h"

namespace {

constexpr int kBlock = 256;

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/// The first column of this thread's pack of N columns (the same in every row it visits).
template <int N> __device__ __forceinline__ int64_t pack_col() {
  return (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * N;
}

template <int N, typename T>
__device__ __forceinline__ void load(const T* p, int64_t i, bool vec, float (&out)[N]) {
  if (vec) {
    hipk::load_vec<N>(p + i, out);
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) out[k] = hipk::load_as_float(p, i + k);
  }
}

template <int N, typename T>
__device__ __forceinline__ void store(T* p, int64_t i, bool vec, const float (&in)[N]) {
  if (vec) {
    hipk::store_vec<N>(p + i, in);
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) hipk::store_from_float(p, i + k, in[k]);
  }
}

/// The pack of row `row` starting at column `col`: N columns, or fewer at the row's end
/// (scalar layout only: in the vector layout F is a multiple of N).
template <int N, typename T>
__device__ void swiglu_fwd_pack(const T* g, const T* u, T* h, int64_t row, int64_t col,
                                int64_t F, int64_t in_stride, bool vec) {
  const int64_t gi = row * in_stride + col;
  const int64_t hi = row * F + col;
  if (vec) {
    float vg[N];
    float vu[N];
    load<N>(g, gi, true, vg);
    load<N>(u, gi, true, vu);
#pragma unroll
    for (int k = 0; k < N; ++k) vg[k] = vg[k] * sigmoid(vg[k]) * vu[k];
    store<N>(h, hi, true, vg);
  } else {
    const int n = static_cast<int>(F - col < N ? F - col : N);
    for (int k = 0; k < n; ++k) {
      const float x = hipk::load_as_float(g, gi + k);
      hipk::store_from_float(h, hi + k, x * sigmoid(x) * hipk::load_as_float(u, gi + k));
    }
  }
}

template <typename T>
__device__ void swiglu_fwd_impl(const T* g, const T* u, T* h, int64_t rows, int64_t F,
                                int64_t in_stride, int vec) {
  constexpr int N = hipk::VecWidth<T>::value;
  const int64_t col = pack_col<N>();
  if (col >= F) return;
  if (vec) {
    if constexpr (N == 4) {
      HIPK_HOT_LOOP_BEGIN("fwd_pack elems=4 min_t=3 kind=memory");
    } else {
      HIPK_HOT_LOOP_BEGIN("fwd_pack elems=8 min_t=3 kind=memory");
    }
#pragma unroll 1
    for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
      swiglu_fwd_pack<N>(g, u, h, row, col, F, in_stride, true);
    }
    HIPK_HOT_LOOP_END("fwd_pack");
  } else {
#pragma unroll 1
    for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
      swiglu_fwd_pack<N>(g, u, h, row, col, F, in_stride, false);
    }
  }
}

/// dg, du of one element from g, u, dh.
__device__ __forceinline__ void swiglu_grad(float g, float u, float dh, float& dg, float& du) {
  const float s = sigmoid(g);
  const float silu = g * s;
  du = dh * silu;
  dg = dh * u * s * (1.0f + g * (1.0f - s));
}

template <int N, typename T>
__device__ void swiglu_bwd_pack(const T* g, const T* u, const T* dh, T* dg, T* du, int64_t row,
                                int64_t col, int64_t F, int64_t in_stride, int64_t grad_stride,
                                bool vec) {
  const int64_t gi = row * in_stride + col;
  const int64_t di = row * grad_stride + col;
  const int64_t hi = row * F + col;
  if (vec) {
    float vg[N];
    float vu[N];
    float vd[N];
    load<N>(g, gi, true, vg);
    load<N>(u, gi, true, vu);
    load<N>(dh, hi, true, vd);
#pragma unroll
    for (int k = 0; k < N; ++k) swiglu_grad(vg[k], vu[k], vd[k], vg[k], vu[k]);
    store<N>(dg, di, true, vg);
    store<N>(du, di, true, vu);
  } else {
    const int n = static_cast<int>(F - col < N ? F - col : N);
    for (int k = 0; k < n; ++k) {
      float a;
      float b;
      swiglu_grad(hipk::load_as_float(g, gi + k), hipk::load_as_float(u, gi + k),
                  hipk::load_as_float(dh, hi + k), a, b);
      hipk::store_from_float(dg, di + k, a);
      hipk::store_from_float(du, di + k, b);
    }
  }
}

template <typename T>
__device__ void swiglu_bwd_impl(const T* g, const T* u, const T* dh, T* dg, T* du, int64_t rows,
                                int64_t F, int64_t in_stride, int64_t grad_stride, int vec) {
  constexpr int N = hipk::VecWidth<T>::value;
  const int64_t col = pack_col<N>();
  if (col >= F) return;
  if (vec) {
    if constexpr (N == 4) {
      HIPK_HOT_LOOP_BEGIN("bwd_pack elems=4 min_t=5 kind=memory");
    } else {
      HIPK_HOT_LOOP_BEGIN("bwd_pack elems=8 min_t=5 kind=memory");
    }
#pragma unroll 1
    for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
      swiglu_bwd_pack<N>(g, u, dh, dg, du, row, col, F, in_stride, grad_stride, true);
    }
    HIPK_HOT_LOOP_END("bwd_pack");
  } else {
#pragma unroll 1
    for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
      swiglu_bwd_pack<N>(g, u, dh, dg, du, row, col, F, in_stride, grad_stride, false);
    }
  }
}

}  // namespace

#define SWIGLU_KERNELS(suffix, T)                                                              \
  HIPK_KERNEL(swiglu_fwd_##suffix, kBlock)                                                     \
  (const T* g, const T* u, T* h, int64_t rows, int64_t F, int64_t in_stride, int vec) {        \
    swiglu_fwd_impl<T>(g, u, h, rows, F, in_stride, vec);                                      \
  }                                                                                            \
  HIPK_KERNEL(swiglu_bwd_##suffix, kBlock)                                                     \
  (const T* g, const T* u, const T* dh, T* dg, T* du, int64_t rows, int64_t F,                 \
   int64_t in_stride, int64_t grad_stride, int vec) {                                          \
    swiglu_bwd_impl<T>(g, u, dh, dg, du, rows, F, in_stride, grad_stride, vec);                \
  }

HIPK_DTYPES(SWIGLU_KERNELS)
