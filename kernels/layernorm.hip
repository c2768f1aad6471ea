// kernels/layernorm.hip — layer norm forward and backward over the last dimension.
//
// NEVER RUN ON A GPU: compiled and statically checked for gfx906 only (see the figures below);
// the device tests ran on hip-emu (the CPU-emulated device) against the CPU reference.
//
// Layout: x, y, dy, dx are [rows, C] row-major in T (f32, f16, bf16); weight, bias, dweight,
// dbias are [C] in T; mean and rstd are [rows] f32. All math is f32. Biased variance, eps inside
// the square root (torch.nn.functional.layer_norm).
//
// Row groups: a row is handled by a group of threads, either one wave (`row_per_wave` != 0,
// for small C; several rows per block, no barriers) or the whole block (large C; reductions
// through LDS). Groups walk rows grid-stride. The launcher picks the mode and block size from
// C; any choice is correct, the choice only changes speed. In wave mode blockDim.x must be a
// multiple of warpSize (the launcher uses 256).
//
// Slots: thread t of a group of G threads owns slots k = 0, 1, ... of a row. In the vector
// layout (C % 4 == 0 and every tensor aligned to 4 elements; tested once per launch) slot k is
// the 4 consecutive elements (k·G + t)·4 .. +3, one 16-byte (f32) or 8-byte (f16/bf16) access;
// otherwise (odd C, misaligned views) slot k is the single element k·G + t. Both are coalesced.
//
// Forward: rows of at most 4 slots per thread (C ≤ 16·G: 1024 per wave64, 16384 per 1024-thread
// block) stay in registers between the three steps (mean; variance as Σ(x − mean)²; normalise):
// x is read once. Longer rows, and the scalar layout, stream: x is read three times (the second
// and third reads hit the cache). Writes y, mean, rstd.
//
// Residual forward (layernorm_fwd_residual_<T>: a, b, weight, bias, residual, y, mean, rstd,
// rows, C, eps, row_per_wave): x = a + b in f32, rounded once to T and stored to `residual`; the
// normalisation uses that rounded x (the stored residual, the CPU reference's semantics). The
// same row groups, paths and launch geometry as the forward, for every C: cached rows hold the
// rounded x in registers (a and b read once, residual and y written once: 24.5 B per f32
// element by `cargo xtask isa-report`, minimum 16, against 12 + 16.5 for residual_add then
// layernorm_fwd); streamed rows (long C, the scalar layout) store the residual in the first
// pass and re-read it in the second and third (each thread re-reads only what it wrote).
// Vector layout needs C % 4 == 0 and all six tensors aligned to 4 elements.
//
// Backward, stage 1 (layernorm_bwd_<T>): per row xhat = (x − mean)·rstd, g = dy·w,
// dx = rstd·(g − mean(g) − xhat·mean(g·xhat)). Each group also sums dy·xhat and dy per column
// over its rows: in registers for rows of one slot per thread (C ≤ 4·G: 256 per wave64, 4096
// per 1024-thread block), else in its own rows of `partial` (read-modify-write per row), and
// writes them to partial[group] = [2][C] f32.
// Wide backward (layernorm_bwd_wide_<T>), for 4096 < C ≤ 8·blockDim (8192 at 1024 threads),
// vector layout only (the launcher checks C % 4 == 0 and the alignment): the thread's 2 slots
// of the weight and of the column sums stay in registers across all the block's rows, g = dy·w
// of the row goes to LDS (each thread re-reads only its own slots) and xhat stays in registers
// for the second pass: x and dy are read once and dx written once per element (12.02 B per
// element for f32 by `cargo xtask isa-report`, minimum 12; the streamed backward moves 44;
// sizeof(T) more per element when accumulating, see below).
// Its block sum uses ds_swizzle and readlane (no lane-address registers: 59–61 VGPRs, no
// spill under the 64 a 1024-thread block allows).
// Stage 2 (layernorm_bwd_dwdb_<T>): dweight[j] = Σ_group partial[group][0][j], dbias likewise,
// summed in group order.
// Accumulate (the last argument of all three, non-zero: `LayerNormBackward::accumulate`): dx,
// dweight and dbias are read and the new gradient added to them in f32 before the one rounding
// to T (dx in the store of stage 1, dweight/dbias after the group sum of stage 2); otherwise
// they are overwritten and never read. The branch is uniform; the static byte figures of
// `cargo xtask isa-report` count its read of dx (one more sizeof(T) per element: 16.02 B per
// f32 element for the wide backward, 48 for the streamed one), which the overwriting call does
// not make (12.02 and 44 there). No float atomics anywhere: for a fixed launch configuration the
// results are bit-identical run to run.
//
// Row loops are wave-uniform: the row index of a wave-mode group comes from
// readfirstlane(tid / warpSize), so the row loop is a scalar branch and its shuffles and
// barriers never run under a partial exec mask.
//
// Static ISA figures (gfx906, hipcc 5.2), not measurements; `cargo xtask isa-report --only
// layernorm` prints them (docs/ISA-REPORT.md). waves/SIMD per the report's formula at the
// block size the launcher uses (row kernels: up to 1024 threads; wave mode: 256):
//   kernel                    VGPRs  SGPRs  LDS B  waves/SIMD @1024 (@256)  scratch  spills
//   layernorm_fwd_f32            46     58    128           4 (5)               0       0
//   layernorm_fwd_residual_f32   61     66    128           4 (4)               0       0
//   layernorm_fwd_residual_f16   59     62    128           4 (4)               0       0
//   layernorm_fwd_residual_bf16  62     66    128           4 (4)               0       0
//   layernorm_bwd_f32            53     75    256           4 (4)               0       0
//   layernorm_bwd_wide_f32       59     51  33024           4                   0       0
//   layernorm_bwd_dwdb_f32        9     14      0             (10)              0       0
//   layernorm_fwd_f16            41     58    128           4 (5)               0       0
//   layernorm_bwd_f16            50     73    256           4 (4)               0       0
//   layernorm_bwd_wide_f16       61     51  33024           4                   0       0
//   layernorm_bwd_dwdb_f16        9     14      0             (10)              0       0
//   layernorm_fwd_bf16           44     60    128           4 (5)               0       0
//   layernorm_bwd_bf16           51     75    256           4 (4)               0       0
//   layernorm_bwd_wide_bf16      61     53  33024           4                   0       0
//   layernorm_bwd_dwdb_bf16       8     14      0             (10)              0       0
// A 1024-thread block is 16 waves, 4 per SIMD: registers that would allow 5 waves still fit
// only one such block per CU. The wide backward's 33 KiB of LDS allows 1 block (4 waves/SIMD).
#include "common.h"

