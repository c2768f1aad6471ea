// kernels/attention.hip — FlashAttention-2 style attention, forward and backward.
//
// NEVER RUN ON A GPU. Compiled and resource-checked for gfx906 only (hipcc 5.2 / clang 15,
// --genco -O3, -Rpass-analysis=kernel-resource-usage); not yet compared with the CPU reference on
// a device. Masking and bounds were reviewed by hand.
//
// Tensors are contiguous: q, out, dout, dq [BH, Tq, D]; k, v, dk, dv [BH, Tk, D]; lse, delta
// [BH, Tq] f32 (BH = batch * heads). Storage f32 / f16 / bf16, all math f32.
// Semantics (= the CPU reference): s_ij = scale * q_i . k_j; key j is visible to query i iff
// j < Tk and, when causal, j <= i + Tk - Tq (bottom-right aligned); out_i = softmax_j(s_i) v;
// lse_i = ln sum_j exp(s_ij) (natural log). A row that sees no key gets out = 0, lse = -inf and
// zero gradients; a key no query sees gets dk = dv = 0.
//
// Exported kernels (<db> = head-dim bucket 32, 64, 96 or 128: the smallest >= D; D itself may be
// anything in 1..=128, columns past D are zero-filled on load and never stored):
//   attention_fwd_d<db>_<dtype>(q, k, v, out, lse, Tq, Tk, D, scale, causal)
//       grid (ceil(Tq / 64), BH), block 256.
//   attention_bwd_dot_<dtype>(out, dout, delta, rows, D)   delta_i = sum_d dout_id * out_id
//       grid (ceil(rows / 16)), block 256 (16 lanes per row); rows = BH * Tq.
//   attention_bwd_dkdv_d<db>_<dtype>(q, k, v, dout, lse, delta, dk, dv, Tq, Tk, D, scale, causal)
//       grid (ceil(Tk / KROWS), BH), block 256; KROWS = 256 / G_BWD (64 for db <= 64, else 32).
//   attention_bwd_dq_d<db>_<dtype>(q, k, v, dout, lse, delta, dq, Tq, Tk, D, scale, causal)
//       grid (ceil(Tq / QROWS), BH), block 256; QROWS = 256 / G_BWD.
// causal is 0 or 1. No dynamic LDS. BH <= 65535 per launch (grid.y).
//
// Work layout ("lane groups"): G consecutive lanes own one row (a query in fwd/dq, a key in
// dkdv). Lane g of a group holds 4-wide chunks c*G + g of the row (c < DB / (4G)), so the G
// lanes of a group read 4G consecutive floats of an LDS row: no bank conflicts, and all groups of
// a wave read the same LDS row at the same time (broadcast). A dot product is a per-lane partial
// sum plus a G-lane butterfly (DPP quad permutes inside 4 lanes, a shuffle for 8), after which
// every lane of the group holds the full value, so the softmax bookkeeping needs no further
// communication. Wave-size agnostic: G divides 32 and 64.
//
// Forward: a block owns 64 queries (G = 4) and holds them (pre-scaled by scale * log2 e) and
// their output accumulators in registers. It walks the key/value tiles (BKV x DB of K and of V
// staged in LDS as f32), keeping the running max m and sum l in the exp2 domain; the output is
// rescaled when the max grows (online softmax) and normalised once at the end; lse = ln 2 *
// (m + log2 l). No Tq x Tk matrix exists anywhere. With causal, the tiles past the block's
// last visible key are never loaded (for Tq = Tk about half of them); heavy query tiles start
// first.
// Backward (deterministic, no atomics): the dot pre-pass computes delta = rowsum(dout * out);
// the dkdv kernel owns KROWS keys (k, v, dk, dv in registers) and walks the query tiles (q and
// dout staged in LDS, with lse and delta) recomputing p = exp(s - lse); the dq kernel owns
// QROWS queries (q, dout, dq in registers) and walks the key tiles. Each output element is
// written once by one thread. Causal: the dkdv kernel starts at the first query tile that can
// see its keys, the dq kernel stops after the last key tile its queries can see.
//
// Tiles and LDS (256 threads = 4 wave64):
//   fwd      G = 4, 64 queries; BKV = 64 (db <= 64) or 32: K + V tiles <= 32 KiB.
//   dkdv     G = 4 (db <= 64) or 8; query tile 64 / 32 / 16 / 16 rows (db 32 / 64 / 96 / 128).
//   dq       G as dkdv; key tile BKV as fwd.
// Every kernel keeps LDS <= 32 KiB and VGPRs <= 128 (__launch_bounds__(256, 2)), i.e. at
// least 2 blocks = 2 waves per SIMD on a 64 KiB CU.
// gfx906 resource figures (hipcc 5.2 / clang 15, -O3, -Rpass-analysis=kernel-resource-usage),
// f32 (f16 / bf16 within +3 VGPRs); all 39 kernels: scratch 0, SGPR and VGPR spills 0.
//   kernel      d32               d64               d96               d128
//   fwd         70 V  16384 B  3  89 V  32768 B  2  90 V  24576 B  2  125 V 32768 B  2
//   bwd_dkdv    69 V  16896 B  3  119 V 16640 B  2  97 V  12416 B  2  122 V 16512 B  2
//   bwd_dq      55 V  16384 B  4  96 V  32768 B  2  77 V  24576 B  3  94 V  32768 B  2
//   bwd_dot     30 V, no LDS, occupancy 8
// (V = VGPRs, B = LDS bytes per block, last = occupancy in waves/SIMD; SGPRs 27-59.)
// Performance: never measured. Target from the issue, unverified: forward >= 2x a hipBLAS +
// softmax baseline at T = 2048.

