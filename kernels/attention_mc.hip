// kernels/attention_mc.hip — FlashAttention-2 style attention on the matrix cores: forward and
// backward for f16 and bf16 storage, written once over the 16x16x16 tile multiply-accumulate of
// kernels/mc_tile.h (MFMA on CDNA, MMAC on Hygon's gfx928 and later; lane layout in
// kernels/mc_layout.h). Softmax statistics, accumulators and gradients in f32; the tile
// operands (q, k, v, dout, and p / ds rounded to the storage type) in f16 / bf16.
//
// NEVER RUN ON A GPU. Compiled for gfx90a with Debian's hipcc 5.2 (clang 15) and checked
// statically (`cargo xtask isa-mc`, docs/ISA-REPORT.md); compared with the CPU reference on
// hip-emu (which emulates the tile instruction with the MFMA layout), never on a device. The
// MMAC build needs DTK's hipcc (not available here): not compiled, not run; its lane roles
// follow mc_layout.h's ASSUMED MMAC accumulator layout. Without a 16x16x16 f16/bf16 tile
// (gfx906, gfx926) the kernels trap; the launcher (src/ops/attention/mc.rs) never picks them.
//
// Semantics, tensors, strides, grouped-query heads, cu_seqlens and the argument lists are those
// of kernels/attention.hip (same Strides / RowStrides structs, same SeqMap); the backward's
// delta pre-pass is attention.hip's attention_bwd_dot_<dtype>.
//
// Exported kernels (<db> = 64 or 128: head_dim 1..=64 runs in the 64 bucket, 65..=128 in the
// 128 bucket; columns past D are zero-filled on load and never stored):
//   attention_mc_fwd_d<db>[_varlen]_<dtype>   (attention_fwd_d<db>_<dtype>'s arguments)
//       grid (ceil(Tq / 128), H, B), block 512: 8 waves x 16 queries.
//   attention_mc_bwd_dkdv_d<db>_<dtype>       (attention_bwd_dkdv_d<db>_<dtype>'s arguments)
//       grid (ceil(Tk / 64), K, B), block 256: 4 waves x 16 keys.
//   attention_mc_bwd_dq_d<db>[_varlen]_<dtype> (attention_bwd_dq_d<db>_<dtype>'s arguments)
//       grid (ceil(Tq / 64), H, B), block 256: 4 waves x 16 queries.
// <dtype> in {f16, bf16}. No dynamic LDS.
//
// Lane roles. A wave owns 16 rows (queries in the forward and dq, keys in dkdv); lane l owns
// row l % 16 of every 16 x 16 score tile and 4 values of it along the other dimension
// (Lane::idx(l, 0..3): keys 4 (l / 16) + e with MFMA). With MFMA's accumulator layout (row
// 4 (l / 16) + e, column l % 16) that means computing tiles transposed — S^T = K Q^T, so the
// accumulator of S^T is, value for value, the B operand P^T of O^T = V^T P^T — and with MMAC's
// (row l % 16, column l / 16 + 4 e) computing them straight (S = Q K^T, O = P V; the logical
// k of a lane's 4 values is then l / 16 + 4 e, which the transposed LDS stages follow). Either
// way every accumulator a lane holds belongs to its own row, so the online softmax needs only a
// 4-lane reduction (lanes l ^ 16, l ^ 32) for the row maximum, the row sums stay per-lane
// partial sums until the end, and no score goes through LDS.
//
// Forward: block = 8 waves x 16 queries; the query operands (16 x DB per wave) stay in
// registers. K/V tiles of BKV keys (128 at d64, 64 at d128: 35 KiB of LDS either way, 2
// waves/SIMD): K row-major [BKV][DB + 8] and V transposed
// [DB][BKV + 8] in LDS (f16/bf16), staged global -> registers -> LDS; tile t + 1's global loads
// are issued right after tile t is in LDS, before its math. One online-softmax step per tile:
// S (DB / 16 x BKV / 16 tile MACs), the row max of the raw scores over the 4 lanes (q is
// negated for a negative scale, so c = |scale| log2 e > 0), p = exp2(s c - m) (one packed fma
// per two values) split into T hi + lo as the operands of O += P V, O rescaled by
// exp2(m_old - m_new). Tiles every query of the block sees whole run a loop without the mask
// (the hot loop `fwd_mc`); partial tiles (causal diagonal, sequence edges, past Tk) apply it
// per element. Causal: tiles past the block's last visible key are never loaded; heavy query
// tiles start first. lse = ln 2 (m + log2 l).
// Backward (deterministic, no atomics), with delta = rowsum(dout * out) from attention.hip's
// pre-pass:
//   dkdv: a wave owns 16 keys (k, v operands in registers; dk, dv accumulators, f32); the block
//     walks query tiles of BQ rows (q and dout row-major and transposed in LDS, lse and delta):
//     S = Q K^T and dP = dO V^T (as tiles with the lane's key as row), P = exp2(S' - lse'),
//     dS = P (dP - delta), dV += P^T dO, dK += dS^T Q; grouped-query heads: the block loops
//     over its group's query heads. Hot loop `dkdv_mc`.
//   dq: a wave owns 16 queries (q, dout operands in registers; dq accumulators); the block walks
//     key tiles of BKV rows (k row-major and transposed, v row-major in LDS): S, dP, dS as
//     above, dQ += dS K. Hot loop `dq_mc`.
// Each output element is written once by one thread. Causal: dkdv starts at the first query
// tile that sees its keys, dq stops after the last key tile its queries see.
//
// P and dS enter their tile MACs as hi + lo pairs (split4 in attention_mc.h: hi = x rounded
// toward zero to T, lo = x - hi rounded toward zero), so those products carry about twice T's
// significand (relative error below 2^-20 for f16, 2^-14 for bf16), far below the outputs'
// own rounding to T, at one more MFMA each.
//
// Per step, the lane's LDS offsets go through hipk::opaque so that each tile's offset folds
// into the ds_read immediate (hoisted, they took one v_add per read and a register each).
//
// Figures (gfx90a, hipcc 5.2 / clang 15, -O3; `cargo xtask isa-mc`, docs/ISA-REPORT.md,
// "Matrix-core attention (gfx90a)"; static, never measured): every kernel 0 scratch and 2-3
// waves/SIMD; hot-loop matrix busy 100 % (overlap model) everywhere; no overlap: forward
// 70.0-75.4 %, dq 69.9-74.9 %, dkdv 60.5-63.7 %; 0 spills: issue 35's targets, with thin
// margins at d64 (forward varlen 70.0 %, dkdv 60.5 %).