namespace {

/// Elements per slot: one 16-byte access for f32, 8 bytes for f16/bf16 in the vector layout.
constexpr int V = 4;
/// Slots per thread kept in registers for a cached forward row / backward row.
constexpr int kFwdSlots = 4;
constexpr int kBwdSlots = 1;
/// Slots per thread of the wide backward (layernorm_bwd_wide_<T>): 8 elements, C ≤ 8192.
constexpr int kWideSlots = 2;

/// Threads per block the row kernels are compiled for (their register budget).
constexpr int kMaxBlock = 1024;

/// One row group's geometry.
struct Group {
  int lane;       // thread index inside the group
  int size;       // threads in the group
  int64_t id;     // this group's index in the grid
  int64_t count;  // row groups in the grid
  bool wave;      // the group is one wave (no barriers, wave reductions)
};

__device__ __forceinline__ Group row_group(int row_per_wave) {
  Group g;
  const int tid = static_cast<int>(threadIdx.x);
  if (row_per_wave) {
    const int per_block = static_cast<int>(blockDim.x) / warpSize;
    g.lane = tid % warpSize;
    g.size = warpSize;
    // readfirstlane: the wave index is the same in every lane, and saying so makes the row
    // index, the row loop and its exit scalar (SGPRs, s_cbranch), so the group's shuffles and
    // barriers never sit in exec-masked code.
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

/// Sum over the group (a wave, or the block through `lds`).
__device__ __forceinline__ float group_sum(const Group& g, float v, float* lds) {
  return g.wave ? hipk::wave_sum(v) : hipk::block_sum(v, lds);
}

__device__ __forceinline__ void group_sum2(const Group& g, float& a, float& b, float* lds) {
  if (g.wave) {
    hipk::wave_sum2(a, b);
  } else {
    hipk::block_sum2(a, b, lds);
  }
}

/// Elements per slot: V consecutive ones in the vector layout (one access; needs C % V == 0
/// and aligned tensors), one in the scalar layout (any C and alignment).
template <bool kVec> constexpr int slot_width() { return kVec ? V : 1; }

/// Element e of slot k of thread `lane`: (k·G + lane)·W + e. Coalesced in both layouts.
template <bool kVec>
__device__ __forceinline__ int slot_elem(const Group& g, int k, int e) {
  return (k * g.size + g.lane) * slot_width<kVec>() + e;
}

/// True when slot k holds elements of a row of C (in the vector layout a slot is all in or
/// all out).
template <bool kVec>
__device__ __forceinline__ bool slot_live(const Group& g, int k, int C) {
  return slot_elem<kVec>(g, k, 0) < C;
}

/// Slots needed to cover a row of C elements.
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

/// in += slot k of row p (the accumulating backward's dx: the old value, added in f32 before
/// the one rounding of the store); a slot past C is left alone.
template <bool kVec, typename T>
__device__ __forceinline__ void add_slot(const T* p, const Group& g, int k, int C,
                                         float (&in)[slot_width<kVec>()]) {
  float old[slot_width<kVec>()];
  load_slot<kVec>(p, g, k, C, old);
#pragma unroll
  for (int e = 0; e < slot_width<kVec>(); ++e) in[e] += old[e];
}

/// The vector layout is usable: whole slots and every tensor aligned to a slot.
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

/// The x of layernorm_fwd_<T>: a stored tensor.
template <typename T> struct StoredX {
  static constexpr bool kResidual = false;
  const T* __restrict__ x;

  /// Slot k of row `row`, first read (the pass that sums the mean).
  template <bool kVec>
  __device__ __forceinline__ void first(int64_t row, const Group& g, int k, int C,
                                        float (&out)[slot_width<kVec>()]) const {
    load_slot<kVec>(x + row * C, g, k, C, out);
  }
  /// Slot k of row `row` again (the streamed passes after the first).
  template <bool kVec>
  __device__ __forceinline__ void again(int64_t row, const Group& g, int k, int C,
                                        float (&out)[slot_width<kVec>()]) const {
    load_slot<kVec>(x + row * C, g, k, C, out);
  }
};

/// The x of layernorm_fwd_residual_<T>: x = a + b in f32, rounded once to T and stored to
/// `res` on the first read; the normalisation sees that rounded value (the stored residual,
/// as the CPU reference normalises it). Later reads of a slot re-read `res`: the same thread
/// wrote exactly those elements earlier in program order.
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

/// y = (x − mean)·rstd·w + b for slot k of a row whose x values are `xv`.
template <bool kVec, typename T>
__device__ __forceinline__ void fwd_emit(const T* weight, const T* bias, T* yr, const Group& g,
                                         int k, int C, float mean, float rstd,
                                         const float (&xv)[slot_width<kVec>()]) {
  constexpr int W = slot_width<kVec>();
  float w[W];
  float b[W];
  float out[W];
  load_slot<kVec>(weight, g, k, C, w);
  load_slot<kVec>(bias, g, k, C, b);
#pragma unroll
  for (int e = 0; e < W; ++e) out[e] = (xv[e] - mean) * rstd * w[e] + b[e];
  store_slot<kVec>(yr, g, k, C, out);
}

/// Forward for rows of at most kFwdSlots slots per thread, vector layout: each row is read
/// once into registers.
template <typename T, typename Src>
__device__ void layernorm_fwd_cached(const Src src, const T* __restrict__ weight,
                                     const T* __restrict__ bias, T* __restrict__ y,
                                     float* __restrict__ mean_out, float* __restrict__ rstd_out,
                                     int64_t rows, int C, float eps, const Group& g, float* lds) {
  constexpr int K = kFwdSlots;
  const float inv_c = 1.0f / static_cast<float>(C);
  if constexpr (Src::kResidual) {
    HIPK_HOT_LOOP_BEGIN("fwd_res_row elems=16 group=res_row min_t=4 kind=memory inner_trip=6");
  } else {
    HIPK_HOT_LOOP_BEGIN("fwd_row elems=16 group=row min_t=2 kind=memory inner_trip=6");
  }
#pragma unroll 1
  for (int64_t row = g.id; row < rows; row += g.count) {
    float v[K][V];
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      src.template first<true>(row, g, k, C, v[k]);
#pragma unroll
      for (int e = 0; e < V; ++e) s += v[k][e];
    }
    const float mean = group_sum(g, s, lds) * inv_c;
    float q = 0.0f;
#pragma unroll
    for (int k = 0; k < K; ++k) {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float d = slot_live<true>(g, k, C) ? v[k][e] - mean : 0.0f;
        q += d * d;
      }
    }
    const float rstd = 1.0f / sqrtf(group_sum(g, q, lds) * inv_c + eps);
    if (g.lane == 0) {
      mean_out[row] = mean;
      rstd_out[row] = rstd;
    }
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (slot_live<true>(g, k, C)) fwd_emit<true>(weight, bias, y + row * C, g, k, C, mean, rstd, v[k]);
    }
  }
  if constexpr (Src::kResidual) {
    HIPK_HOT_LOOP_END("fwd_res_row");
  } else {
    HIPK_HOT_LOOP_END("fwd_row");
  }
}