#include "common.h"
#include "tile_io.h"

namespace hipk_attn {

constexpr int kThreads = 256;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kNegInf = -__builtin_huge_valf();

/// Sum over the G consecutive lanes of a group (G in {1, 2, 4, 8}); all lanes get the result.
/// Every lane of the wave must be active (no divergent branch around a call).
template <int G> __device__ __forceinline__ float group_sum(float x) {
  if constexpr (G >= 2) {  // quad_perm [1, 0, 3, 2]: partner lane ^ 1
    x += __int_as_float(__builtin_amdgcn_update_dpp(0, __float_as_int(x), 0xB1, 0xF, 0xF, false));
  }
  if constexpr (G >= 4) {  // quad_perm [2, 3, 0, 1]: partner lane ^ 2
    x += __int_as_float(__builtin_amdgcn_update_dpp(0, __float_as_int(x), 0x4E, 0xF, 0xF, false));
  }
  if constexpr (G >= 8) x += __shfl_xor(x, 4);
  static_assert(G <= 8, "groups of at most 8 lanes");
  return x;
}

/// The slice of one DB-wide row held by lane g of a G-lane group: NC chunks of 4 columns,
/// chunk c at columns 4 * (c * G + g).
template <int DB, int G> struct Slice {
  static constexpr int NC = DB / (4 * G);
  static_assert(NC * 4 * G == DB, "bucket splits into 4-wide chunks per lane");
  float x[NC][4];

  __device__ __forceinline__ static int col(int c, int g) { return 4 * (c * G + g); }

  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int c = 0; c < NC; ++c) {
#pragma unroll
      for (int u = 0; u < 4; ++u) x[c][u] = 0.0f;
    }
  }
  /// Loads columns of `row` (D valid columns; nothing read when !row_ok), times `mul`.
  template <typename T>
  __device__ __forceinline__ void load(const T* row, bool row_ok, int D, int g, bool vec_ok,
                                       float mul) {
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      hipk::load_vec<4>(row + col(c, g), row_ok ? D - col(c, g) : 0, vec_ok, x[c]);
#pragma unroll
      for (int u = 0; u < 4; ++u) x[c][u] *= mul;
    }
  }
  /// Stores the first D columns of this slice times `mul` into `row`.
  template <typename T>
  __device__ __forceinline__ void store(T* row, int D, int g, bool vec_ok, float mul) const {
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      float y[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) y[u] = x[c][u] * mul;
      hipk::store_vec<4>(row + col(c, g), D - col(c, g), vec_ok, y);
    }
  }
  /// Partial dot product of this slice with the same columns of an LDS row.
  __device__ __forceinline__ float dot(const float* lds_row, int g) const {
    float s = 0.0f;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const float4 w = *reinterpret_cast<const float4*>(lds_row + col(c, g));
      s = __builtin_fmaf(x[c][0], w.x, s);
      s = __builtin_fmaf(x[c][1], w.y, s);
      s = __builtin_fmaf(x[c][2], w.z, s);
      s = __builtin_fmaf(x[c][3], w.w, s);
    }
    return s;
  }
  /// this += a * (the same columns of an LDS row).
  __device__ __forceinline__ void axpy(float a, const float* lds_row, int g) {
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const float4 w = *reinterpret_cast<const float4*>(lds_row + col(c, g));
      x[c][0] = __builtin_fmaf(a, w.x, x[c][0]);
      x[c][1] = __builtin_fmaf(a, w.y, x[c][1]);
      x[c][2] = __builtin_fmaf(a, w.z, x[c][2]);
      x[c][3] = __builtin_fmaf(a, w.w, x[c][3]);
    }
  }
  __device__ __forceinline__ void scale(float a) {
#pragma unroll
    for (int c = 0; c < NC; ++c) {
#pragma unroll
      for (int u = 0; u < 4; ++u) x[c][u] *= a;
    }
  }
};

