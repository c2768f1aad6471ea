// kernels/lora_gemm.hip — the skinny GEMMs of a LoRA adapter (rank r in 1..64): the products
// beside a target's big GEMM, where one dimension is r and a 128×128 tile would be mostly idle.
//
// NEVER RUN ON A GPU: compiled and statically checked for gfx906 only; executed on the CPU by
// hip-emu (the emulated HIP device) in the device tests, against the CPU reference.
//
// The small operand W (A [r, in] or B [out, r]) is addressed as W(c, j) = w[c·w_sc + j·w_sj]
// (c: the long dimension, j: the rank), so one kernel serves both layouts without a branch.
// Every kernel is instantiated per rank class RP (8, 16, 32, 64: the smallest RP ≥ r; ranks
// past r are read as zero, never loaded) and dtype. f32 accumulation, one rounding per output.
//
// The big operands (x, y, d) are row-major with a row stride of their own (ldx, ldy, ldd ≥ their
// width): a target's output block inside a wider stacked tensor (q/k/v, gate/up) is read and
// written in place through a pointer to its first column.
//
//   lora_down_r<RP>_<T>(x, w, out, rows, k, rank, w_sc, w_sj, alpha, ldx)
//     out[n, j] = alpha · Σ_c x[n·ldx + c]·W(c, j)         (u = x·Aᵀ; du = s·dy·B)
//     Block: 256 threads = 256 rows, one row per thread, acc[RP] in registers. Per K step of
//     kKc = 16 columns the block stages x [256, 16] (coalesced: 16 lanes per row segment) and
//     W [16, RP] into LDS (f32); each thread then reads its row of the x tile and the W tile
//     (a broadcast: every lane reads the same address). x is read once; W once per block.
//   lora_up_r<RP>_<T>(u, w, y, rows, cols, rank, w_sc, w_sj, alpha, beta, rows_per_block, ldy)
//     y[n·ldy + c] = beta·y[..] + alpha · Σ_j u[n, j]·W(c, j)  (y += s·u·Bᵀ; dx += du·A; y is
//     not read when beta = 0)
//     Block: 256 threads = 256 columns, W(c, 0..RP) in registers, rows_per_block rows walked in
//     chunks of kRc = 16 rows whose u [16, RP] is staged into LDS (f32, broadcast reads).
//     y is read and written once; u once per column block; W once per block.
//   lora_gradw_r<RP>_<T>(job0, job1, rows, rank, rows_per_group)
//     G(c, j) (+)= alpha · Σ_n d[n·ldd + c]·u[n, j]         (dB += s·dyᵀ·u; dA += duᵀ·x)
//     Two independent jobs in one launch (blockIdx.z): the backward runs dB and dA together.
//     Block: 256 threads = 256 columns of d, acc[RP] per thread, rows [g·rpg, (g+1)·rpg) of
//     group g = blockIdx.y walked in chunks of 16 rows (u staged into LDS as in lora_up). With
//     one group G is written directly; with several each group writes its f32 partial
//     [groups, cols, rank] and lora_gradw_final adds them in group order: no atomics, the
//     result is bit-identical run to run for a given plan.
//   lora_gradw_final_<T>(job0, job1, groups, rank)
//     G(c, j) = (accumulate ? G(c, j) : 0) + alpha · Σ_g partial[g, c, j], thread per (c, j).
//
// Bytes (the hot loops' global bytes per element, `cargo xtask isa-report --only lora_gemm`,
// static, gfx906): down reads x once plus W [16, RP] per 256·16 x elements, i.e. (1 + RP/256)
// elements of T per x element; up moves y twice plus u [16, RP] per 256·16 y elements; gradw
// reads d once plus u. docs/PERFORMANCE.md ("LoRA's skinny GEMMs") turns them into the whole
// kernels' share of the bandwidth bound at N = C = 4096 with the outside-loop bytes of the plan.
//
// Resource usage on gfx906 (hipcc 5.2 / clang 15, -O3; f16, the other dtypes within a few
// VGPRs), from docs/isa-baseline.json; the rank kernels are bounded to 2 waves per SIMD
// (__launch_bounds__(256, 2)); B/elem = the hot loop's global bytes per element vs the minimum.
// The row strides (ldx, ldy, ldd) cost SGPRs (lora_down +26 to +28, the others 0 to +6) and 3
// VGPRs at lora_down_r8; the hot loops' bytes and the occupancy are unchanged:
//   kernel              VGPRs  SGPRs  LDS B  waves/SIMD  scratch  B/elem (min)
//   lora_down_r8          31     92  17920       3         0     2.125 (2)
//   lora_down_r64         98     96  21504       2         0     2.5   (2)
//   lora_up_r8            31     30    512       8         0     4.125 (4)
//   lora_up_r64           97     38   4096       2         0     4.5   (4)
//   lora_gradw_r8         41     66    512       5         0     2.125 (2)
//   lora_gradw_r64       111     60   4096       2         0     2.5   (2)
//   lora_gradw_final      15     34      0      10         0       -
#include "common.h"