/// Forward for any row length and layout: x is read three times (mean, variance, output);
/// the second and third reads of a row hit the cache.
template <bool kVec, typename T, typename Src>
__device__ void layernorm_fwd_stream(const Src src, const T* __restrict__ weight,
                                     const T* __restrict__ bias, T* __restrict__ y,
                                     float* __restrict__ mean_out, float* __restrict__ rstd_out,
                                     int64_t rows, int C, float eps, const Group& g, float* lds) {
  const float inv_c = 1.0f / static_cast<float>(C);
  const int slots = slot_count<kVec>(g, C);
  constexpr int W = slot_width<kVec>();
#pragma unroll 1
  for (int64_t row = g.id; row < rows; row += g.count) {
    float s = 0.0f;
#pragma unroll 1
    for (int k = 0; k < slots; ++k) {
      float t[W];
      src.template first<kVec>(row, g, k, C, t);
#pragma unroll
      for (int e = 0; e < W; ++e) s += t[e];
    }
    const float mean = group_sum(g, s, lds) * inv_c;
    float q = 0.0f;
#pragma unroll 1
    for (int k = 0; k < slots; ++k) {
      float t[W];
      src.template again<kVec>(row, g, k, C, t);
#pragma unroll
      for (int e = 0; e < W; ++e) {
        const float d = slot_elem<kVec>(g, k, e) < C ? t[e] - mean : 0.0f;
        q += d * d;
      }
    }
    const float rstd = 1.0f / sqrtf(group_sum(g, q, lds) * inv_c + eps);
    if (g.lane == 0) {
      mean_out[row] = mean;
      rstd_out[row] = rstd;
    }
#pragma unroll 1
    for (int k = 0; k < slots; ++k) {
      float t[W];
      src.template again<kVec>(row, g, k, C, t);
      fwd_emit<kVec>(weight, bias, y + row * C, g, k, C, mean, rstd, t);
    }
  }
}