/// Copies rows [r0, r0 + ROWS) of a [rows_total, D] tensor into an LDS tile [ROWS][DB] as f32,
/// zero-filling rows past rows_total and columns past D. All threads of the block take part.
template <int ROWS, int DB, typename T>
__device__ __forceinline__ void stage_rows(float* lds, const T* x, int rows_total, int r0, int D,
                                           bool vec_ok, int tid) {
  constexpr int kSlotsPerRow = DB / 4;
  constexpr int kSlots = ROWS * kSlotsPerRow;
  // Not unrolled: the unrolled form issues every load first and spills at d128.
#pragma unroll 1
  for (int it = 0; it < (kSlots + kThreads - 1) / kThreads; ++it) {
    const int s = tid + it * kThreads;
    if (kSlots % kThreads != 0 && s >= kSlots) break;
    const int r = s / kSlotsPerRow;
    const int c = (s % kSlotsPerRow) * 4;
    const bool ok = r0 + r < rows_total;
    float w[4];
    hipk::load_vec<4>(x + static_cast<int64_t>(ok ? r0 + r : 0) * D + c, ok ? D - c : 0, vec_ok,
                      w);
    *reinterpret_cast<float4*>(lds + r * DB + c) = make_float4(w[0], w[1], w[2], w[3]);
  }
}

/// Last key index visible to query i (may be < 0: none); Tk - 1 when not causal.
__device__ __forceinline__ int last_key(int i, int Tq, int Tk, bool causal) {
  return causal ? min(i + Tk - Tq, Tk - 1) : Tk - 1;
}

/// True when rows of a [*, D] tensor at x start aligned for 4-element vector accesses.
template <typename T> __device__ __forceinline__ bool vec4_ok(const T* x, int D) {
  return hipk::rows_aligned<4>(x, D, 0);
}

template <int DB> struct FwdCfg {
  static constexpr int G = 4;
  static constexpr int ROWS = kThreads / G;   // queries per block
  static constexpr int BKV = DB <= 64 ? 64 : 32;  // keys per LDS tile
};