namespace {

constexpr int kBlock = 256;
/// Columns of x per K step of lora_down.
constexpr int kKc = 16;
/// Rows per LDS chunk of lora_up / lora_gradw.
constexpr int kRc = 16;

/// One product of lora_gradw: G(c, j) = g[c·g_sc + j·g_sj], d [rows, cols] (row stride ldd),
/// u [rows, rank].
struct GradwJob {
  const void* d;
  const void* u;
  void* g;
  float* partial;  // [groups, cols, rank] f32, or null (one group: G is written directly)
  int64_t g_sc;
  int64_t g_sj;
  int64_t cols;
  int64_t ldd;
  float alpha;
  int accumulate;
};

template <int RP, typename T>
__device__ void down_impl(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ out,
                          int64_t rows, int k, int rank, int64_t w_sc, int64_t w_sj,
                          float alpha, int64_t ldx) {
  __shared__ float xs[kBlock][kKc + 1];
  __shared__ float ws[kKc][RP];
  const int t = static_cast<int>(threadIdx.x);
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kBlock;
  float acc[RP];
#pragma unroll
  for (int j = 0; j < RP; ++j) acc[j] = 0.0f;
  if constexpr (RP == 8) HIPK_HOT_LOOP_BEGIN("down_k elems=16 min_t=1 kind=memory inner_trip=16");
  if constexpr (RP == 16) HIPK_HOT_LOOP_BEGIN("down_k elems=16 min_t=1 kind=memory inner_trip=16");
  if constexpr (RP == 32) HIPK_HOT_LOOP_BEGIN("down_k elems=16 min_t=1 kind=memory inner_trip=16");
  if constexpr (RP == 64) HIPK_HOT_LOOP_BEGIN("down_k elems=16 min_t=1 kind=memory inner_trip=16");
  for (int c0 = 0; c0 < k; c0 += kKc) {
    // x [256, 16]: element t + 256·i is row t / 16 + 16·i, column t % 16 (a row segment per
    // 16 lanes, consecutive columns in consecutive lanes).
    {
      const int c = t % kKc;
      const bool col_ok = c0 + c < k;
      const T* xp = x + (row0 + t / kKc) * ldx + c0 + c;
#pragma unroll
      for (int i = 0; i < kBlock / kKc; ++i) {
        const int r = t / kKc + (kBlock / kKc) * i;
        xs[r][c] = (col_ok && row0 + r < rows) ? hipk::load_as_float(xp, static_cast<int64_t>(kBlock / kKc) * i * ldx) : 0.0f;
      }
    }
    // W [16, RP]: element e = t + 256·i is column e / RP, rank e % RP.
#pragma unroll
    for (int i = 0; i < (kKc * RP + kBlock - 1) / kBlock; ++i) {
      const int e = t + kBlock * i;
      if (e < kKc * RP) {
        const int c = e / RP;
        const int j = e % RP;
        ws[c][j] = (j < rank && c0 + c < k)
                       ? hipk::load_as_float(w, static_cast<int64_t>(c0 + c) * w_sc + j * w_sj)
                       : 0.0f;
      }
    }
    __syncthreads();
#pragma unroll 1
    for (int c = 0; c < kKc; ++c) {
      const float xv = xs[t][c];
#pragma unroll
      for (int j = 0; j < RP; ++j) acc[j] += xv * ws[c][j];
    }
    __syncthreads();
  }
  HIPK_HOT_LOOP_END("down_k");
  const int64_t row = row0 + t;
  if (row >= rows) return;
#pragma unroll
  for (int j = 0; j < RP; ++j) {
    if (j < rank) hipk::store_from_float(out, row * rank + j, alpha * acc[j]);
  }
}

/// `z` (0), through an empty asm statement that also reads `after`: LDS reads indexed with the
/// result wait for `after` (the compiler cannot hoist them above its computation), and stay LDS
/// reads (an opaque pointer would turn them into flat loads).
__device__ __forceinline__ int opaque_zero_after(int z, float after) {
#if defined(__HIP_DEVICE_COMPILE__)
  asm volatile("" : "+v"(z) : "v"(after));
#else
  (void)after;
#endif
  return z;
}

/// u rows [n0, n0 + kRc) into us (f32, zero past `rows` and `rank`); every thread takes part.
template <int RP, typename T>
__device__ __forceinline__ void stage_u(const T* __restrict__ u, int64_t n0, int64_t rows,
                                        int rank, float (&us)[kRc][RP]) {
  const int t = static_cast<int>(threadIdx.x);
#pragma unroll
  for (int i = 0; i < (kRc * RP + kBlock - 1) / kBlock; ++i) {
    const int e = t + kBlock * i;
    if (e < kRc * RP) {
      const int r = e / RP;
      const int j = e % RP;
      const int64_t n = n0 + r;
      us[r][j] = (n < rows && j < rank) ? hipk::load_as_float(u, n * rank + j) : 0.0f;
    }
  }
}

template <int RP, typename T>
__device__ void up_impl(const T* __restrict__ u, const T* __restrict__ w, T* __restrict__ y,
                        int64_t rows, int cols, int rank, int64_t w_sc, int64_t w_sj,
                        float alpha, float beta, int64_t rows_per_block, int64_t ldy) {
  __shared__ float us[kRc][RP];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  const bool live = c < cols;
  // W(c, 0..RP): branch-free loads of valid addresses (the last column and rank stand in for
  // those past the end), then zeroed past the rank: 64 branches around loads spill at RP = 64.
  float wv[RP];
  const T* wp = w + (live ? c : cols - 1) * w_sc;
#pragma unroll
  for (int j = 0; j < RP; ++j) {
    wv[j] = j < rank ? hipk::load_as_float(wp, 0) : 0.0f;
    if (j + 1 < rank) wp += w_sj;
  }
  const int64_t first = static_cast<int64_t>(blockIdx.y) * rows_per_block;
  const int64_t last = first + rows_per_block < rows ? first + rows_per_block : rows;
  if constexpr (RP == 8) HIPK_HOT_LOOP_BEGIN("up_rows elems=16 min_t=2 kind=memory inner_trip=16");
  if constexpr (RP == 16) HIPK_HOT_LOOP_BEGIN("up_rows elems=16 min_t=2 kind=memory inner_trip=16");
  if constexpr (RP == 32) HIPK_HOT_LOOP_BEGIN("up_rows elems=16 min_t=2 kind=memory inner_trip=16");
  if constexpr (RP == 64) HIPK_HOT_LOOP_BEGIN("up_rows elems=16 min_t=2 kind=memory inner_trip=16");
  for (int64_t n0 = first; n0 < last; n0 += kRc) {
    stage_u<RP>(u, n0, rows, rank, us);
    __syncthreads();
    if (live) {
      const int nr = last - n0 < kRc ? static_cast<int>(last - n0) : kRc;
#pragma unroll 1
      for (int r = 0; r < nr; ++r) {
        float s = 0.0f;
        int z = 0;
#pragma unroll
        for (int j = 0; j < RP; ++j) {
          s += us[r][j + z] * wv[j];
          // At most 16 LDS values in flight beside the RP of W (RP = 64 spills otherwise): the
          // next 16 reads take their index from an opaque zero that depends on s.
          if (j % 16 == 15) z = opaque_zero_after(z, s);
        }
        const int64_t i = (n0 + r) * ldy + c;
        const float old = beta != 0.0f ? beta * hipk::load_as_float(y, i) : 0.0f;
        hipk::store_from_float(y, i, old + alpha * s);
      }
    }
    __syncthreads();
  }
  HIPK_HOT_LOOP_END("up_rows");
}

template <int RP, typename T>
__device__ void gradw_impl(const GradwJob& job, int64_t rows, int rank, int64_t rows_per_group) {
  __shared__ float us[kRc][RP];
  const T* __restrict__ d = static_cast<const T*>(job.d);
  const T* __restrict__ u = static_cast<const T*>(job.u);
  const int64_t cols = job.cols;
  // Whole blocks past this job's columns leave before any barrier (the other job may be wider).
  if (static_cast<int64_t>(blockIdx.x) * kBlock >= cols) return;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  const bool live = c < cols;
  float acc[RP];
#pragma unroll
  for (int j = 0; j < RP; ++j) acc[j] = 0.0f;
  const int64_t first = static_cast<int64_t>(blockIdx.y) * rows_per_group;
  const int64_t last = first + rows_per_group < rows ? first + rows_per_group : rows;
  if constexpr (RP == 8) HIPK_HOT_LOOP_BEGIN("gradw_rows elems=16 min_t=1 kind=memory inner_trip=16");
  if constexpr (RP == 16) HIPK_HOT_LOOP_BEGIN("gradw_rows elems=16 min_t=1 kind=memory inner_trip=16");
  if constexpr (RP == 32) HIPK_HOT_LOOP_BEGIN("gradw_rows elems=16 min_t=1 kind=memory inner_trip=16");
  if constexpr (RP == 64) HIPK_HOT_LOOP_BEGIN("gradw_rows elems=16 min_t=1 kind=memory inner_trip=16");
  for (int64_t n0 = first; n0 < last; n0 += kRc) {
    stage_u<RP>(u, n0, rows, rank, us);
    __syncthreads();
    if (live) {
      const int nr = last - n0 < kRc ? static_cast<int>(last - n0) : kRc;
#pragma unroll 1
      for (int r = 0; r < nr; ++r) {
        const float dv = hipk::load_as_float(d, (n0 + r) * job.ldd + c);
#pragma unroll
        for (int j = 0; j < RP; ++j) acc[j] += dv * us[r][j];
      }
    }
    __syncthreads();
  }
  HIPK_HOT_LOOP_END("gradw_rows");
  if (!live) return;
  if (job.partial != nullptr) {
    float* p = job.partial + (static_cast<int64_t>(blockIdx.y) * cols + c) * rank;
#pragma unroll
    for (int j = 0; j < RP; ++j) {
      if (j < rank) p[j] = acc[j];
    }
    return;
  }
  T* g = static_cast<T*>(job.g);
#pragma unroll
  for (int j = 0; j < RP; ++j) {
    if (j < rank) {
      const int64_t i = c * job.g_sc + j * job.g_sj;
      const float old = job.accumulate != 0 ? hipk::load_as_float(g, i) : 0.0f;
      hipk::store_from_float(g, i, old + job.alpha * acc[j]);
    }
  }
}

template <typename T>
__device__ void gradw_final_impl(const GradwJob& job, int64_t groups, int rank) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  if (e >= job.cols * rank) return;
  const int64_t c = e / rank;
  const int j = static_cast<int>(e % rank);
  float s = 0.0f;
  for (int64_t g = 0; g < groups; ++g) s += job.partial[(g * job.cols + c) * rank + j];
  T* out = static_cast<T*>(job.g);
  const int64_t i = c * job.g_sc + j * job.g_sj;
  const float old = job.accumulate != 0 ? hipk::load_as_float(out, i) : 0.0f;
  hipk::store_from_float(out, i, old + job.alpha * s);
}

}  // namespace