#include "attention_mc.h"

namespace hipk_attn_mc {

using hipk_attn::block_keys;
using hipk_attn::block_queries;
using hipk_attn::key_span;
using hipk_attn::KeyRange;
using hipk_attn::RowStrides;
using hipk_attn::Rows;
using hipk_attn::SeqMap;
using hipk_attn::stat_rows;
using hipk_attn::Strides;
using hipk_attn::kLn2;
using hipk_attn::kLog2e;

template <int DB> struct FwdCfg {
  static constexpr int WAVES = 8;  // 2 waves/SIMD (35 KiB of LDS)
  static constexpr int THREADS = 64 * WAVES;
  static constexpr int BQ = 16 * WAVES;  // queries per block
  // Keys per tile and softmax step: 128 at d64 halves the per-step costs (barriers, staging
  // addresses, the row max, O's rescale) per MFMA.
  static constexpr int BKV = DB == 128 ? 64 : 128;
};

/// Rounds x down / up to a multiple of m.
__device__ __forceinline__ int round_down(int x, int m) { return x / m * m; }
__device__ __forceinline__ int round_up(int x, int m) { return (x + m - 1) / m * m; }

/// The forward; see the file comment.
template <typename T, int DB, bool VARLEN>
__device__ __forceinline__ void fwd(const T* __restrict__ q, Strides qst, const T* __restrict__ k,
                                    Strides kst, const T* __restrict__ v, Strides vst,
                                    T* __restrict__ out, Strides ost, float* __restrict__ lse,
                                    RowStrides lst, int Tq, int Tk, int D, float scale,
                                    int causal_flag, int group, const int* __restrict__ cu,
                                    int ncu) {
  using Cfg = FwdCfg<DB>;
  using M = Mac<T>;
  using Vec = typename M::Vec;
  constexpr int BKV = Cfg::BKV;
  constexpr int NT = BKV / 16;  // key tiles per step
  constexpr int ND = DB / 16;   // head-dim tiles
  using KStage = Stage<T, BKV, DB, Cfg::THREADS, false>;
  using VStage = Stage<T, BKV, DB, Cfg::THREADS, true>;
  __shared__ __attribute__((aligned(16))) uint16_t sk[KStage::LDS];
  __shared__ __attribute__((aligned(16))) uint16_t sv[VStage::LDS];

  const bool causal = causal_flag != 0;
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 64;
  const int wave = tid / 64;
  const int tile = causal ? static_cast<int>(gridDim.x - 1 - blockIdx.x)
                          : static_cast<int>(blockIdx.x);
  const int q0 = tile * Cfg::BQ;
  const int qi = q0 + wave * 16 + lane % 16;  // this lane's query
  // The scores' factor c = scale log2 e, made positive by negating q (exact) when scale < 0,
  // so that max(s) c = max(s c) and each p takes one fma: exp2(s c - m). A zero scale becomes
  // the smallest normal float (every p then exp2(s * 1e-38 - m) = 1 to f32 precision, as with 0).
  const float c_signed = scale * kLog2e;
  const float c = fmaxf(fabsf(c_signed), __FLT_MIN__);

  // The query operands: row qi, columns 16 t + 4 (lane / 16) .. + 3.
  Vec qop[ND];
  load_own<T>(qop, Rows<const T>(q, qst), qi, qi < Tq, D, vec_ok<4>(q, qst), lane);
  if (c_signed < 0.0f) {
#pragma unroll
    for (int t = 0; t < ND; ++t) qop[t] = neg4(qop[t]);
  }

  const SeqMap sm(cu, VARLEN ? ncu : 0, Tq);  // no varlen code without VARLEN
  const int2 span = key_span(qi, Tq, Tk, causal, sm);
  const KeyRange keys = block_keys(q0, q0 + Cfg::BQ, Tq, Tk, causal, sm);
  const int kv_head = static_cast<int>(blockIdx.y) / group;  // grouped-query heads
  const Rows<const T> k_bh(k, kst, kv_head);
  const Rows<const T> v_bh(v, vst, kv_head);
  const bool kvec = vec_ok<8>(k, kst);
  const bool vvec = vec_ok<4>(v, vst);

  KStage ks;
  VStage vs;
  auto load_kv = [&](int j0, auto fast_tag) __attribute__((always_inline)) {
    constexpr bool FAST = decltype(fast_tag)::value;
    const int rows = Tk - j0;
    ks.template load<FAST>(k_bh.row(j0 < Tk ? j0 : 0), k_bh.seq, rows, D, kvec, tid);
    vs.template load<FAST>(v_bh.row(j0 < Tk ? j0 : 0), v_bh.seq, rows, D, vvec, tid);
  };
  // Every K/V tile whole (D == DB, rows aligned, small strides): with j + 2 BKV <= Tk, the
  // prefetch of tile j + BKV takes the unchecked loads.
  const bool fast_all = KStage::fast_ok(KStage::kMaxFastSeq, D, k_bh.seq, kvec) &&
                        VStage::fast_ok(VStage::kMaxFastSeq, D, v_bh.seq, vvec);

  f32x4 o[ND];
#pragma unroll
  for (int t = 0; t < ND; ++t) o[t] = f32x4{0.0f, 0.0f, 0.0f, 0.0f};
  const int bp32 = (lane ^ 32) << 2;  // quad_max_at's ds_bpermute address
  float m = kNegInf;  // running max of s * c over the lane's query
  float l = 0.0f;     // this lane's part of the running sum of exp2(s * c - m)

  // One tile of BKV keys at j0: stage it, prefetch the next, S, softmax, O += P V.
  auto step = [&](int j0, auto mask_tag, auto fast_tag) __attribute__((always_inline)) {
    constexpr bool MASK = decltype(mask_tag)::value;
    __syncthreads();  // every wave is done with the previous tile
    ks.store(sk, tid);
    vs.store(sv, tid);
    __syncthreads();
    load_kv(j0 + BKV, fast_tag);  // past the end: checked loads of nothing, or an unused tile
    hipk::sched_fence();
    // The lane's LDS offsets computed per step: the tile offsets then fold into the ds_read
    // immediates instead of 2 x ND x NT hoisted address registers re-added every step.
    int ln = lane;
    hipk::opaque(ln);
    f32x4 s[NT];
#pragma unroll
    for (int u = 0; u < NT; ++u) s[u] = f32x4{0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int t = 0; t < ND; ++t) {
#pragma unroll
      for (int u = 0; u < NT; ++u) {
        s[u] = Lane::mac<M>(lds_op<Vec>(sk, KStage::PITCH, 16 * u, 16 * t, ln), qop[t], s[u]);
      }
    }
    // The row max of the raw scores (c > 0), masked keys at -inf.
    float mx = kNegInf;
#pragma unroll
    for (int u = 0; u < NT; ++u) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if constexpr (MASK) {
          const int j = j0 + 16 * u + Lane::idx(lane, e);
          s[u][e] = j >= span.x && j <= span.y ? s[u][e] : kNegInf;
        }
        mx = fmaxf(mx, s[u][e]);
      }
    }
    const float m_new = fmaxf(m, quad_max_at(mx, bp32) * c);
    const float m_use = m_new == kNegInf ? 0.0f : m_new;  // no key yet: every p is 0
    const float alpha = hipk_attn::fast_exp2(m - m_use);
    m = m_new;
    Vec p[NT], plo[NT];
    // p = exp2(s c - m) (exp2(-inf) = 0 for masked keys), two values per packed fma / add.
    const f32x2 c2 = f32x2{c, c};
    const f32x2 m2 = f32x2{-m_use, -m_use};
    f32x2 sum2 = f32x2{0.0f, 0.0f};
#pragma unroll
    for (int u = 0; u < NT; ++u) {
      float pe[4];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const f32x2 x = f32x2{s[u][2 * i], s[u][2 * i + 1]} * c2 + m2;
        const f32x2 e2 = f32x2{hipk_attn::fast_exp2(x[0]), hipk_attn::fast_exp2(x[1])};
        sum2 += e2;
        pe[2 * i] = e2[0];
        pe[2 * i + 1] = e2[1];
      }
      split4<T>(pe, p[u], plo[u]);
    }
    const float sum = sum2[0] + sum2[1];
    l = __builtin_fmaf(l, alpha, sum);