template <typename T>
__device__ void layernorm_fwd_impl(const T* x, const T* weight, const T* bias, T* y,
                                   float* mean, float* rstd, int64_t rows, int C, float eps,
                                   int row_per_wave) {
  __shared__ float lds[hipk::kMaxWavesPerBlock];
  const Group g = row_group(row_per_wave);
  const StoredX<T> src{x};
  if (!vec_ok<T>(C, x, weight, bias, y)) {
    layernorm_fwd_stream<false>(src, weight, bias, y, mean, rstd, rows, C, eps, g, lds);
  } else if (slot_count<true>(g, C) <= kFwdSlots) {
    layernorm_fwd_cached(src, weight, bias, y, mean, rstd, rows, C, eps, g, lds);
  } else {
    layernorm_fwd_stream<true>(src, weight, bias, y, mean, rstd, rows, C, eps, g, lds);
  }
}

/// residual = a + b (rounded to T), then the forward of that stored residual: one launch, the
/// same paths (cached rows, streamed long rows, scalar layout) as layernorm_fwd_impl.
template <typename T>
__device__ void layernorm_fwd_residual_impl(const T* a, const T* b, const T* weight,
                                            const T* bias, T* residual, T* y, float* mean,
                                            float* rstd, int64_t rows, int C, float eps,
                                            int row_per_wave) {
  __shared__ float lds[hipk::kMaxWavesPerBlock];
  const Group g = row_group(row_per_wave);
  const ResidualX<T> src{a, b, residual};
  if (!vec_ok<T>(C, a, b, residual, y) || !vec_ok<T>(C, weight, bias, y, y)) {
    layernorm_fwd_stream<false>(src, weight, bias, y, mean, rstd, rows, C, eps, g, lds);
  } else if (slot_count<true>(g, C) <= kFwdSlots) {
    layernorm_fwd_cached(src, weight, bias, y, mean, rstd, rows, C, eps, g, lds);
  } else {
    layernorm_fwd_stream<true>(src, weight, bias, y, mean, rstd, rows, C, eps, g, lds);
  }
}

// ---------------------------------------------------------------------------------------------
// Backward
// ---------------------------------------------------------------------------------------------