/// The rank kernels: 256 threads, at least 2 waves per SIMD (VGPRs <= 128, LDS <= 32 KiB).
#define LORA_KERNEL(NAME) extern "C" __global__ void __launch_bounds__(kBlock, 2) NAME

#define LORA_RANK_KERNELS(suffix, T, RP)                                                      \
  LORA_KERNEL(lora_down_r##RP##_##suffix)                                                     \
  (const T* x, const T* w, T* out, int64_t rows, int k, int rank, int64_t w_sc, int64_t w_sj, \
   float alpha, int64_t ldx) {                                                                \
    down_impl<RP, T>(x, w, out, rows, k, rank, w_sc, w_sj, alpha, ldx);                       \
  }                                                                                           \
  LORA_KERNEL(lora_up_r##RP##_##suffix)                                                       \
  (const T* u, const T* w, T* y, int64_t rows, int cols, int rank, int64_t w_sc,              \
   int64_t w_sj, float alpha, float beta, int64_t rows_per_block, int64_t ldy) {              \
    up_impl<RP, T>(u, w, y, rows, cols, rank, w_sc, w_sj, alpha, beta, rows_per_block, ldy);  \
  }                                                                                           \
  LORA_KERNEL(lora_gradw_r##RP##_##suffix)                                                    \
  (GradwJob job0, GradwJob job1, int64_t rows, int rank, int64_t rows_per_group) {            \
    gradw_impl<RP, T>(blockIdx.z == 0 ? job0 : job1, rows, rank, rows_per_group);             \
  }

#define LORA_KERNELS(suffix, T)                                                               \
  LORA_RANK_KERNELS(suffix, T, 8)                                                             \
  LORA_RANK_KERNELS(suffix, T, 16)                                                            \
  LORA_RANK_KERNELS(suffix, T, 32)                                                            \
  LORA_RANK_KERNELS(suffix, T, 64)                                                            \
  HIPK_KERNEL(lora_gradw_final_##suffix, kBlock)                                              \
  (GradwJob job0, GradwJob job1, int64_t groups, int rank) {                                  \
    gradw_final_impl<T>(blockIdx.z == 0 ? job0 : job1, groups, rank);                         \
  }

HIPK_DTYPES(LORA_KERNELS)