template <int DB> struct BwdCfg {
  static constexpr int G = DB <= 64 ? 4 : 8;
  static constexpr int ROWS = kThreads / G;  // keys (dkdv) or queries (dq) per block
  static constexpr int BQ = DB == 32 ? 64 : (DB == 64 ? 32 : 16);  // dkdv: queries per tile
  static constexpr int BKV = FwdCfg<DB>::BKV;                       // dq: keys per tile
};

// ---------------------------------------------------------------------------------------------
// Forward
// ---------------------------------------------------------------------------------------------

template <typename T, int DB>
__device__ __forceinline__ void fwd(const T* __restrict__ q, const T* __restrict__ k,
                                    const T* __restrict__ v, T* __restrict__ out,
                                    float* __restrict__ lse, int Tq, int Tk, int D, float scale,
                                    int causal_flag) {
  using Cfg = FwdCfg<DB>;
  constexpr int G = Cfg::G;
  constexpr int BKV = Cfg::BKV;
  __shared__ float k_lds[BKV * DB];
  __shared__ float v_lds[BKV * DB];

  const bool causal = causal_flag != 0;
  const int tid = static_cast<int>(threadIdx.x);
  const int g = tid % G;
  // Causal: the last query tiles see the most keys; start them first.
  const int tile = causal ? static_cast<int>(gridDim.x - 1 - blockIdx.x)
                          : static_cast<int>(blockIdx.x);
  const int q0 = tile * Cfg::ROWS;
  const int i = q0 + tid / G;
  const bool row_ok = i < Tq;
  const int64_t bh = blockIdx.y;
  const T* k_bh = k + bh * Tk * D;
  const T* v_bh = v + bh * Tk * D;
  const bool vec_ok = vec4_ok(q, D) && vec4_ok(k, D) && vec4_ok(v, D) && vec4_ok(out, D);

  Slice<DB, G> qs;  // q_i * scale * log2(e): scores come out in the exp2 domain
  qs.load(q + (bh * Tq + (row_ok ? i : 0)) * D, row_ok, D, g, vec_ok, scale * kLog2e);
  Slice<DB, G> acc;
  acc.zero();
  float m = kNegInf;  // running max of the visible scores (exp2 domain)
  float l = 0.0f;     // running sum of exp2(s - m)

  const int jmax = row_ok ? last_key(i, Tq, Tk, causal) : -1;
  // Keys any row of the block can see: [0, kv_end).
  const int kv_end = max(0, last_key(min(q0 + Cfg::ROWS, Tq) - 1, Tq, Tk, causal) + 1);

  for (int j0 = 0; j0 < kv_end; j0 += BKV) {
    __syncthreads();  // the previous tile is no longer read
    stage_rows<BKV, DB>(k_lds, k_bh, Tk, j0, D, vec_ok, tid);
    stage_rows<BKV, DB>(v_lds, v_bh, Tk, j0, D, vec_ok, tid);
    __syncthreads();
    // Keys in sub-tiles of 16: scores, then one online-softmax step.
    constexpr int KC = 16;
#pragma unroll 1
    for (int jc = 0; jc < BKV; jc += KC) {
      float s[KC];
      float tile_max = kNegInf;
#pragma unroll
      for (int u = 0; u < KC; ++u) {
        const float dot = group_sum<G>(qs.dot(k_lds + (jc + u) * DB, g));
        s[u] = j0 + jc + u <= jmax ? dot : kNegInf;
        tile_max = fmaxf(tile_max, s[u]);
      }
      const float m_new = fmaxf(m, tile_max);
      // All visible scores so far masked: keep everything at zero without producing NaN.
      const float m_ref = m_new == kNegInf ? 0.0f : m_new;
      const float corr = exp2f(m - m_ref);  // 0 when m = -inf
      l *= corr;
      acc.scale(corr);
#pragma unroll
      for (int u = 0; u < KC; ++u) {
        const float p = exp2f(s[u] - m_ref);  // 0 for masked keys
        l += p;
        acc.axpy(p, v_lds + (jc + u) * DB, g);
      }
      m = m_new;
    }
  }

  if (row_ok) {
    const bool any = l > 0.0f;
    acc.store(out + (bh * Tq + i) * D, D, g, vec_ok, any ? 1.0f / l : 0.0f);
    if (g == 0) lse[bh * Tq + i] = any ? (m + __log2f(l)) * kLn2 : kNegInf;
  }
}