/// Stage 1 for rows of at most kBwdSlots slots per thread, vector layout: x and dy of a row
/// and the group's column accumulators stay in registers. `pdw`/`pdb`: the group's partials.
template <typename T>
__device__ void layernorm_bwd_cached(const T* __restrict__ x, const T* __restrict__ weight,
                                     const T* __restrict__ dy, const float* __restrict__ mean_in,
                                     const float* __restrict__ rstd_in, T* __restrict__ dx,
                                     float* __restrict__ pdw, float* __restrict__ pdb,
                                     int64_t rows, int C, bool accumulate, const Group& g,
                                     float* lds) {
  constexpr int K = kBwdSlots;
  const float inv_c = 1.0f / static_cast<float>(C);
  float acc_dw[K][V];
  float acc_db[K][V];
#pragma unroll
  for (int k = 0; k < K; ++k) {
#pragma unroll
    for (int e = 0; e < V; ++e) acc_dw[k][e] = acc_db[k][e] = 0.0f;
  }
#pragma unroll 1
  for (int64_t row = g.id; row < rows; row += g.count) {
    const float mean = mean_in[row];
    const float rstd = rstd_in[row];
    float xh[K][V];
    float dyv[K][V];
    float s1 = 0.0f;
    float s2 = 0.0f;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      float w[V];
      load_slot<true>(x + row * C, g, k, C, xh[k]);
      load_slot<true>(dy + row * C, g, k, C, dyv[k]);
      load_slot<true>(weight, g, k, C, w);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        xh[k][e] = (xh[k][e] - mean) * rstd;  // dy is 0 past C: tails add nothing
        const float gw = dyv[k][e] * w[e];
        s1 += gw;
        s2 += gw * xh[k][e];
        acc_dw[k][e] += dyv[k][e] * xh[k][e];
        acc_db[k][e] += dyv[k][e];
      }
    }
    group_sum2(g, s1, s2, lds);
    const float m1 = s1 * inv_c;
    const float m2 = s2 * inv_c;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      float w[V];
      float out[V];
      load_slot<true>(weight, g, k, C, w);
#pragma unroll
      for (int e = 0; e < V; ++e) out[e] = rstd * (dyv[k][e] * w[e] - m1 - xh[k][e] * m2);
      if (accumulate) add_slot<true>(dx + row * C, g, k, C, out);
      store_slot<true>(dx + row * C, g, k, C, out);
    }
  }
#pragma unroll
  for (int k = 0; k < K; ++k) {
    store_slot<true>(pdw, g, k, C, acc_dw[k]);
    store_slot<true>(pdb, g, k, C, acc_db[k]);
  }
}

/// Stage 1 for any row length and layout: x, dy and weight are re-read, and the column sums
/// accumulate in the group's partial rows. Each partial element is only touched by the
/// thread that owns it, rows in order: deterministic.
template <bool kVec, typename T>
__device__ void layernorm_bwd_stream(const T* __restrict__ x, const T* __restrict__ weight,
                                     const T* __restrict__ dy, const float* __restrict__ mean_in,
                                     const float* __restrict__ rstd_in, T* __restrict__ dx,
                                     float* __restrict__ pdw, float* __restrict__ pdb,
                                     int64_t rows, int C, bool accumulate, const Group& g,
                                     float* lds) {
  const float inv_c = 1.0f / static_cast<float>(C);
  const int slots = slot_count<kVec>(g, C);
  constexpr int W = slot_width<kVec>();
#pragma unroll 1
  for (int k = 0; k < slots; ++k) {
    const float zero[W] = {};
    store_slot<kVec>(pdw, g, k, C, zero);
    store_slot<kVec>(pdb, g, k, C, zero);
  }
#pragma unroll 1
  for (int64_t row = g.id; row < rows; row += g.count) {
    const float mean = mean_in[row];
    const float rstd = rstd_in[row];
    const T* xr = x + row * C;
    const T* dyr = dy + row * C;
    float s1 = 0.0f;
    float s2 = 0.0f;
    if constexpr (kVec) HIPK_HOT_LOOP_BEGIN("bwd_stream_pass1 elems=4 group=row min_t=3 kind=memory");
#pragma unroll 1
    for (int k = 0; k < slots; ++k) {
      float xv[W];
      float dyv[W];
      float w[W];
      float adw[W];
      float adb[W];
      load_slot<kVec>(xr, g, k, C, xv);
      load_slot<kVec>(dyr, g, k, C, dyv);
      load_slot<kVec>(weight, g, k, C, w);
      load_slot<kVec>(pdw, g, k, C, adw);
      load_slot<kVec>(pdb, g, k, C, adb);
#pragma unroll
      for (int e = 0; e < W; ++e) {
        const float xh = (xv[e] - mean) * rstd;
        const float gw = dyv[e] * w[e];
        s1 += gw;
        s2 += gw * xh;
        adw[e] += dyv[e] * xh;
        adb[e] += dyv[e];
      }
      store_slot<kVec>(pdw, g, k, C, adw);
      store_slot<kVec>(pdb, g, k, C, adb);
    }
    if constexpr (kVec) HIPK_HOT_LOOP_END("bwd_stream_pass1");
    group_sum2(g, s1, s2, lds);
    const float m1 = s1 * inv_c;
    const float m2 = s2 * inv_c;
    if constexpr (kVec) HIPK_HOT_LOOP_BEGIN("bwd_stream_pass2 elems=4 group=row min_t=3 kind=memory");
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
      for (int e = 0; e < W; ++e) {
        const float xh = (xv[e] - mean) * rstd;
        out[e] = rstd * (dyv[e] * w[e] - m1 - xh * m2);
      }
      if (accumulate) add_slot<kVec>(dx + row * C, g, k, C, out);
      store_slot<kVec>(dx + row * C, g, k, C, out);
    }
    if constexpr (kVec) HIPK_HOT_LOOP_END("bwd_stream_pass2");
  }
}

