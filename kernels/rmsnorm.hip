// kernels/rmsnorm.hip — RMS norm forward (plain and fused with the residual add) and backward
// over the last dimension (LLaMA's RMSNorm, torch.nn.functional.rms_norm).
//
// NEVER RUN ON A GPU: compiled and statically checked for gfx906 only; the device tests ran on
// hip-emu (the CPU-emulated device) against the CPU reference.
//
// Layout: x, y, dy, dx, a, b, residual are [rows, C] row-major in T (f32, f16, bf16); weight and
// dweight are [C] in T; rstd is [rows] f32. All math is f32:
//   rstd = 1/√(Σx²/C + eps),   y = x·rstd·w,
//   dx (+)= rstd·(dy·w − x̂·mean(dy·w·x̂)) with x̂ = x·rstd,   dweight (+)= Σ_rows dy·x̂.
//
// Row groups, slots and layouts are those of kernels/layernorm.hip: a row is handled by one wave
// (`row_per_wave` != 0, several rows per block, no barriers) or by the whole block (reductions
// through LDS); groups walk rows grid-stride. Thread t of a group of G threads owns slots
// k = 0, 1, ...: in the vector layout (C % 4 == 0 and every tensor aligned to 4 elements, tested
// once per launch) slot k is the 4 elements (k·G + t)·4 .. +3, one 16-byte (f32) or 8-byte
// (f16/bf16) access; otherwise (odd C, misaligned views) slot k is the single element k·G + t.
//
// Forward: rows of at most 4 slots per thread (C ≤ 16·G: 1024 per wave64, 16384 per block of
// 1024) are cached: the row stays in registers between the sum of squares and the output, and
// the thread's slots of the weight stay in registers across all the group's rows, so x is read
// once and y written once (2·sizeof(T) per element, the minimum). Longer rows and the scalar
// layout stream (x read twice, the weight once per row).
// Residual forward (rmsnorm_fwd_residual_<T>: a, b, weight, residual, y, rstd, ...): x = a + b
// in f32, rounded once to T and stored to `residual`; the norm uses that rounded x (the CPU
// reference's semantics). Cached rows read a, b once and write residual, y once (4·sizeof(T)).
// Backward, stage 1 (rmsnorm_bwd_<T>): rows of at most 2 slots per thread (C ≤ 8·G: 512 per
// wave64, 8192 per block) are cached: x and dy read once, dx written once, the weight's and the
// dweight column sums' slots in registers across the group's rows; each group writes its column
// sums to partial[group] = [C] f32. Other rows stream (x, dy re-read, the sums in the group's
// partial row, read-modify-write per row).
// Stage 2 (rmsnorm_bwd_dw_<T>): dweight[j] = Σ_group partial[group][j] in group order.
// Accumulate (the last argument of stage 1 and 2, non-zero: `RmsNormBackward::accumulate`): dx and
// dweight are read and the new gradient added in f32 before the one rounding to T; otherwise they
// are overwritten and never read. No float atomics: bit-identical run to run for a fixed launch.
//
// Static ISA figures (gfx906, hipcc 5.2; not measurements): `cargo xtask isa-report --only
// rmsnorm` (docs/ISA-REPORT.md). Global bytes per element of the cached loops, f32 (minimum):
// forward 8.25 (8), residual forward 16.25 (16), backward 12.02 (12), accumulating backward
// 16.02 (16); f16/bf16 half of that. 53–61 VGPRs, 0 scratch, 0 spills, 4 waves/SIMD at 1024.
#include "common.h"