// ---------------------------------------------------------------------------------------------
// Backward
// ---------------------------------------------------------------------------------------------

/// delta_r = sum_d dout[r, d] * out[r, d] for r < rows; 16 lanes per row.
template <typename T>
__device__ __forceinline__ void bwd_dot(const T* __restrict__ out, const T* __restrict__ dout,
                                        float* __restrict__ delta, int64_t rows, int D) {
  constexpr int L = 16;
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (kThreads / L) + tid / L;
  const int lane = tid % L;
  const bool row_ok = r < rows;
  const bool vec_ok = vec4_ok(out, D) && vec4_ok(dout, D);
  const int64_t base = (row_ok ? r : 0) * D;
  float s = 0.0f;
  for (int c = 4 * lane; c < D; c += 4 * L) {
    float a[4];
    float b[4];
    hipk::load_vec<4>(out + base + c, row_ok ? D - c : 0, vec_ok, a);
    hipk::load_vec<4>(dout + base + c, row_ok ? D - c : 0, vec_ok, b);
#pragma unroll
    for (int u = 0; u < 4; ++u) s = __builtin_fmaf(a[u], b[u], s);
  }
#pragma unroll
  for (int o = L / 2; o > 0; o /= 2) s += __shfl_xor(s, o);
  if (row_ok && lane == 0) delta[r] = s;
}

/// p_ij = exp(s_ij - lse_i), with s2 = s_ij * log2 e and lse2 = lse_i * log2 e; 0 when the key
/// is masked or the row saw no key (lse = -inf).
__device__ __forceinline__ float recompute_p(float s2, float lse2, bool visible) {
  return visible && lse2 != kNegInf ? exp2f(s2 - lse2) : 0.0f;
}