/// a += a of lane ^ X, b likewise, within each group of 32 lanes (ds_swizzle bitmask mode:
/// and 0x1f, or 0, xor X).
template <int X> __device__ __forceinline__ void swizzle_add(float& a, float& b) {
  constexpr int kPattern = 0x1f | (X << 10);
  a += __int_as_float(__builtin_amdgcn_ds_swizzle(__float_as_int(a), kPattern));
  b += __int_as_float(__builtin_amdgcn_ds_swizzle(__float_as_int(b), kPattern));
}

/// Block sums of two values for the wide backward, with no lane-address registers: butterflies
/// inside each group of 32 lanes by ds_swizzle (xor 1, 2, 4, 8, 16), then the wave's halves
/// and the waves added in a fixed order (deterministic) through scalar readlane and `lds`
/// (2 floats per wave). Every thread of the block must call it.
__device__ __forceinline__ void wide_block_sum2(float& a, float& b, float* lds) {
  swizzle_add<1>(a, b);
  swizzle_add<2>(a, b);
  swizzle_add<4>(a, b);
  swizzle_add<8>(a, b);
  swizzle_add<16>(a, b);
  float ra = __int_as_float(__builtin_amdgcn_readlane(__float_as_int(a), 0));
  float rb = __int_as_float(__builtin_amdgcn_readlane(__float_as_int(b), 0));
  if (warpSize == 64) {  // wave64: add the upper half (wave32 has none)
    ra += __int_as_float(__builtin_amdgcn_readlane(__float_as_int(a), 32));
    rb += __int_as_float(__builtin_amdgcn_readlane(__float_as_int(b), 32));
  }
  const int tid = static_cast<int>(threadIdx.x);
  const int wave = __builtin_amdgcn_readfirstlane(tid / warpSize);
  const int waves = (static_cast<int>(blockDim.x) + warpSize - 1) / warpSize;
  if (tid % warpSize == 0) {
    lds[2 * wave] = ra;
    lds[2 * wave + 1] = rb;
  }
  __syncthreads();
  a = lds[0];
  b = lds[1];
  for (int w = 1; w < waves; ++w) {
    a += lds[2 * w];
    b += lds[2 * w + 1];
  }
  __syncthreads();
}

/// p + elem for a row-relative elem < 2^30 / sizeof(T): a 32-bit unsigned byte offset, which
/// with a uniform p lets the compiler address with `global_load v_off, s[base]`.
template <typename T> __device__ __forceinline__ T* at_u32(T* p, int elem) {
  using Byte = typename std::conditional<std::is_const<T>::value, const char, char>::type;
  const uint32_t off = static_cast<uint32_t>(elem) * static_cast<uint32_t>(sizeof(T));
  return reinterpret_cast<T*>(reinterpret_cast<Byte*>(p) + off);
}