#pragma unroll
    for (int t = 0; t < ND; ++t) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[t][e] *= alpha;
    }
#pragma unroll
    for (int t = 0; t < ND; ++t) {
#pragma unroll
      for (int u = 0; u < NT; ++u) {
        const Vec vop = lds_op<Vec>(sv, VStage::PITCH, 16 * t, 16 * u, ln);
        o[t] = Lane::mac<M>(vop, p[u], o[t]);
        o[t] = Lane::mac<M>(vop, plo[u], o[t]);
      }
    }
  };

  // Tiles [jb, ua) and [ub, je) are masked, [ua, ub) are seen whole by every query.
  const int jb = round_down(keys.begin, BKV);
  const int je = keys.end;
  int ua = max(jb, round_up(keys.full_begin, BKV));
  int ub = round_down(keys.full_end, BKV);
  if (ub <= ua) ua = ub = round_up(je, BKV);
  if (jb < je) load_kv(jb, std::false_type{});
  int j = jb;
  for (; j < min(ua, je); j += BKV) step(j, std::true_type{}, std::false_type{});
  HIPK_HOT_LOOP_BEGIN("fwd_mc");
  for (; j < ub && fast_all && j + 2 * BKV <= Tk; j += BKV) {
    step(j, std::false_type{}, std::true_type{});
  }
  HIPK_HOT_LOOP_END("fwd_mc");
  for (; j < ub; j += BKV) step(j, std::false_type{}, std::false_type{});
  for (; j < je; j += BKV) step(j, std::true_type{}, std::false_type{});

  const float lt = quad_sum(l);
  if (qi < Tq) {
    const float inv = lt > 0.0f ? 1.0f / lt : 0.0f;
    T* row = Rows<T>(out, ost).row(qi);
#pragma unroll
    for (int t = 0; t < ND; ++t) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int d = 16 * t + Lane::idx(lane, e);
        if (d < D) hipk::store_from_float(row, d, o[t][e] * inv);
      }
    }
    if (lane < 16) stat_rows(lse, lst)[qi] = lt > 0.0f ? (m + __log2f(lt)) * kLn2 : kNegInf;
  }
}