template <typename T, int DB>
__device__ __forceinline__ void bwd_dkdv(const T* __restrict__ q, const T* __restrict__ k,
                                         const T* __restrict__ v, const T* __restrict__ dout,
                                         const float* __restrict__ lse,
                                         const float* __restrict__ delta, T* __restrict__ dk,
                                         T* __restrict__ dv, int Tq, int Tk, int D, float scale,
                                         int causal_flag) {
  using Cfg = BwdCfg<DB>;
  constexpr int G = Cfg::G;
  constexpr int BQ = Cfg::BQ;
  __shared__ float q_lds[BQ * DB];
  __shared__ float do_lds[BQ * DB];
  __shared__ float lse2_lds[BQ];
  __shared__ float delta_lds[BQ];

  const bool causal = causal_flag != 0;
  const int tid = static_cast<int>(threadIdx.x);
  const int g = tid % G;
  const int j0 = static_cast<int>(blockIdx.x) * Cfg::ROWS;
  const int j = j0 + tid / G;
  const bool key_ok = j < Tk;
  const int64_t bh = blockIdx.y;
  const bool vec_ok = vec4_ok(q, D) && vec4_ok(k, D) && vec4_ok(v, D) && vec4_ok(dout, D) &&
                      vec4_ok(dk, D) && vec4_ok(dv, D);

  Slice<DB, G> ks, vs, dks, dvs;
  ks.load(k + (bh * Tk + (key_ok ? j : 0)) * D, key_ok, D, g, vec_ok, 1.0f);
  vs.load(v + (bh * Tk + (key_ok ? j : 0)) * D, key_ok, D, g, vec_ok, 1.0f);
  dks.zero();
  dvs.zero();
  const float s2_scale = scale * kLog2e;

  // Query i sees key j iff j <= i + Tk - Tq: the first query any key of the block is visible to.
  const int i_first = causal ? max(0, j0 - (Tk - Tq)) : 0;
  const int i_start = (i_first / BQ) * BQ;
  const T* q_bh = q + bh * Tq * D;
  const T* do_bh = dout + bh * Tq * D;
  for (int i0 = i_start; i0 < Tq; i0 += BQ) {
    __syncthreads();
    stage_rows<BQ, DB>(q_lds, q_bh, Tq, i0, D, vec_ok, tid);
    stage_rows<BQ, DB>(do_lds, do_bh, Tq, i0, D, vec_ok, tid);
    for (int r = tid; r < BQ; r += kThreads) {
      const bool ok = i0 + r < Tq;
      lse2_lds[r] = ok ? lse[bh * Tq + i0 + r] * kLog2e : kNegInf;
      delta_lds[r] = ok ? delta[bh * Tq + i0 + r] : 0.0f;
    }
    __syncthreads();
#pragma unroll 1  // 4 slices of 16 registers are live; unrolling spills at d128
    for (int r = 0; r < BQ; ++r) {
      const int i = i0 + r;
      const bool visible = key_ok && i < Tq && j <= last_key(i, Tq, Tk, causal);
      const float s2 = group_sum<G>(ks.dot(q_lds + r * DB, g)) * s2_scale;
      const float dp = group_sum<G>(vs.dot(do_lds + r * DB, g));
      const float p = recompute_p(s2, lse2_lds[r], visible);
      const float ds = p * (dp - delta_lds[r]);
      dvs.axpy(p, do_lds + r * DB, g);
      dks.axpy(ds, q_lds + r * DB, g);
    }
  }

  if (key_ok) {
    dks.store(dk + (bh * Tk + j) * D, D, g, vec_ok, scale);
    dvs.store(dv + (bh * Tk + j) * D, D, g, vec_ok, 1.0f);
  }
}

template <typename T, int DB>
__device__ __forceinline__ void bwd_dq(const T* __restrict__ q, const T* __restrict__ k,
                                       const T* __restrict__ v, const T* __restrict__ dout,
                                       const float* __restrict__ lse,
                                       const float* __restrict__ delta, T* __restrict__ dq, int Tq,
                                       int Tk, int D, float scale, int causal_flag) {
  using Cfg = BwdCfg<DB>;
  constexpr int G = Cfg::G;
  constexpr int BKV = Cfg::BKV;
  __shared__ float k_lds[BKV * DB];
  __shared__ float v_lds[BKV * DB];

  const bool causal = causal_flag != 0;
  const int tid = static_cast<int>(threadIdx.x);
  const int g = tid % G;
  const int tile = causal ? static_cast<int>(gridDim.x - 1 - blockIdx.x)
                          : static_cast<int>(blockIdx.x);
  const int q0 = tile * Cfg::ROWS;
  const int i = q0 + tid / G;
  const bool row_ok = i < Tq;
  const int64_t bh = blockIdx.y;
  const bool vec_ok = vec4_ok(q, D) && vec4_ok(k, D) && vec4_ok(v, D) && vec4_ok(dout, D) &&
                      vec4_ok(dq, D);

  const int64_t row = bh * Tq + (row_ok ? i : 0);
  Slice<DB, G> qs, dos, dqs;
  qs.load(q + row * D, row_ok, D, g, vec_ok, scale * kLog2e);
  dos.load(dout + row * D, row_ok, D, g, vec_ok, 1.0f);
  dqs.zero();
  const float lse2 = row_ok ? lse[row] * kLog2e : kNegInf;
  const float dlt = row_ok ? delta[row] : 0.0f;

  const int jmax = row_ok ? last_key(i, Tq, Tk, causal) : -1;
  const int kv_end = max(0, last_key(min(q0 + Cfg::ROWS, Tq) - 1, Tq, Tk, causal) + 1);
  const T* k_bh = k + bh * Tk * D;
  const T* v_bh = v + bh * Tk * D;
  for (int j0 = 0; j0 < kv_end; j0 += BKV) {
    __syncthreads();
    stage_rows<BKV, DB>(k_lds, k_bh, Tk, j0, D, vec_ok, tid);
    stage_rows<BKV, DB>(v_lds, v_bh, Tk, j0, D, vec_ok, tid);
    __syncthreads();
#pragma unroll 2
    for (int u = 0; u < BKV; ++u) {
      const float s2 = group_sum<G>(qs.dot(k_lds + u * DB, g));
      const float dp = group_sum<G>(dos.dot(v_lds + u * DB, g));
      const float p = recompute_p(s2, lse2, j0 + u <= jmax);
      dqs.axpy(p * (dp - dlt), k_lds + u * DB, g);
    }
  }

  if (row_ok) dqs.store(dq + (bh * Tq + i) * D, D, g, vec_ok, scale);
}

}  // namespace hipk_attn