/// Stage 1 for 4096 < C ≤ kWideSlots·V·blockDim.x (vector layout; the launcher checks C % V == 0
/// and the alignment of every tensor), one block per row group: this thread's kWideSlots slots
/// of the weight and of the column sums dweight/dbias stay in registers across all the group's
/// rows, and g = dy·w of the row is kept in LDS (each thread re-reads only its own slots, so no
/// barrier guards it) for the second pass. Global traffic per row: x and dy read once, dx
/// written once (3·sizeof(T) per element) plus mean/rstd as scalar loads.
template <typename T>
__device__ void layernorm_bwd_wide_impl(const T* __restrict__ x, const T* __restrict__ weight,
                                        const T* __restrict__ dy,
                                        const float* __restrict__ mean_in,
                                        const float* __restrict__ rstd_in, T* __restrict__ dx,
                                        float* __restrict__ partial, int64_t rows, int C,
                                        bool accumulate) {
  constexpr int K = kWideSlots;
  __shared__ float4 row_g[K * kMaxBlock];
  __shared__ float lds[2 * hipk::kMaxWavesPerBlock];
  const Group g = row_group(0);
  if (!vec_ok<T>(C, x, weight, dy, dx) || !hipk::is_aligned(partial, V * sizeof(float)) ||
      slot_count<true>(g, C) > K) {
    __builtin_trap();  // the launcher never launches this kernel on such tensors
  }
  const float inv_c = 1.0f / static_cast<float>(C);
  float w[K][V];
  float acc_dw[K][V];
  float acc_db[K][V];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    load_slot<true>(weight, g, k, C, w[k]);
#pragma unroll
    for (int e = 0; e < V; ++e) acc_dw[k][e] = acc_db[k][e] = 0.0f;
  }
  HIPK_HOT_LOOP_BEGIN(
      "bwd_wide_row elems=8 group=wide min_t=3 kind=memory block=1024");
#pragma unroll 1
  for (int64_t row = g.id; row < rows; row += g.count) {
    const float mean = hipk::load_uniform(mean_in, row);
    const float rstd = hipk::load_uniform(rstd_in, row);
    const T* xr = hipk::uniform_global_ptr(x + row * C);
    const T* dyr = hipk::uniform_global_ptr(dy + row * C);
    T* dxr = hipk::uniform_global_ptr(dx + row * C);
    // Every load of the row is issued before the first use: one memory round trip per row.
    float xh[K][V];
    float dyk[K][V];
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int j = slot_elem<true>(g, k, 0);
      if (j < C) {
        hipk::load_vec<V>(at_u32(xr, j), xh[k]);
        hipk::load_vec<V>(at_u32(dyr, j), dyk[k]);
      } else {
#pragma unroll
        for (int e = 0; e < V; ++e) xh[k][e] = dyk[k][e] = 0.0f;
      }
    }
    float s1 = 0.0f;
    float s2 = 0.0f;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const float (&dyv)[V] = dyk[k];
      float gw[V];
#pragma unroll
      for (int e = 0; e < V; ++e) {
        xh[k][e] = (xh[k][e] - mean) * rstd;  // dy is 0 past C: tails add nothing
        gw[e] = dyv[e] * w[k][e];
        s1 += gw[e];
        s2 += gw[e] * xh[k][e];
        acc_dw[k][e] += dyv[e] * xh[k][e];
        acc_db[k][e] += dyv[e];
      }
      row_g[k * kMaxBlock + g.lane] = make_float4(gw[0], gw[1], gw[2], gw[3]);
    }
    wide_block_sum2(s1, s2, lds);
    const float m1 = s1 * inv_c;
    const float m2 = s2 * inv_c;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const float4 gv = row_g[k * kMaxBlock + g.lane];
      const float gw[V] = {gv.x, gv.y, gv.z, gv.w};
      float out[V];
#pragma unroll
      for (int e = 0; e < V; ++e) out[e] = rstd * (gw[e] - m1 - xh[k][e] * m2);
      const int j = slot_elem<true>(g, k, 0);
      if (j < C) {
        if (accumulate) {
          float old[V];
          hipk::load_vec<V>(at_u32(static_cast<const T*>(dxr), j), old);
#pragma unroll
          for (int e = 0; e < V; ++e) out[e] += old[e];
        }
        hipk::store_vec<V>(at_u32(dxr, j), out);
      }
    }
  }
  HIPK_HOT_LOOP_END("bwd_wide_row");
  float* pdw = partial + g.id * 2 * C;
  float* pdb = pdw + C;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    store_slot<true>(pdw, g, k, C, acc_dw[k]);
    store_slot<true>(pdb, g, k, C, acc_db[k]);
  }
}