template <int DB> struct BwdCfg {
  static constexpr int THREADS = 256;
  static constexpr int ROWS = 64;                       // keys (dkdv) / queries (dq) per block
  static constexpr int DQ_BKV = DB == 128 ? 32 : 64;    // keys per LDS tile of dq
  static constexpr int DKDV_BQ = DB == 128 ? 16 : 32;   // queries per LDS tile of dkdv
  // Whether dkdv loads tile t + 1 into registers during tile t. Off in both buckets: each
  // step loads its own tile first. At d128 the 24 prefetch words would not fit 2 waves/SIMD
  // (dk's and dv's accumulators alone take 64); at d64 the prefetch (24 words, its uniform
  // addresses live across the step) cost 89 SGPR spills and a wave per SIMD (gfx90a,
  // static: 244 VGPRs, 2 waves, against 166 and 3 without it), and the order of the tiles is
  // then free, so the whole ones run first in one loop. Whether the third wave hides the load
  // latency as well as the prefetch did only a device can say.
  static constexpr bool DKDV_PREFETCH = false;
};

/// lse (natural log) as the exponent offset of exp2: lse * log2 e, and +inf for a row that
/// sees no key (lse = -inf) or does not exist, so that every p of it is exp2(-inf) = 0.
__device__ __forceinline__ float lse_offset(float lse, bool ok) {
  return ok && lse != kNegInf ? lse * kLog2e : __builtin_huge_valf();
}