namespace {

/// Elements per slot in the vector layout.
constexpr int V = 4;
/// Slots per thread kept in registers for a cached forward / backward row.
constexpr int kFwdSlots = 4;
constexpr int kBwdSlots = 2;
/// Threads per block the row kernels are compiled for.
constexpr int kMaxBlock = 1024;

/// One row group's geometry (see kernels/layernorm.hip).
struct Group {
  int lane;
  int size;
  int64_t id;
  int64_t count;
  bool wave;
};

__device__ __forceinline__ Group row_group(int row_per_wave) {
  Group g;
  const int tid = static_cast<int>(threadIdx.x);
  if (row_per_wave) {
    const int per_block = static_cast<int>(blockDim.x) / warpSize;
    g.lane = tid % warpSize;
    g.size = warpSize;
    // readfirstlane: the row index and the row loop are scalar (no shuffle under a partial
    // exec mask).
    g.id = static_cast<int64_t>(blockIdx.x) * per_block +
           __builtin_amdgcn_readfirstlane(tid / warpSize);
    g.count = static_cast<int64_t>(gridDim.x) * per_block;
    g.wave = true;
  } else {
    g.lane = tid;
    g.size = static_cast<int>(blockDim.x);
    g.id = blockIdx.x;
    g.count = gridDim.x;
    g.wave = false;
  }
  return g;
}

__device__ __forceinline__ float group_sum(const Group& g, float v, float* lds) {
  return g.wave ? hipk::wave_sum(v) : hipk::block_sum(v, lds);
}

template <bool kVec> constexpr int slot_width() { return kVec ? V : 1; }

template <bool kVec>
__device__ __forceinline__ int slot_elem(const Group& g, int k, int e) {
  return (k * g.size + g.lane) * slot_width<kVec>() + e;
}

template <bool kVec>
__device__ __forceinline__ int slot_count(const Group& g, int C) {
  const int per_slot_row = g.size * slot_width<kVec>();
  return (C + per_slot_row - 1) / per_slot_row;
}

/// Load slot k of row p; a slot past C reads as 0.
template <bool kVec, typename T>
__device__ __forceinline__ void load_slot(const T* p, const Group& g, int k, int C,
                                          float (&out)[slot_width<kVec>()]) {
  const int j = slot_elem<kVec>(g, k, 0);
  if (j < C) {
    if constexpr (kVec) {
      hipk::load_vec<V>(p + j, out);
    } else {
      out[0] = hipk::load_as_float(p, j);
    }
  } else {
#pragma unroll
    for (int e = 0; e < slot_width<kVec>(); ++e) out[e] = 0.0f;
  }
}

/// Store slot k of row p (a slot past C is not written).
template <bool kVec, typename T>
__device__ __forceinline__ void store_slot(T* p, const Group& g, int k, int C,
                                           const float (&in)[slot_width<kVec>()]) {
  const int j = slot_elem<kVec>(g, k, 0);
  if (j < C) {
    if constexpr (kVec) {
      hipk::store_vec<V>(p + j, in);
    } else {
      hipk::store_from_float(p, j, in[0]);
    }
  }
}

/// in += slot k of row p (the accumulating backward's old dx).
template <bool kVec, typename T>
__device__ __forceinline__ void add_slot(const T* p, const Group& g, int k, int C,
                                         float (&in)[slot_width<kVec>()]) {
  float old[slot_width<kVec>()];
  load_slot<kVec>(p, g, k, C, old);
#pragma unroll
  for (int e = 0; e < slot_width<kVec>(); ++e) in[e] += old[e];
}

/// Whole slots and every pointer aligned to a slot.
template <typename T>
__device__ __forceinline__ bool vec_ok(int C, const void* a, const void* b, const void* c,
                                       const void* d) {
  constexpr uintptr_t kBytes = V * sizeof(T);
  return C % V == 0 && hipk::is_aligned(a, kBytes) && hipk::is_aligned(b, kBytes) &&
         hipk::is_aligned(c, kBytes) && hipk::is_aligned(d, kBytes);
}

// ---------------------------------------------------------------------------------------------
// Forward
// ---------------------------------------------------------------------------------------------

/// The x of rmsnorm_fwd_<T>: a stored tensor.
template <typename T> struct StoredX {
  static constexpr bool kResidual = false;
  const T* __restrict__ x;

  template <bool kVec>
  __device__ __forceinline__ void first(int64_t row, const Group& g, int k, int C,
                                        float (&out)[slot_width<kVec>()]) const {
    load_slot<kVec>(x + row * C, g, k, C, out);
  }
  template <bool kVec>
  __device__ __forceinline__ void again(int64_t row, const Group& g, int k, int C,
                                        float (&out)[slot_width<kVec>()]) const {
    load_slot<kVec>(x + row * C, g, k, C, out);
  }
};

/// The x of rmsnorm_fwd_residual_<T>: a + b rounded once to T, stored to `res` on the first
/// read; later reads of a slot re-read `res` (written by the same thread earlier).
template <typename T> struct ResidualX {
  static constexpr bool kResidual = true;
  const T* __restrict__ a;
  const T* __restrict__ b;
  T* __restrict__ res;

  template <bool kVec>
  __device__ __forceinline__ void first(int64_t row, const Group& g, int k, int C,
                                        float (&out)[slot_width<kVec>()]) const {
    float vb[slot_width<kVec>()];
    load_slot<kVec>(a + row * C, g, k, C, out);
    load_slot<kVec>(b + row * C, g, k, C, vb);
#pragma unroll
    for (int e = 0; e < slot_width<kVec>(); ++e) {
      out[e] = hipk::to_float(hipk::from_float<T>(out[e] + vb[e]));
    }
    store_slot<kVec>(res + row * C, g, k, C, out);
  }
  template <bool kVec>
  __device__ __forceinline__ void again(int64_t row, const Group& g, int k, int C,
                                        float (&out)[slot_width<kVec>()]) const {
    load_slot<kVec>(res + row * C, g, k, C, out);
  }
};

/// Forward for rows of at most kFwdSlots slots per thread, vector layout: the row and the
/// thread's weight slots stay in registers.
template <typename T, typename Src>
__device__ void rmsnorm_fwd_cached(const Src src, const T* __restrict__ weight,
                                   T* __restrict__ y, float* __restrict__ rstd_out, int64_t rows,
                                   int C, float eps, const Group& g, float* lds) {
  constexpr int K = kFwdSlots;
  const float inv_c = 1.0f / static_cast<float>(C);
  float w[K][V];
#pragma unroll
  for (int k = 0; k < K; ++k) load_slot<true>(weight, g, k, C, w[k]);
  if constexpr (Src::kResidual) {
    HIPK_HOT_LOOP_BEGIN("fwd_res_row elems=16 group=res_row min_t=4 kind=memory");
  } else {
    HIPK_HOT_LOOP_BEGIN("fwd_row elems=16 group=row min_t=2 kind=memory");
  }
#pragma unroll 1
  for (int64_t row = g.id; row < rows; row += g.count) {
    float v[K][V];
    float q = 0.0f;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      src.template first<true>(row, g, k, C, v[k]);  // 0 past C: adds nothing
#pragma unroll
      for (int e = 0; e < V; ++e) q += v[k][e] * v[k][e];
    }
    const float rstd = 1.0f / sqrtf(group_sum(g, q, lds) * inv_c + eps);
    if (g.lane == 0) rstd_out[row] = rstd;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      float out[V];
#pragma unroll
      for (int e = 0; e < V; ++e) out[e] = v[k][e] * rstd * w[k][e];
      store_slot<true>(y + row * C, g, k, C, out);
    }
  }
  if constexpr (Src::kResidual) {
    HIPK_HOT_LOOP_END("fwd_res_row");
  } else {
    HIPK_HOT_LOOP_END("fwd_row");
  }
}

