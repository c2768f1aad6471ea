// kernels/gelu.hip — elementwise ops of the training step: GELU (tanh approximation, PyTorch's
// approximate='tanh', GPT-2's gelu_new) forward and backward, and the residual add.
//
// NEVER RUN ON A GPU: compiled and statically checked for gfx906 only; executed on the CPU by
// hip-emu (the emulated HIP device) in the device tests, against the CPU reference.
//
//   gelu_fwd_<T>(x, out, n):        out = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))
//   gelu_bwd_<T>(x, dout, dx, n):   dx = dout·(0.5·(1 + tanh u) + 0.5·x·(1 − tanh² u)·√(2/π)·(1 + 3·0.044715·x²))
//   residual_add_<T>(a, b, out, n): out = a + b
// f32 math, one rounding per output. `out`/`dx` may alias an input (in place): each element is
// read before it is written by the same thread.
//
// Memory: each thread moves 16 bytes per tensor per step (4 f32 or 8 f16/bf16 elements: one
// global_load_dwordx4 when the pack is aligned and inside the tensor, scalar accesses for the
// tail and for misaligned views), grid-stride over the packs. Bytes moved = the op's tensors
// once each: 2n·sizeof(T) forward, 3n backward and add.
//
// Resource usage on gfx906 (hipcc 5.2 / clang 15, -O3), from the build's resource table
// (`cargo test --test kernels_static -- --nocapture` prints it):
//   kernel                    VGPRs  SGPRs  LDS B  waves/SIMD  scratch  spills
//   gelu_fwd_f32                 24     28      0          10        0       0
//   gelu_bwd_f32                 28     30      0           9        0       0
//   residual_add_f32             18     26      0          10        0       0
//   gelu_fwd_f16                 36     28      0           7        0       0
//   gelu_bwd_f16                 44     30      0           5        0       0
//   residual_add_f16             26     26      0           9        0       0
//   gelu_fwd_bf16                37     30      0           6        0       0
//   gelu_bwd_bf16                45     32      0           5        0       0
//   residual_add_bf16            29     28      0           8        0       0
#include "common.h"
#include "gelu.h"

namespace {

/// Threads per block the kernels are compiled for.
constexpr int kGeluBlock = 256;

/// Calls f(i) for the first element i of every pack of N elements this thread owns.
template <int N, typename F> __device__ __forceinline__ void for_packs(int64_t n, F f) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x * N;
  for (int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * N; i < n;
       i += stride) {
    f(i);
  }
}

template <typename T>
__device__ void gelu_fwd_impl(const T* x, T* out, int64_t n) {
  constexpr int N = hipk::VecWidth<T>::value;
  for_packs<N>(n, [&](int64_t i) {
    float v[N];
    hipk::load_floats<N>(x, i, n, v);
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = hipk::gelu_tanh(v[k]);
    hipk::store_floats<N>(out, i, n, v);
  });
}

template <typename T>
__device__ void gelu_bwd_impl(const T* x, const T* dout, T* dx, int64_t n) {
  constexpr int N = hipk::VecWidth<T>::value;
  for_packs<N>(n, [&](int64_t i) {
    float v[N], g[N];
    hipk::load_floats<N>(x, i, n, v);
    hipk::load_floats<N>(dout, i, n, g);
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = g[k] * hipk::gelu_tanh_grad(v[k]);
    hipk::store_floats<N>(dx, i, n, v);
  });
}

template <typename T>
__device__ void residual_add_impl(const T* a, const T* b, T* out, int64_t n) {
  constexpr int N = hipk::VecWidth<T>::value;
  for_packs<N>(n, [&](int64_t i) {
    float va[N], vb[N];
    hipk::load_floats<N>(a, i, n, va);
    hipk::load_floats<N>(b, i, n, vb);
#pragma unroll
    for (int k = 0; k < N; ++k) va[k] += vb[k];
    hipk::store_floats<N>(out, i, n, va);
  });
}

}  // namespace

#define GELU_KERNELS(suffix, T)                                                      \
  HIPK_KERNEL(gelu_fwd_##suffix, kGeluBlock)(const T* x, T* out, int64_t n) {            \
    gelu_fwd_impl<T>(x, out, n);                                                     \
  }                                                                                  \
  HIPK_KERNEL(gelu_bwd_##suffix, kGeluBlock)(const T* x, const T* dout, T* dx, int64_t n) { \
    gelu_bwd_impl<T>(x, dout, dx, n);                                                \
  }                                                                                  \
  HIPK_KERNEL(residual_add_##suffix, kGeluBlock)(const T* a, const T* b, T* out, int64_t n) { \
    residual_add_impl<T>(a, b, out, n);                                              \
  }

HIPK_DTYPES(GELU_KERNELS)