/// dq; see the file comment.
template <typename T, int DB, bool VARLEN>
__device__ __forceinline__ void bwd_dq(const T* __restrict__ q, Strides qst,
                                       const T* __restrict__ k, Strides kst,
                                       const T* __restrict__ v, Strides vst,
                                       const T* __restrict__ dout, Strides dost,
                                       const float* __restrict__ lse,
                                       const float* __restrict__ delta, RowStrides lst,
                                       T* __restrict__ dq, Strides dqst, int Tq, int Tk, int D,
                                       float scale, int causal_flag, int group,
                                       const int* __restrict__ cu, int ncu) {
  using Cfg = BwdCfg<DB>;
  using M = Mac<T>;
  using Vec = typename M::Vec;
  constexpr int BKV = Cfg::DQ_BKV;
  constexpr int NT = BKV / 16;
  constexpr int ND = DB / 16;
  using KStage = Stage<T, BKV, DB, Cfg::THREADS, false>;
  using KtStage = Stage<T, BKV, DB, Cfg::THREADS, true>;
  __shared__ __attribute__((aligned(16))) uint16_t sk[KStage::LDS];
  __shared__ __attribute__((aligned(16))) uint16_t skt[KtStage::LDS];
  __shared__ __attribute__((aligned(16))) uint16_t sv[KStage::LDS];

  const bool causal = causal_flag != 0;
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 64;
  const int wave = tid / 64;
  const int tile = causal ? static_cast<int>(gridDim.x - 1 - blockIdx.x)
                          : static_cast<int>(blockIdx.x);
  const int q0 = tile * Cfg::ROWS;
  const int qi = q0 + wave * 16 + lane % 16;  // this lane's query
  const bool ok = qi < Tq;
  const float c = scale * kLog2e;

  Vec qop[ND], dop[ND];
  load_own<T>(qop, Rows<const T>(q, qst), qi, ok, D, vec_ok<4>(q, qst), lane);
  load_own<T>(dop, Rows<const T>(dout, dost), qi, ok, D, vec_ok<4>(dout, dost), lane);
  const float lse2 = lse_offset(ok ? stat_rows(lse, lst)[qi] : kNegInf, ok);
  const float dlt = ok ? stat_rows(delta, lst)[qi] : 0.0f;

  const SeqMap sm(cu, VARLEN ? ncu : 0, Tq);
  const int2 span = key_span(qi, Tq, Tk, causal, sm);
  const KeyRange keys = block_keys(q0, q0 + Cfg::ROWS, Tq, Tk, causal, sm);
  const int kv_head = static_cast<int>(blockIdx.y) / group;
  const Rows<const T> k_bh(k, kst, kv_head);
  const Rows<const T> v_bh(v, vst, kv_head);
  const bool k8 = vec_ok<8>(k, kst);
  const bool k4 = vec_ok<4>(k, kst);
  const bool v8 = vec_ok<8>(v, vst);

  KStage ks, vs;
  KtStage kts;
  auto load_kv = [&](int j0, auto fast_tag) __attribute__((always_inline)) {
    constexpr bool FAST = decltype(fast_tag)::value;
    const int rows = Tk - j0;
    const T* kr = k_bh.row(j0 < Tk ? j0 : 0);
    ks.template load<FAST>(kr, k_bh.seq, rows, D, k8, tid);
    kts.template load<FAST>(kr, k_bh.seq, rows, D, k4, tid);
    vs.template load<FAST>(v_bh.row(j0 < Tk ? j0 : 0), v_bh.seq, rows, D, v8, tid);
  };
  const bool fast_all = KStage::fast_ok(KStage::kMaxFastSeq, D, k_bh.seq, k8) &&
                        KtStage::fast_ok(KtStage::kMaxFastSeq, D, k_bh.seq, k4) &&
                        KStage::fast_ok(KStage::kMaxFastSeq, D, v_bh.seq, v8);

  f32x4 acc[ND];
#pragma unroll
  for (int t = 0; t < ND; ++t) acc[t] = f32x4{0.0f, 0.0f, 0.0f, 0.0f};

  auto step = [&](int j0, auto mask_tag, auto fast_tag) __attribute__((always_inline)) {
    constexpr bool MASK = decltype(mask_tag)::value;
    __syncthreads();
    ks.store(sk, tid);
    kts.store(skt, tid);
    vs.store(sv, tid);
    __syncthreads();
    load_kv(j0 + BKV, fast_tag);
    hipk::sched_fence();
    int ln = lane;  // per step: the tile offsets fold into the ds_read immediates (see fwd)
    hipk::opaque(ln);
    f32x4 s[NT], dp[NT];
#pragma unroll
    for (int u = 0; u < NT; ++u) {
      s[u] = f32x4{0.0f, 0.0f, 0.0f, 0.0f};
      dp[u] = f32x4{0.0f, 0.0f, 0.0f, 0.0f};
    }
#pragma unroll
    for (int t = 0; t < ND; ++t) {
#pragma unroll
      for (int u = 0; u < NT; ++u) {
        s[u] = Lane::mac<M>(lds_op<Vec>(sk, KStage::PITCH, 16 * u, 16 * t, ln), qop[t], s[u]);
        dp[u] = Lane::mac<M>(lds_op<Vec>(sv, KStage::PITCH, 16 * u, 16 * t, ln), dop[t], dp[u]);
      }
    }
    Vec ds[NT], dslo[NT];
#pragma unroll
    for (int u = 0; u < NT; ++u) {
      float d4[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float p = hipk_attn::fast_exp2(__builtin_fmaf(s[u][e], c, -lse2));
        if constexpr (MASK) {
          const int j = j0 + 16 * u + Lane::idx(lane, e);
          p = j >= span.x && j <= span.y ? p : 0.0f;
        }
        d4[e] = p * (dp[u][e] - dlt);
      }
      split4<T>(d4, ds[u], dslo[u]);
    }
#pragma unroll
    for (int t = 0; t < ND; ++t) {
#pragma unroll
      for (int u = 0; u < NT; ++u) {
        const Vec kop = lds_op<Vec>(skt, KtStage::PITCH, 16 * t, 16 * u, ln);
        acc[t] = Lane::mac<M>(kop, ds[u], acc[t]);
        acc[t] = Lane::mac<M>(kop, dslo[u], acc[t]);
      }
    }
  };

  const int jb = round_down(keys.begin, BKV);
  const int je = keys.end;
  int ua = max(jb, round_up(keys.full_begin, BKV));
  int ub = round_down(keys.full_end, BKV);
  if (ub <= ua) ua = ub = round_up(je, BKV);
  if (jb < je) load_kv(jb, std::false_type{});
  int j = jb;
  for (; j < min(ua, je); j += BKV) step(j, std::true_type{}, std::false_type{});
  HIPK_HOT_LOOP_BEGIN("dq_mc");
  for (; j < ub && fast_all && j + 2 * BKV <= Tk; j += BKV) {
    step(j, std::false_type{}, std::true_type{});
  }
  HIPK_HOT_LOOP_END("dq_mc");
  for (; j < ub; j += BKV) step(j, std::false_type{}, std::false_type{});
  for (; j < je; j += BKV) step(j, std::true_type{}, std::false_type{});

  if (ok) {
    T* row = Rows<T>(dq, dqst).row(qi);
#pragma unroll
    for (int t = 0; t < ND; ++t) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int d = 16 * t + Lane::idx(lane, e);
        if (d < D) hipk::store_from_float(row, d, acc[t][e] * scale);
      }
    }
  }
}