template <typename T>
__device__ void layernorm_bwd_impl(const T* x, const T* weight, const T* dy, const float* mean,
                                   const float* rstd, T* dx, float* partial, int64_t rows, int C,
                                   int row_per_wave, bool accumulate) {
  __shared__ float lds[2 * hipk::kMaxWavesPerBlock];
  const Group g = row_group(row_per_wave);
  float* pdw = partial + g.id * 2 * C;  // this group's dweight partial row
  float* pdb = pdw + C;                  // and its dbias partial row
  // The partial rows are f32 at offsets that are multiples of C (C % V == 0 in vector layout).
  if (!vec_ok<T>(C, x, weight, dy, dx) || !hipk::is_aligned(partial, V * sizeof(float))) {
    layernorm_bwd_stream<false>(x, weight, dy, mean, rstd, dx, pdw, pdb, rows, C, accumulate, g,
                                lds);
  } else if (slot_count<true>(g, C) <= kBwdSlots) {
    layernorm_bwd_cached(x, weight, dy, mean, rstd, dx, pdw, pdb, rows, C, accumulate, g, lds);
  } else {
    layernorm_bwd_stream<true>(x, weight, dy, mean, rstd, dx, pdw, pdb, rows, C, accumulate, g,
                               lds);
  }
}

/// Stage 2: dweight[j] = Σ_g partial[g][0][j], dbias[j] = Σ_g partial[g][1][j], g in order;
/// with `accumulate` the old dweight[j] / dbias[j] is added to the f32 sum last (one rounding).
template <typename T>
__device__ void layernorm_bwd_dwdb_impl(const float* __restrict__ partial, int64_t groups,
                                        int C, T* __restrict__ dweight, T* __restrict__ dbias,
                                        bool accumulate) {
  const int j = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (j >= C) return;
  float dw = 0.0f;
  float db = 0.0f;
  for (int64_t gi = 0; gi < groups; ++gi) {
    const float* p = partial + gi * 2 * C;
    dw += p[j];
    db += p[C + j];
  }
  if (accumulate) {
    dw += hipk::load_as_float(dweight, j);
    db += hipk::load_as_float(dbias, j);
  }
  hipk::store_from_float(dweight, j, dw);
  hipk::store_from_float(dbias, j, db);
}

}  // namespace

#define LAYERNORM_KERNELS(suffix, T)                                                          \
  HIPK_KERNEL(layernorm_fwd_##suffix, kMaxBlock)                                              \
  (const T* x, const T* weight, const T* bias, T* y, float* mean, float* rstd, int64_t rows,  \
   int C, float eps, int row_per_wave) {                                                      \
    layernorm_fwd_impl<T>(x, weight, bias, y, mean, rstd, rows, C, eps, row_per_wave);        \
  }                                                                                           \
  HIPK_KERNEL(layernorm_fwd_residual_##suffix, kMaxBlock)                                     \
  (const T* a, const T* b, const T* weight, const T* bias, T* residual, T* y, float* mean,    \
   float* rstd, int64_t rows, int C, float eps, int row_per_wave) {                           \
    layernorm_fwd_residual_impl<T>(a, b, weight, bias, residual, y, mean, rstd, rows, C, eps, \
                                   row_per_wave);                                             \
  }                                                                                           \
  HIPK_KERNEL(layernorm_bwd_##suffix, kMaxBlock)                                              \
  (const T* x, const T* weight, const T* dy, const float* mean, const float* rstd, T* dx,     \
   float* partial, int64_t rows, int C, int row_per_wave, int accumulate) {                   \
    layernorm_bwd_impl<T>(x, weight, dy, mean, rstd, dx, partial, rows, C, row_per_wave,      \
                          accumulate != 0);                                                   \
  }                                                                                           \
  HIPK_KERNEL(layernorm_bwd_wide_##suffix, kMaxBlock)                                         \
  (const T* x, const T* weight, const T* dy, const float* mean, const float* rstd, T* dx,     \
   float* partial, int64_t rows, int C, int accumulate) {                                     \
    layernorm_bwd_wide_impl<T>(x, weight, dy, mean, rstd, dx, partial, rows, C,               \
                               accumulate != 0);                                              \
  }                                                                                           \
  HIPK_KERNEL(layernorm_bwd_dwdb_##suffix, 256)                                               \
  (const float* partial, int64_t groups, int C, T* dweight, T* dbias, int accumulate) {       \
    layernorm_bwd_dwdb_impl<T>(partial, groups, C, dweight, dbias, accumulate != 0);          \
  }

HIPK_DTYPES(LAYERNORM_KERNELS)
