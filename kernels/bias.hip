// kernels/bias.hip — the bias gradient (column sums of dout [rows, cols], deterministic). The
// bias epilogue of a matmul (+ optional GELU) is fused into the GEMM's store in
// kernels/matmul.hip (matmul_bias_* / matmul_small_bias_*).
//
// NEVER RUN ON A GPU: compiled and statically checked for gfx906 only; the device tests ran on
// hip-emu (the CPU-emulated device) against the CPU reference.
//
// Two stages, no atomics, so the result is bit-identical run to run for a given launch shape:
//   bias_bwd_partial_<T>(dout, partial, rows, cols, rows_per_group): block (x, y) sums the rows
//     [y·rows_per_group, min(rows, (y+1)·rows_per_group)) of its columns, in row order, in f32,
//     and writes partial[y][cols] (f32). Thread t of block x owns the N consecutive columns
//     (x·blockDim + t)·N .. +N−1 (N = 16 bytes of T: 4 f32 or 8 f16/bf16): each row is one
//     coalesced 16-byte access per thread when the pack is aligned, scalar otherwise.
//   bias_bwd_final_<T>(partial, groups, cols, dbias, accumulate): thread per column adds the
//     groups' partials in group order (plus the old dbias first when accumulate != 0) and writes
//     dbias rounded to T.
// The launcher picks groups so that the grid fills the device (rows_per_group = rows / groups).
// Bytes moved: dout once, plus groups·cols·4 twice (partials), plus dbias.
//
// Resource usage on gfx906 (hipcc 5.2 / clang 15, -O3), from the build's resource table
// (`cargo test --test kernels_static -- --nocapture` prints it):
//   kernel                    VGPRs  SGPRs  LDS B  waves/SIMD  scratch  spills
//   bias_bwd_partial_f32         17     30      0          10        0       0
//   bias_bwd_final_f32            8     14      0          10        0       0
//   bias_bwd_partial_f16         25     46      0           9        0       0
//   bias_bwd_final_f16            8     14      0          10        0       0
//   bias_bwd_partial_bf16        25     46      0           9        0       0
//   bias_bwd_final_bf16           8     14      0          10        0       0
#include "common.h"

namespace {

constexpr int kBiasBlock = 256;

template <typename T>
__device__ void bias_partial_impl(const T* __restrict__ dout, float* __restrict__ partial,
                                  int64_t rows, int cols, int64_t rows_per_group) {
  constexpr int N = hipk::VecWidth<T>::value;
  const int c = (static_cast<int>(blockIdx.x) * static_cast<int>(blockDim.x) +
                 static_cast<int>(threadIdx.x)) * N;
  if (c >= cols) return;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_group;
  const int64_t r1 = r0 + rows_per_group < rows ? r0 + rows_per_group : rows;
  float acc[N];
#pragma unroll
  for (int k = 0; k < N; ++k) acc[k] = 0.0f;
  for (int64_t r = r0; r < r1; ++r) {
    float v[N];
    hipk::load_floats<N>(dout + r * cols, c, cols, v);
#pragma unroll
    for (int k = 0; k < N; ++k) acc[k] += v[k];
  }
  hipk::store_floats<N>(partial + static_cast<int64_t>(blockIdx.y) * cols, c, cols, acc);
}

template <typename T>
__device__ void bias_final_impl(const float* __restrict__ partial, int64_t groups, int cols,
                                T* __restrict__ dbias, int accumulate) {
  const int j = static_cast<int>(blockIdx.x) * static_cast<int>(blockDim.x) +
                static_cast<int>(threadIdx.x);
  if (j >= cols) return;
  float s = accumulate != 0 ? hipk::load_as_float(dbias, j) : 0.0f;
  float sum = 0.0f;
  for (int64_t g = 0; g < groups; ++g) sum += partial[g * cols + j];
  hipk::store_from_float(dbias, j, s + sum);
}

}  // namespace

#define BIAS_KERNELS(suffix, T)                                                               \
  HIPK_KERNEL(bias_bwd_partial_##suffix, kBiasBlock)                                              \
  (const T* dout, float* partial, int64_t rows, int cols, int64_t rows_per_group) {           \
    bias_partial_impl<T>(dout, partial, rows, cols, rows_per_group);                          \
  }                                                                                           \
  HIPK_KERNEL(bias_bwd_final_##suffix, kBiasBlock)                                                \
  (const float* partial, int64_t groups, int cols, T* dbias, int accumulate) {                \
    bias_final_impl<T>(partial, groups, cols, dbias, accumulate);                             \
  }

HIPK_DTYPES(BIAS_KERNELS)