/// dk and dv; see the file comment.
template <typename T, int DB>
__device__ __forceinline__ void bwd_dkdv(const T* __restrict__ q, Strides qst,
                                         const T* __restrict__ k, Strides kst,
                                         const T* __restrict__ v, Strides vst,
                                         const T* __restrict__ dout, Strides dost,
                                         const float* __restrict__ lse,
                                         const float* __restrict__ delta, RowStrides lst,
                                         T* __restrict__ dk, Strides dks, T* __restrict__ dv,
                                         Strides dvs, int Tq, int Tk, int D, float scale,
                                         int causal_flag, int group, const int* __restrict__ cu,
                                         int ncu) {
  using Cfg = BwdCfg<DB>;
  using M = Mac<T>;
  using Vec = typename M::Vec;
  constexpr int BQ = Cfg::DKDV_BQ;
  constexpr int NU = BQ / 16;
  constexpr int ND = DB / 16;
  using QStage = Stage<T, BQ, DB, Cfg::THREADS, false>;
  using QtStage = Stage<T, BQ, DB, Cfg::THREADS, true>;
  __shared__ __attribute__((aligned(16))) uint16_t sq[QStage::LDS];
  __shared__ __attribute__((aligned(16))) uint16_t sqt[QtStage::LDS];
  __shared__ __attribute__((aligned(16))) uint16_t sdo[QStage::LDS];
  __shared__ __attribute__((aligned(16))) uint16_t sdot[QtStage::LDS];
  __shared__ float slse[BQ];
  __shared__ float sdl[BQ];

  const bool causal = causal_flag != 0;
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 64;
  const int wave = tid / 64;
  const int k0 = static_cast<int>(blockIdx.x) * Cfg::ROWS;
  const int kj = k0 + wave * 16 + lane % 16;  // this lane's key
  const bool key_ok = kj < Tk;
  const float c = scale * kLog2e;
  // This lane's rows of dk and dv, computed now and held in 4 VGPRs through the loops: dk's
  // and dv's pointers and strides held in SGPRs until the end were spilled.
  T* rk = Rows<T>(dk, dks).row(key_ok ? kj : 0);
  T* rv = Rows<T>(dv, dvs).row(key_ok ? kj : 0);
  in_vgprs(rk);
  in_vgprs(rv);

  // k, v: key/value head blockIdx.y; q, dout, lse, delta: its group's query heads.
  Vec kop[ND], vop[ND];
  load_own<T>(kop, Rows<const T>(k, kst), kj, key_ok, D, vec_ok<4>(k, kst), lane);
  load_own<T>(vop, Rows<const T>(v, vst), kj, key_ok, D, vec_ok<4>(v, vst), lane);

  const SeqMap sm(cu, ncu, Tq);
  // The queries that see this lane's key: [qlo, qhi).
  int qlo, qhi;
  if (sm.on()) {
    const int2 sj = sm.seq(kj);
    qlo = causal ? max(sj.x, kj) : sj.x;
    qhi = key_ok ? sj.y : 0;
  } else {
    qlo = causal ? kj - (Tk - Tq) : 0;
    qhi = key_ok ? Tq : 0;
  }
  // The queries of the block's tiles: [qb, qe); those that see every key of the block:
  // [fb, fe) (none when fe <= fb).
  const int k1 = min(k0 + Cfg::ROWS, Tk);
  const int2 qr = block_queries(k0, k1, Tq, Tk, causal, sm);
  int fb = 0, fe = 0;
  if (k0 + Cfg::ROWS <= Tk) {
    if (!sm.on()) {
      fb = causal ? max(0, k1 - 1 - (Tk - Tq)) : 0;
      fe = Tq;
    } else {
      const int2 s0 = sm.seq(k0);
      const int2 s1 = sm.seq(k1 - 1);
      if (s0.x == s1.x && s0.y == s1.y && s0.y > s0.x) {
        fb = causal ? k1 - 1 : s0.x;
        fe = s0.y;
      }
    }
  }
  const bool q8 = vec_ok<8>(q, qst);
  const bool q4 = vec_ok<4>(q, qst);
  const bool d8 = vec_ok<8>(dout, dost);
  const bool d4 = vec_ok<4>(dout, dost);

  QStage qs, dos;
  QtStage qts, dots;
  float st_lse = 0.0f, st_dl = 0.0f;
  f32x4 acc_k[ND], acc_v[ND];
#pragma unroll
  for (int t = 0; t < ND; ++t) {
    acc_k[t] = f32x4{0.0f, 0.0f, 0.0f, 0.0f};
    acc_v[t] = f32x4{0.0f, 0.0f, 0.0f, 0.0f};
  }

  for (int g = 0; g < group; ++g) {
    const int head = static_cast<int>(blockIdx.y) * group + g;
    const Rows<const T> q_bh(q, qst, head);
    const Rows<const T> do_bh(dout, dost, head);
    const float* lse_h = stat_rows(lse, lst, head);
    const float* dl_h = stat_rows(delta, lst, head);
    const bool fast_all = QStage::fast_ok(QStage::kMaxFastSeq, D, q_bh.seq, q8) &&
                          QtStage::fast_ok(QtStage::kMaxFastSeq, D, q_bh.seq, q4) &&
                          QStage::fast_ok(QStage::kMaxFastSeq, D, do_bh.seq, d8) &&
                          QtStage::fast_ok(QtStage::kMaxFastSeq, D, do_bh.seq, d4);
    auto load_q = [&](int i0, auto fast_tag) __attribute__((always_inline)) {
      constexpr bool FAST = decltype(fast_tag)::value;
      const int rows = Tq - i0;
      const T* qr0 = q_bh.row(i0 < Tq ? i0 : 0);
      const T* dr0 = do_bh.row(i0 < Tq ? i0 : 0);
      qs.template load<FAST>(qr0, q_bh.seq, rows, D, q8, tid);
      qts.template load<FAST>(qr0, q_bh.seq, rows, D, q4, tid);
      dos.template load<FAST>(dr0, do_bh.seq, rows, D, d8, tid);
      dots.template load<FAST>(dr0, do_bh.seq, rows, D, d4, tid);
      const int i = i0 + tid;
      const bool row_ok = tid < BQ && i < Tq;
      st_lse = lse_offset(row_ok ? lse_h[i] : kNegInf, row_ok);
      st_dl = row_ok ? dl_h[i] : 0.0f;
    };

    auto step = [&](int i0, auto mask_tag, auto fast_tag) __attribute__((always_inline)) {
      constexpr bool MASK = decltype(mask_tag)::value;
      __syncthreads();
      if constexpr (!Cfg::DKDV_PREFETCH) load_q(i0, fast_tag);
      qs.store(sq, tid);
      qts.store(sqt, tid);
      dos.store(sdo, tid);
      dots.store(sdot, tid);
      if (tid < BQ) {
        slse[tid] = st_lse;
        sdl[tid] = st_dl;
      }
      __syncthreads();
      if constexpr (Cfg::DKDV_PREFETCH) {
        load_q(i0 + BQ, fast_tag);
        hipk::sched_fence();
      }
      int ln = lane;  // per step: the tile offsets fold into the ds_read immediates (see fwd)
      hipk::opaque(ln);
#pragma unroll
      for (int u = 0; u < NU; ++u) {
        f32x4 s = f32x4{0.0f, 0.0f, 0.0f, 0.0f};
        f32x4 dp = f32x4{0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int t = 0; t < ND; ++t) {
          s = Lane::mac<M>(lds_op<Vec>(sq, QStage::PITCH, 16 * u, 16 * t, ln), kop[t], s);
          dp = Lane::mac<M>(lds_op<Vec>(sdo, QStage::PITCH, 16 * u, 16 * t, ln), vop[t], dp);
        }
        float pe[4], dse[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = 16 * u + Lane::idx(lane, e);
          float p = hipk_attn::fast_exp2(__builtin_fmaf(s[e], c, -slse[r]));
          if constexpr (MASK) {
            const int i = i0 + r;
            p = i >= qlo && i < qhi ? p : 0.0f;
          }
          pe[e] = p;
          dse[e] = p * (dp[e] - sdl[r]);
        }
        Vec pv, pvlo, dsv, dsvlo;
        split4<T>(pe, pv, pvlo);
        split4<T>(dse, dsv, dsvlo);
#pragma unroll
        for (int t = 0; t < ND; ++t) {
          const Vec dot = lds_op<Vec>(sdot, QtStage::PITCH, 16 * t, 16 * u, ln);
          const Vec qt = lds_op<Vec>(sqt, QtStage::PITCH, 16 * t, 16 * u, ln);
          acc_v[t] = Lane::mac<M>(dot, pv, acc_v[t]);
          acc_v[t] = Lane::mac<M>(dot, pvlo, acc_v[t]);
          acc_k[t] = Lane::mac<M>(qt, dsv, acc_k[t]);
          acc_k[t] = Lane::mac<M>(qt, dsvlo, acc_k[t]);
        }
      }
    };

    const int ib = round_down(qr.x, BQ);
    const int ie = qr.y;
    int ua = max(ib, round_up(fb, BQ));
    int ub = round_down(fe, BQ);
    if (ub <= ua) ua = ub = round_up(ie, BQ);
    if constexpr (Cfg::DKDV_PREFETCH) {
      // Tile order fixed by the prefetch: [ib, ua) masked, the whole tiles, the rest masked
      // (exact for whole tiles too).
      if (ib < ie) load_q(ib, std::false_type{});
      int i = ib;
      for (; i < min(ua, ie); i += BQ) step(i, std::true_type{}, std::false_type{});
      HIPK_HOT_LOOP_BEGIN("dkdv_mc");
      for (; i < ub && fast_all && i + 2 * BQ <= Tq; i += BQ) {
        step(i, std::false_type{}, std::true_type{});
      }
      HIPK_HOT_LOOP_END("dkdv_mc");
      for (; i < ie; i += BQ) step(i, std::true_type{}, std::false_type{});
    } else {
      // Each step loads its own tile, so the order is free: the whole tiles first (a step's
      // tile is whole when fast_all and it ends by Tq), then the others of [ib, ie) in one
      // masked loop that skips [ua, hot_end).
      int i = ua;
      if (fast_all && i < ub && i + BQ <= Tq) {
        // The marker in the loop's own preheader: laid out right before the loop.
        HIPK_HOT_LOOP_BEGIN("dkdv_mc");
        do {
          step(i, std::false_type{}, std::true_type{});
          i += BQ;
        } while (i < ub && i + BQ <= Tq);
        HIPK_HOT_LOOP_END("dkdv_mc");
      }
      const int hot_end = i;
      for (int r = ib == ua ? hot_end : ib; r < ie;) {
        step(r, std::true_type{}, std::false_type{});
        r += BQ;
        if (r == ua) r = hot_end;
      }
    }
  }

  if (key_ok) {
#pragma unroll
    for (int t = 0; t < ND; ++t) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int d = 16 * t + Lane::idx(lane, e);
        if (d < D) {
          hipk::store_from_float(rk, d, acc_k[t][e] * scale);
          hipk::store_from_float(rv, d, acc_v[t][e]);
        }
      }
    }
  }
}

}  // namespace hipk_attn_mc