/// Forward for any row length and layout: x read twice (sum of squares, output).
template <bool kVec, typename T, typename Src>
__device__ void rmsnorm_fwd_stream(const Src src, const T* __restrict__ weight,
                                   T* __restrict__ y, float* __restrict__ rstd_out, int64_t rows,
                                   int C, float eps, const Group& g, float* lds) {
  const float inv_c = 1.0f / static_cast<float>(C);
  const int slots = slot_count<kVec>(g, C);
  constexpr int W = slot_width<kVec>();
#pragma unroll 1
  for (int64_t row = g.id; row < rows; row += g.count) {
    float q = 0.0f;
#pragma unroll 1
    for (int k = 0; k < slots; ++k) {
      float t[W];
      src.template first<kVec>(row, g, k, C, t);
#pragma unroll
      for (int e = 0; e < W; ++e) q += t[e] * t[e];
    }
    const float rstd = 1.0f / sqrtf(group_sum(g, q, lds) * inv_c + eps);
    if (g.lane == 0) rstd_out[row] = rstd;
#pragma unroll 1
    for (int k = 0; k < slots; ++k) {
      float t[W];
      float w[W];
      src.template again<kVec>(row, g, k, C, t);
      load_slot<kVec>(weight, g, k, C, w);
#pragma unroll
      for (int e = 0; e < W; ++e) t[e] = t[e] * rstd * w[e];
      store_slot<kVec>(y + row * C, g, k, C, t);
    }
  }
}