// ---------------------------------------------------------------------------------------------
// Exported kernels
// ---------------------------------------------------------------------------------------------

#define HIPK_ATTN_KERNEL(NAME) extern "C" __global__ void __launch_bounds__(256, 2) NAME

#define HIPK_ATTN_FWD(DB, SUFFIX, T)                                                           \
  HIPK_ATTN_KERNEL(attention_fwd_d##DB##_##SUFFIX)                                             \
  (const T* q, const T* k, const T* v, T* out, float* lse, int Tq, int Tk, int D, float scale, \
   int causal) {                                                                               \
    hipk_attn::fwd<T, DB>(q, k, v, out, lse, Tq, Tk, D, scale, causal);                        \
  }

#define HIPK_ATTN_BWD(DB, SUFFIX, T)                                                          \
  HIPK_ATTN_KERNEL(attention_bwd_dkdv_d##DB##_##SUFFIX)                                       \
  (const T* q, const T* k, const T* v, const T* dout, const float* lse, const float* delta,   \
   T* dk, T* dv, int Tq, int Tk, int D, float scale, int causal) {                            \
    hipk_attn::bwd_dkdv<T, DB>(q, k, v, dout, lse, delta, dk, dv, Tq, Tk, D, scale, causal);  \
  }                                                                                           \
  HIPK_ATTN_KERNEL(attention_bwd_dq_d##DB##_##SUFFIX)                                         \
  (const T* q, const T* k, const T* v, const T* dout, const float* lse, const float* delta,   \
   T* dq, int Tq, int Tk, int D, float scale, int causal) {                                   \
    hipk_attn::bwd_dq<T, DB>(q, k, v, dout, lse, delta, dq, Tq, Tk, D, scale, causal);        \
  }

#define HIPK_ATTN_BUCKETS(SUFFIX, T)                                                       \
  HIPK_ATTN_FWD(32, SUFFIX, T) HIPK_ATTN_FWD(64, SUFFIX, T) HIPK_ATTN_FWD(96, SUFFIX, T)   \
  HIPK_ATTN_FWD(128, SUFFIX, T) HIPK_ATTN_BWD(32, SUFFIX, T) HIPK_ATTN_BWD(64, SUFFIX, T)  \
  HIPK_ATTN_BWD(96, SUFFIX, T) HIPK_ATTN_BWD(128, SUFFIX, T)                               \
  HIPK_ATTN_KERNEL(attention_bwd_dot_##SUFFIX)                                             \
  (const T* out, const T* dout, float* delta, int64_t rows, int D) {                       \
    hipk_attn::bwd_dot<T>(out, dout, delta, rows, D);                                      \
  }

HIPK_DTYPES(HIPK_ATTN_BUCKETS)