// ---------------------------------------------------------------------------------------------
// Exported kernels
// ---------------------------------------------------------------------------------------------

#if HIPK_MC_HAVE_F16
#define HIPK_ATTN_MC_BODY(CALL) CALL;
#else
#define HIPK_ATTN_MC_BODY(CALL) __builtin_trap();
#endif

#define HIPK_ATTN_MC_FWD_V(DB, VARIANT, VARLEN, SUFFIX, T)                                    \
  extern "C" __global__ void __launch_bounds__(hipk_attn_mc::FwdCfg<DB>::THREADS, 2)          \
      attention_mc_fwd_d##DB##VARIANT##_##SUFFIX(                                             \
          const T* q, hipk_attn::Strides qs, const T* k, hipk_attn::Strides ks, const T* v,   \
          hipk_attn::Strides vs, T* out, hipk_attn::Strides os, float* lse,                   \
          hipk_attn::RowStrides ls, int Tq, int Tk, int D, float scale, int causal, int group, \
          const int* cu, int ncu) {                                                           \
    HIPK_ATTN_MC_BODY((hipk_attn_mc::fwd<T, DB, VARLEN>(q, qs, k, ks, v, vs, out, os, lse, ls, \
                                                        Tq, Tk, D, scale, causal, group, cu,  \
                                                        ncu)))                                \
  }