template <typename T, typename Src>
__device__ void rmsnorm_fwd_dispatch(const Src src, bool vec, const T* weight, T* y, float* rstd,
                                     int64_t rows, int C, float eps, int row_per_wave) {
  __shared__ float lds[hipk::kMaxWavesPerBlock];
  const Group g = row_group(row_per_wave);
  if (!vec) {
    rmsnorm_fwd_stream<false>(src, weight, y, rstd, rows, C, eps, g, lds);
  } else if (slot_count<true>(g, C) <= kFwdSlots) {
    rmsnorm_fwd_cached(src, weight, y, rstd, rows, C, eps, g, lds);
  } else {
    rmsnorm_fwd_stream<true>(src, weight, y, rstd, rows, C, eps, g, lds);
  }
}

template <typename T>
__device__ void rmsnorm_fwd_impl(const T* x, const T* weight, T* y, float* rstd, int64_t rows,
                                 int C, float eps, int row_per_wave) {
  const bool vec = vec_ok<T>(C, x, weight, y, y);
  rmsnorm_fwd_dispatch(StoredX<T>{x}, vec, weight, y, rstd, rows, C, eps, row_per_wave);
}

template <typename T>
__device__ void rmsnorm_fwd_residual_impl(const T* a, const T* b, const T* weight, T* residual,
                                          T* y, float* rstd, int64_t rows, int C, float eps,
                                          int row_per_wave) {
  const bool vec = vec_ok<T>(C, a, b, residual, y) && vec_ok<T>(C, weight, y, y, y);
  rmsnorm_fwd_dispatch(ResidualX<T>{a, b, residual}, vec, weight, y, rstd, rows, C, eps,
                       row_per_wave);
}

// ---------------------------------------------------------------------------------------------
// Backward
// ---------------------------------------------------------------------------------------------

/// Stage 1 for rows of at most kBwdSlots slots per thread, vector layout: x, dy of a row, the
/// thread's weight slots and its dweight column sums stay in registers. kAcc (accumulate) is a
/// template parameter so that the overwriting loop has no read of dx at all.
template <bool kAcc, typename T>
__device__ void rmsnorm_bwd_cached(const T* __restrict__ x, const T* __restrict__ weight,
                                   const T* __restrict__ dy, const float* __restrict__ rstd_in,
                                   T* __restrict__ dx, float* __restrict__ pdw, int64_t rows,
                                   int C, const Group& g, float* lds) {
  constexpr int K = kBwdSlots;
  const float inv_c = 1.0f / static_cast<float>(C);
  float w[K][V];
  float acc_dw[K][V];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    load_slot<true>(weight, g, k, C, w[k]);
#pragma unroll
    for (int e = 0; e < V; ++e) acc_dw[k][e] = 0.0f;
  }
  if constexpr (kAcc) {
    HIPK_HOT_LOOP_BEGIN("bwd_row_acc elems=8 group=row_acc min_t=4 kind=memory");
  } else {
    HIPK_HOT_LOOP_BEGIN("bwd_row elems=8 group=row min_t=3 kind=memory");
  }
#pragma unroll 1
  for (int64_t row = g.id; row < rows; row += g.count) {
    const float rstd = hipk::load_uniform(rstd_in, row);
    float xh[K][V];
    float dyv[K][V];
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      load_slot<true>(x + row * C, g, k, C, xh[k]);
      load_slot<true>(dy + row * C, g, k, C, dyv[k]);
    }
#pragma unroll
    for (int k = 0; k < K; ++k) {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        xh[k][e] *= rstd;  // dy is 0 past C: tails add nothing
        s += dyv[k][e] * w[k][e] * xh[k][e];
        acc_dw[k][e] += dyv[k][e] * xh[k][e];
      }
    }
    const float m = group_sum(g, s, lds) * inv_c;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      float out[V];
#pragma unroll
      for (int e = 0; e < V; ++e) out[e] = rstd * (dyv[k][e] * w[k][e] - xh[k][e] * m);
      if constexpr (kAcc) add_slot<true>(dx + row * C, g, k, C, out);
      store_slot<true>(dx + row * C, g, k, C, out);
    }
  }
  if constexpr (kAcc) {
    HIPK_HOT_LOOP_END("bwd_row_acc");
  } else {
    HIPK_HOT_LOOP_END("bwd_row");
  }
#pragma unroll
  for (int k = 0; k < K; ++k) store_slot<true>(pdw, g, k, C, acc_dw[k]);
}

/// Stage 1 for any row length and layout: x, dy and weight re-read; the column sums live in
/// the group's partial row (each element touched only by its owner thread, rows in order).
template <bool kVec, typename T>
__device__ void rmsnorm_bwd_stream(const T* __restrict__ x, const T* __restrict__ weight,
                                   const T* __restrict__ dy, const float* __restrict__ rstd_in,
                                   T* __restrict__ dx, float* __restrict__ pdw, int64_t rows,
                                   int C, bool accumulate, const Group& g, float* lds) {
  const float inv_c = 1.0f / static_cast<float>(C);
  const int slots = slot_count<kVec>(g, C);
  constexpr int W = slot_width<kVec>();
#pragma unroll 1
  for (int k = 0; k < slots; ++k) {
    const float zero[W] = {};
    store_slot<kVec>(pdw, g, k, C, zero);
  }
#pragma unroll 1
  for (int64_t row = g.id; row < rows; row += g.count) {
    const float rstd = rstd_in[row];
    const T* xr = x + row * C;
    const T* dyr = dy + row * C;
    float s = 0.0f;
#pragma unroll 1
    for (int k = 0; k < slots; ++k) {
      float xv[W];
      float dyv[W];
      float w[W];
      float adw[W];
      load_slot<kVec>(xr, g, k, C, xv);
      load_slot<kVec>(dyr, g, k, C, dyv);
      load_slot<kVec>(weight, g, k, C, w);
      load_slot<kVec>(pdw, g, k, C, adw);
#pragma unroll
      for (int e = 0; e < W; ++e) {
        const float xh = xv[e] * rstd;
        s += dyv[e] * w[e] * xh;
        adw[e] += dyv[e] * xh;
      }
      store_slot<kVec>(pdw, g, k, C, adw);
    }
    const float m = group_sum(g, s, lds) * inv_c;
#pragma unroll 1
    for (int k = 0; k < slots; ++k) {
      float xv[W];
      float dyv[W];
      float w[W];
      float out[W];
      load_slot<kVec>(xr, g, k, C, xv);
      load_slot<kVec>(dyr, g, k, C, dyv);
      load_slot<kVec>(weight, g, k, C, w);
#pragma unroll
      for (int e = 0; e < W; ++e) out[e] = rstd * (dyv[e] * w[e] - xv[e] * rstd * m);
      if (accumulate) add_slot<kVec>(dx + row * C, g, k, C, out);
      store_slot<kVec>(dx + row * C, g, k, C, out);
    }
  }
}