#define HIPK_ATTN_MC_FWD(DB, SUFFIX, T)                                                       \
  HIPK_ATTN_MC_FWD_V(DB, , false, SUFFIX, T) HIPK_ATTN_MC_FWD_V(DB, _varlen, true, SUFFIX, T)

#define HIPK_ATTN_MC_DQ(DB, VARIANT, VARLEN, SUFFIX, T)                                       \
  extern "C" __global__ void __launch_bounds__(256, 2) attention_mc_bwd_dq_d##DB##VARIANT##_##SUFFIX( \
      const T* q, hipk_attn::Strides qs, const T* k, hipk_attn::Strides ks, const T* v,         \
      hipk_attn::Strides vs, const T* dout, hipk_attn::Strides dos, const float* lse,           \
      const float* delta, hipk_attn::RowStrides ls, T* dq, hipk_attn::Strides dqs, int Tq,      \
      int Tk, int D, float scale, int causal, int group, const int* cu, int ncu) {              \
    HIPK_ATTN_MC_BODY((hipk_attn_mc::bwd_dq<T, DB, VARLEN>(q, qs, k, ks, v, vs, dout, dos, lse, \
                                                           delta, ls, dq, dqs, Tq, Tk, D,       \
                                                           scale, causal, group, cu, ncu)))     \
  }

#define HIPK_ATTN_MC_BWD(DB, SUFFIX, T)                                                       \
  extern "C" __global__ void __launch_bounds__(256, 2) attention_mc_bwd_dkdv_d##DB##_##SUFFIX(   \
      const T* q, hipk_attn::Strides qs, const T* k, hipk_attn::Strides ks, const T* v,       \
      hipk_attn::Strides vs, const T* dout, hipk_attn::Strides dos, const float* lse,         \
      const float* delta, hipk_attn::RowStrides ls, T* dk, hipk_attn::Strides dks, T* dv,     \
      hipk_attn::Strides dvs, int Tq, int Tk, int D, float scale, int causal, int group,      \
      const int* cu, int ncu) {                                                               \
    HIPK_ATTN_MC_BODY((hipk_attn_mc::bwd_dkdv<T, DB>(q, qs, k, ks, v, vs, dout, dos, lse,     \
                                                     delta, ls, dk, dks, dv, dvs, Tq, Tk, D,  \
                                                     scale, causal, group, cu, ncu)))         \
  }                                                                                           \
  HIPK_ATTN_MC_DQ(DB, , false, SUFFIX, T) HIPK_ATTN_MC_DQ(DB, _varlen, true, SUFFIX, T)

#define HIPK_ATTN_MC_ALL(SUFFIX, T)                                                           \
  HIPK_ATTN_MC_FWD(64, SUFFIX, T) HIPK_ATTN_MC_FWD(128, SUFFIX, T)                            \
  HIPK_ATTN_MC_BWD(64, SUFFIX, T) HIPK_ATTN_MC_BWD(128, SUFFIX, T)

HIPK_ATTN_MC_ALL(f16, __half)
HIPK_ATTN_MC_ALL(bf16, ::hipk::bf16)