template <typename T>
__device__ void rmsnorm_bwd_impl(const T* x, const T* weight, const T* dy, const float* rstd,
                                 T* dx, float* partial, int64_t rows, int C, int row_per_wave,
                                 bool accumulate) {
  __shared__ float lds[hipk::kMaxWavesPerBlock];
  const Group g = row_group(row_per_wave);
  float* pdw = partial + g.id * C;  // this group's dweight partial row
  if (!vec_ok<T>(C, x, weight, dy, dx) || !hipk::is_aligned(partial, V * sizeof(float))) {
    rmsnorm_bwd_stream<false>(x, weight, dy, rstd, dx, pdw, rows, C, accumulate, g, lds);
  } else if (slot_count<true>(g, C) <= kBwdSlots) {
    if (accumulate) {
      rmsnorm_bwd_cached<true>(x, weight, dy, rstd, dx, pdw, rows, C, g, lds);
    } else {
      rmsnorm_bwd_cached<false>(x, weight, dy, rstd, dx, pdw, rows, C, g, lds);
    }
  } else {
    rmsnorm_bwd_stream<true>(x, weight, dy, rstd, dx, pdw, rows, C, accumulate, g, lds);
  }
}

/// Stage 2: dweight[j] (+)= Σ_g partial[g][j], g in order (one rounding).
template <typename T>
__device__ void rmsnorm_bwd_dw_impl(const float* __restrict__ partial, int64_t groups, int C,
                                    T* __restrict__ dweight, bool accumulate) {
  const int j = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (j >= C) return;
  float dw = 0.0f;
  for (int64_t gi = 0; gi < groups; ++gi) dw += partial[gi * C + j];
  if (accumulate) dw += hipk::load_as_float(dweight, j);
  hipk::store_from_float(dweight, j, dw);
}

}  // namespace

#define RMSNORM_KERNELS(suffix, T)                                                            \
  HIPK_KERNEL(rmsnorm_fwd_##suffix, kMaxBlock)                                                \
  (const T* x, const T* weight, T* y, float* rstd, int64_t rows, int C, float eps,            \
   int row_per_wave) {                                                                        \
    rmsnorm_fwd_impl<T>(x, weight, y, rstd, rows, C, eps, row_per_wave);                      \
  }                                                                                           \
  HIPK_KERNEL(rmsnorm_fwd_residual_##suffix, kMaxBlock)                                       \
  (const T* a, const T* b, const T* weight, T* residual, T* y, float* rstd, int64_t rows,     \
   int C, float eps, int row_per_wave) {                                                      \
    rmsnorm_fwd_residual_impl<T>(a, b, weight, residual, y, rstd, rows, C, eps, row_per_wave); \
  }                                                                                           \
  HIPK_KERNEL(rmsnorm_bwd_##suffix, kMaxBlock)                                                \
  (const T* x, const T* weight, const T* dy, const float* rstd, T* dx, float* partial,        \
   int64_t rows, int C, int row_per_wave, int accumulate) {                                   \
    rmsnorm_bwd_impl<T>(x, weight, dy, rstd, dx, partial, rows, C, row_per_wave,              \
                        accumulate != 0);                                                     \
  }                                                                                           \
  HIPK_KERNEL(rmsnorm_bwd_dw_##suffix, 256)                                                   \
  (const float* partial, int64_t groups, int C, T* dweight, int accumulate) {                 \
    rmsnorm_bwd_dw_impl<T>(partial, groups, C, dweight, accumulate != 0);                     \
  }

HIPK_DTYPES(RMSNORM_KERNELS)
