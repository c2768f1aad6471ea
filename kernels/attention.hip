// kernels/attention.hip — FlashAttention-2 style attention, forward and backward.
//
// NEVER RUN ON A GPU. Compiled and resource-checked for gfx906 only (hipcc 5.2 / clang 15,
// --genco -O3, -Rpass-analysis=kernel-resource-usage); compared with the CPU reference on
// hip-emu (the CPU emulation of a device: tests/device_matmul_attention.rs,
// tests/device_attention_strided.rs), never on a device.
//
// Tensors are strided: row (b, h, t) of q, k, v, out, dout, dq, dk, dv (its D elements
// contiguous) starts at ptr + b * batch + h * head + t * seq (int64 element strides, struct
// Strides, one per tensor; the launcher folds the layout's offset and the launch's first batch
// and head into ptr and passes 0 for a dimension of extent 1). Packed [B, H, T, D] is one case;
// the fused QKV projection [B, T, 3, H, D] (q, k, v and dq, dk, dv) and out [B, T, H, D] are
// others. lse and delta are [B, H, Tq] f32 (struct RowStrides). Vector (16-byte for f32) loads
// and stores when a tensor's pointer and strides are multiples of 4 elements; scalar otherwise.
// Storage f32 / f16 / bf16, all math f32.
// Semantics (= the CPU reference): s_ij = scale * q_i . k_j; key j is visible to query i iff
// j < Tk and, when causal, j <= i + Tk - Tq (bottom-right aligned); out_i = softmax_j(s_i) v;
// lse_i = ln sum_j exp(s_ij) (natural log). A row that sees no key gets out = 0, lse = -inf and
// zero gradients; a key no query sees gets dk = dv = 0.
// Grouped-query heads: query head h reads key/value head h / group (group = H / K); k, v, dk,
// dv have K heads. Variable length (cu != null): cu holds ncu sequence starts per batch row
// (SeqMap in attention.h; Tq = Tk); query i sees the keys of its own sequence only (causal:
// j <= i), positions outside [cu[0], cu[ncu - 1]) are padding (out = 0, lse = -inf, zero
// gradients). cu == null, ncu == 0: the bottom-right aligned mask above.
//
// Exported kernels (<db> = head-dim bucket 32, 64, 96 or 128: the smallest >= D; D itself may be
// anything in 1..=128, columns past D are zero-filled on load and never stored):
// (every tensor pointer X is followed by its Strides Xs; lse/delta by one RowStrides ls)
// (every kernel but bwd_dot ends with group, cu, ncu: written `...` below)
//   attention_fwd_d<db>_<dtype>(q, qs, k, ks, v, vs, out, os, lse, ls, Tq, Tk, D, scale, causal,
//                               ...)
//       grid (ceil(Tq / FROWS), H, B), block 256; FROWS = 128 for db <= 64, else 64
//       (the d64 _varlen kernel: 64).
//   attention_bwd_dot_<dtype>(out, os, dout, dos, delta, ls, Tq, D)
//       delta_i = sum_d dout_id * out_id; grid (ceil(Tq / 16), H, B), block 256 (16 lanes/row).
//   attention_bwd_dkdv_d<db>_<dtype>(q, qs, k, ks, v, vs, dout, dos, lse, delta, ls, dk, dks,
//                                    dv, dvs, Tq, Tk, D, scale, causal, ...)
//       grid (ceil(Tk / KROWS), K, B), block 256; KROWS = 256 / G_BWD (64 for db <= 64, else 32).
//       q, dout, lse, delta point at query head 0 of the launch's first key/value head; the
//       block loops over its group's query heads, summing dk, dv in registers (deterministic).
//   attention_bwd_dq_d<db>_<dtype>(q, qs, k, ks, v, vs, dout, dos, lse, delta, ls, dq, dqs, Tq,
//                                  Tk, D, scale, causal, ...)
//       grid (ceil(Tq / QROWS), H, B), block 256; QROWS = 64 for db <= 64, else 32.
//   attention_fwd_d<db>_varlen_<dtype>, attention_bwd_dq_d<db>_varlen_<dtype>: the same
//       arguments and grids; the launcher calls these when cu_seqlens is given. The kernels
//       without _varlen ignore cu and ncu (no varlen code is compiled into them).
// causal is 0 or 1. No dynamic LDS. H, B <= 65535 per launch (grid.y, grid.z).
//
// Work layout ("lane groups"): G consecutive lanes own one row (a key in dkdv, a query in dq;
// the forward's groups own QPT queries, below). Lane g of a group holds 4-wide chunks c*G + g of
// the row (c < DB / (4G)), so the G lanes of a group read 4G consecutive floats of an LDS row: no
// bank conflicts, and all groups of a wave read the same LDS row at the same time (broadcast).
// In the backward a dot product is a per-lane partial sum plus a G-lane butterfly (DPP: quad
// permutes inside 4 lanes, row_half_mirror for 8), after which every lane of the group holds the
// full value, so the softmax bookkeeping needs no further communication. Wave-size agnostic: G
// divides 32 and 64 (DPP row operations stay inside 16 lanes).
//
// Forward: each lane group of G lanes owns QPT consecutive queries (d32: G 4, QPT 2; d64: 8, 4;
// d96: 8, 2; d128: 16, 4: 8 columns per lane, 12 at d96; 128 queries per block up to db 64, 64
// above), held pre-scaled by scale * log2 e with their output accumulators in registers. Every
// float4 read from LDS feeds QPT * 4 FMAs (one per query: 4 FMAs per LDS float at d64/d128).
// The scores are spread over the group instead of being repeated in every lane (Spread): lane g
// holds its queries in a permuted order (slot r = row r ^ tq(g)) and reads the keys of a step in
// a permuted order (u ^ tk(g)), so that a DPP reduce-scatter (per key over the query levels as
// soon as the key's partial sums are complete, then over the key levels) leaves each lane
// N / G complete scores of its own (N = QPT * KC per step); the exp and the mask are paid once
// per score, and a DPP all-gather returns every lane all N probabilities for p * V. Each K/V
// tile (BKV x DB of K and of V in LDS as f32) takes two passes of KC-key steps: pass 1 computes
// the scores and keeps each lane's own ones in its private column of sc_lds with their running
// max; then, once per tile, the online softmax (m = max(m, tile max) for every query, acc and l
// rescaled: no branch); pass 2 turns the kept scores into p and accumulates p * V. Both passes
// read one float4 ahead, across steps too (the last item of a step reads the next step's first
// item; the tile and sc_lds carry one step of padding for the read past the last step), and
// pass 1 stores a step's scores during the next step's stream, ahead of that read-ahead (LDS
// waits count in order): no LDS wait is exposed. out is normalised once at the end; lse =
// ln 2 * (m + log2 l). K/V tile t+1 is loaded (raw words; a scalar-base global_load with 32-bit
// offsets when the tile is whole, D = db, rows aligned and seq * sizeof(T) * rows < 2^32) before
// tile t is used and written to LDS after it: the global latency hides behind a tile of math.
// Tiles every query of the block sees whole skip the per-key mask (a separate loop). No Tq x Tk
// matrix exists anywhere. With causal, the tiles past the block's last visible key are never
// loaded (for Tq = Tk about half of them); heavy query tiles start first.
// Backward (deterministic, no atomics): the dot pre-pass computes delta = rowsum(dout * out);
// the dkdv kernel owns KROWS keys (k, v, dk, dv in registers) and walks the query tiles (q and
// dout staged in LDS, with lse and delta) recomputing p = exp(s - lse); the dq kernel owns
// QROWS queries (q, dout, dq in registers) and walks the key tiles. At d64 / d128 the dq
// kernel's groups own 2 queries each (8 / 16 lanes, 8 columns per lane) and spread the scores
// and dp like the forward: one step of KC keys streams K (scores), V (dp) and K again
// (dq += ds k), every float read feeding 2 FMAs, with the exp once per score and no exposed LDS
// wait; d32 / d96 keep one query per group with the butterfly. Each output element is
// written once by one thread. Causal: the dkdv kernel starts at the first query tile that can
// see its keys, the dq kernel stops after the last key tile its queries can see.
//
// Tiles and LDS (256 threads = 4 wave64):
//   fwd      G / QPT as above; BKV = 16 (8 at db 128); KC = 8 (db 32) or 4.
//   dkdv     G = 4 (db <= 64) or 8; query tile 64 / 32 / 16 / 16 rows (db 32 / 64 / 96 / 128).
//   dq       G = 4 / 8 / 8 / 16, 1 / 2 / 1 / 2 queries per group; key tile 64 / 64 / 16 / 32
//            rows (db 96: 16, for 3 blocks per CU); KC = G / QPT keys per step at d64 / d128.
// Every kernel keeps LDS <= 32 KiB and VGPRs <= 128 (__launch_bounds__(256, 2)), i.e. at
// least 2 blocks = 2 waves per SIMD on a 64 KiB CU.
// gfx906 resource figures (cargo xtask isa-report, hipcc 5.2 / clang 15, -O3; docs/ISA-REPORT.md
// has every dtype), f32 (f16 / bf16 within -8..+1 VGPRs); every kernel: scratch 0, spills 0:
//   kernel      d32               d64               d96               d128
//   fwd         84 V  21504 B  3  121 V 21504 B  2  114 V 19968 B  2  126 V 14336 B  2
//   bwd_dkdv    69 V  16896 B  3  119 V 16640 B  2  94 V  12416 B  2  119 V 16512 B  2
//   bwd_dq      55 V  16384 B  4  90 V  32768 B  2  73 V  12288 B  3  116 V 32768 B  2
//   bwd_dot     29 V, no LDS, occupancy 8
// (V = VGPRs, B = LDS bytes per block, last = occupancy in waves/SIMD.)
// Static hot-loop figures of the forward (loops fwd_qk = pass 1 and fwd_pv = pass 2 of one
// KC-key step of an unmasked tile), issue-bound estimate of the FMA peak, all dtypes:
//   fwd_qk  d32 85.9 %, d64 87.7 %, d96 87.3 %, d128 82.1 %
//   fwd_pv  d32 75.3 %, d64 81.5 %, d96 84.2 %, d128 81.0 %
// LDS bytes per FMA 1.00 (qk) and 1.06 / 1.03 (pv: the read-back of the owned scores) at d64 /
// d128, i.e. 4 FMAs per K or V float; 2.0-2.1 at d32 / d96 (QPT = 2). No blocking LDS wait (d32
// pv: one). What remains: the DPP reduce-scatter and all-gather (about one DPP per score per
// lane each way) against 8 FMAs per score per lane and pass.
// Backward dq (loop dq_step, one KC-key step): d64 82.4 %, d128 83.5 %, 2.0 B of LDS per FMA,
// no blocking wait (before: 72.2 % / 70.1 %, 2.67 B, 7 blocking waits); dkdv (no marker, the
// per-query loop): d64 76.5 %, d128 74.7 %. Performance: never measured; all figures static.

#include "attention.h"
#include "common.h"
#include "tile_io.h"

#include <type_traits>

namespace hipk_attn {

template <int DB, bool VARLEN> struct FwdCfg {
  // Lanes per group: 8 columns of each query per lane (d96: 12).
  static constexpr int G = DB == 32 ? 4 : (DB == 128 ? 16 : 8);
  // Queries per lane group. The d64 varlen forward takes 2: with 4 its key spans need more
  // than the 128 VGPRs of 2 waves/SIMD.
  static constexpr int QPT = (DB == 64 && !VARLEN) || DB == 128 ? 4 : 2;
  // Queries per block: 128 (db <= 64; d64 varlen: 64) or 64.
  static constexpr int ROWS = kThreads / G * QPT;
  // Keys per LDS tile: the next tile waits in registers (BKV * DB * 2 / 256 f32 words per
  // thread), so it stays small.
  static constexpr int BKV = DB == 128 ? 8 : 16;
  static constexpr int KC = DB == 32 ? 8 : 4;  // keys per online-softmax step
};

template <int DB> struct BwdCfg {
  static constexpr int G = DB <= 64 ? 4 : 8;
  static constexpr int ROWS = kThreads / G;  // keys (dkdv) or queries (dq) per block
  static constexpr int BQ = DB == 32 ? 64 : (DB == 64 ? 32 : 16);  // dkdv: queries per tile
  // dq: keys per tile. d96 takes 16 (12 KiB of LDS) so that 3 blocks fit a CU: 3 waves/SIMD.
  static constexpr int BKV = DB <= 64 ? 64 : (DB == 96 ? 16 : 32);
};

// ---------------------------------------------------------------------------------------------
// Forward
// ---------------------------------------------------------------------------------------------

/// Per-lane state of the forward: its queries (pre-scaled into the exp2 domain), their output
/// accumulators, the running reference max m of every query slot, the running sum l of its own
/// probabilities, the last visible key of every query slot and where its permuted keys sit.
template <int DB, int G, int QPT, int KC> struct FwdLane {
  using Sp = Spread<G, QPT, KC>;
  Slice<DB, G> qs[QPT];
  Slice<DB, G> acc[QPT];
  float m[QPT];     // lazy reference max (exp2 domain); kNoMax until a key is visible
  float l[Sp::OQ];  // sum of exp2(s - m) over the probabilities this lane computed
  int row0;        // the group's first query; slot r holds row0 + (r ^ tq)
  int tq;          // query permutation of this lane
  int koff[Sp::NB]; // LDS float offset of key block h: ((h ^ tk / KB) * KB) * DB
  int tk;           // key permutation of this lane
};

/// A reference max below every finite score: -inf would give -inf - -inf = NaN.
constexpr float kNoMax = -3.0e38f;

/// One key/value tile of the forward pass for the QPT queries of this lane group: steps of KC
/// keys (scores, spread, one online-softmax update, gather, p * V). Each float read from LDS
/// feeds QPT FMAs (one per query). MASK: some key of the tile may be invisible to some query
/// of the block (causal diagonal or past Tk); otherwise no per-key test is made.
template <bool MASK, bool VARLEN, int DB, int G, int QPT, int BKV, int KC>
__device__ __forceinline__ void fwd_tile(const float* kv_lds, float* sc_lds,
                                         FwdLane<DB, G, QPT, KC>& st, int j0, int g, int Tq,
                                         int Tk, bool causal, const int2* spans) {
  using Sp = Spread<G, QPT, KC>;
  constexpr int NC = Slice<DB, G>::NC;
  constexpr int OWN = Sp::OWN;
  // Item i of the step at key slot jc: key slot u = i / NC (row jc + (u ^ tk) of the tile),
  // chunk c = i % NC. V sits BKV rows after K.
  const float* k_g = kv_lds + Slice<DB, G>::col(0, g);
  auto item = [&](int jc, int i) __attribute__((always_inline)) {
    const int u = i / NC;
    return reinterpret_cast<const float4*>(k_g + st.koff[u / Sp::KB] + (jc + u % Sp::KB) * DB +
                                           4 * G * (i % NC));
  };
  constexpr int kV = BKV * DB / 4;  // float4s from a K item to its V item
  // Step t's owned scores at slot t + 1 of this thread's column of sc_lds (slot 0 and the last
  // slot are padding for the pipelining below).
  float* sc = sc_lds + OWN * static_cast<int>(threadIdx.x);
  auto slot = [&](int jc) __attribute__((always_inline)) {
    return sc + (jc / KC + 1) * OWN * kThreads;
  };

  // Pass 1: the tile's scores. Partial sums per item, each key's query levels reduced as soon
  // as its sums are complete, then the key levels; each lane keeps its owned scores (masked) in
  // its own slice of sc_lds (no other thread reads them) and their running max.
  // Markers beside a scheduling barrier present in both builds: with or without them (see
  // cargo xtask isa-report --verify-markers) the loops compile the same.
  // MASK with VARLEN: the keys [x, y] each owned query slot sees, read from this thread's
  // entries of LDS (slot r at spans[r * kThreads], searched once per block rather than once per
  // tile). Without VARLEN the mask is the bottom-right aligned one, computed in place.
  int2 span[Sp::OQ];
  if constexpr (MASK && VARLEN) {
#pragma unroll
    for (int r = 0; r < Sp::OQ; ++r) span[r] = spans[r * kThreads];
  }
  float4 carry = *item(0, 0);
  // The read ahead above the barrier, so the compiler does not merge it with the loop's own
  // (which would move the read to the top of the step, just before its first use).
  hipk::sched_barrier();
  if constexpr (!MASK) HIPK_HOT_LOOP_BEGIN("fwd_qk");  // KC keys x QPT queries
  float tmax[QPT];
#pragma unroll
  for (int r = 0; r < QPT; ++r) tmax[r] = kNegInf;
  // A step stores the previous step's owned scores early in its stream, ahead of its last read
  // (the waits count LDS operations in order: a store behind the read-ahead would make the next
  // step wait for it). The first step stores its zeros to the padding slot.
  float prev[OWN];
#pragma unroll
  for (int o = 0; o < OWN; ++o) prev[o] = 0.0f;
#pragma unroll 1
  for (int jc = 0; jc < BKV; jc += KC) {
    float s[QPT][KC];
    stream_lds<KC * NC>(
        [&](int i) __attribute__((always_inline)) { return item(jc, i); },
        [&](int i, float4 w) __attribute__((always_inline)) {
          const int u = i / NC;
          const int c = i % NC;
#pragma unroll
          for (int r = 0; r < QPT; ++r) {
            float x = c == 0 ? 0.0f : s[r][u];
            x = __builtin_fmaf(st.qs[r].x[c][0], w.x, x);
            x = __builtin_fmaf(st.qs[r].x[c][1], w.y, x);
            x = __builtin_fmaf(st.qs[r].x[c][2], w.z, x);
            s[r][u] = __builtin_fmaf(st.qs[r].x[c][3], w.w, x);
          }
          if (c == NC - 1) Sp::rs_queries(s, u);
          if (i == 0) store_own<OWN>(slot(jc) - OWN * kThreads, prev);
        },
        carry, item(jc + KC, 0));  // after the last step: V's first rows (unused)
    Sp::rs_keys(s);
#pragma unroll
    for (int r = 0; r < Sp::OQ; ++r) {
#pragma unroll
      for (int u = 0; u < Sp::KB; ++u) {
        float x = s[r][u];
        if constexpr (MASK && VARLEN) {
          const int j = j0 + jc + (u ^ st.tk);
          x = j >= span[r].x && j <= span[r].y ? x : kNegInf;
        } else if constexpr (MASK) {
          const int row = st.row0 + (r ^ st.tq);
          const int jmax = row < Tq ? last_key(row, Tq, Tk, causal) : -1;
          x = j0 + jc + (u ^ st.tk) <= jmax ? x : kNegInf;
        }
        tmax[r] = fmaxf(tmax[r], x);
        prev[r * Sp::KB + u] = x;
      }
    }
  }
  if constexpr (!MASK) HIPK_HOT_LOOP_END("fwd_qk");
  store_own<OWN>(slot(BKV - KC), prev);

  // Online softmax, once per tile: m = max(m, tile max) for every query slot (the same in every
  // lane holding that query), acc and l rescaled (by 1 when m did not move).
  Sp::template gather_rows<true>(tmax);
#pragma unroll
  for (int r = 0; r < QPT; ++r) {
    const float m_new = fmaxf(st.m[r], tmax[r]);
    const float corr = fast_exp2(st.m[r] - m_new);  // 0 from kNoMax, 1 when unchanged
    st.acc[r].scale(corr);
    if (r < Sp::OQ) st.l[r < Sp::OQ ? r : 0] *= corr;
    st.m[r] = m_new;
  }

  // Pass 2: p = 2^(s - m) for the owned scores, l, gather (key levels now, query levels per
  // key), out += p * V. The next step's owned scores are read with its first V item.
  float own[OWN];
  load_own<OWN>(slot(0), own);
  carry = *(item(0, 0) + kV);
  hipk::sched_barrier();
  if constexpr (!MASK) HIPK_HOT_LOOP_BEGIN("fwd_pv");  // KC keys x QPT queries
#pragma unroll 1
  for (int jc = 0; jc < BKV; jc += KC) {
    float p[QPT][KC];
#pragma unroll
    for (int r = 0; r < Sp::OQ; ++r) {
#pragma unroll
      for (int u = 0; u < Sp::KB; ++u) {
        p[r][u] = fast_exp2(own[r * Sp::KB + u] - st.m[r]);  // 0 for masked keys
        st.l[r] += p[r][u];
      }
    }
    Sp::ag_keys(p);
    stream_lds<KC * NC>(
        [&](int i) __attribute__((always_inline)) { return item(jc, i) + kV; },
        [&](int i, float4 w) __attribute__((always_inline)) {
          const int u = i / NC;
          const int c = i % NC;
          if (c == 0) Sp::ag_queries(p, u);
          if (i == KC * NC - 1) load_own<OWN>(slot(jc + KC), own);
#pragma unroll
          for (int r = 0; r < QPT; ++r) {
            const float pr = p[r][u];
            st.acc[r].x[c][0] = __builtin_fmaf(pr, w.x, st.acc[r].x[c][0]);
            st.acc[r].x[c][1] = __builtin_fmaf(pr, w.y, st.acc[r].x[c][1]);
            st.acc[r].x[c][2] = __builtin_fmaf(pr, w.z, st.acc[r].x[c][2]);
            st.acc[r].x[c][3] = __builtin_fmaf(pr, w.w, st.acc[r].x[c][3]);
          }
        },
        carry, item(jc + KC, 0) + kV);  // after the last step: the padding (unused)
  }
  if constexpr (!MASK) HIPK_HOT_LOOP_END("fwd_pv");
}

template <typename T, int DB, bool VARLEN>
__device__ __forceinline__ void fwd(const T* __restrict__ q, Strides qst,
                                    const T* __restrict__ k, Strides kst_,
                                    const T* __restrict__ v, Strides vst_, T* __restrict__ out,
                                    Strides ost, float* __restrict__ lse, RowStrides lst, int Tq,
                                    int Tk, int D, float scale, int causal_flag, int group,
                                    const int* __restrict__ cu, int ncu) {
  using Cfg = FwdCfg<DB, VARLEN>;
  constexpr int G = Cfg::G;
  constexpr int QPT = Cfg::QPT;
  constexpr int BKV = Cfg::BKV;
  constexpr int KC = Cfg::KC;
  using Sp = Spread<G, QPT, KC>;
  // K tile, V tile, then KC rows of padding: the read ahead past a tile's last step lands there.
  __shared__ float kv_lds[(2 * BKV + KC) * DB];
  // Each thread's owned scores of every step, and a step of padding (the same read ahead).
  __shared__ float sc_lds[(BKV / KC + 2) * Sp::OWN * kThreads];

  const bool causal = causal_flag != 0;
  const int tid = static_cast<int>(threadIdx.x);
  const int g = tid % G;
  // Causal: the last query tiles see the most keys; start them first.
  const int tile = causal ? static_cast<int>(gridDim.x - 1 - blockIdx.x)
                          : static_cast<int>(blockIdx.x);
  const int q0 = tile * Cfg::ROWS;
  const Rows<const T> q_bh(q, qst);
  // Grouped-query heads: query head blockIdx.y reads key/value head blockIdx.y / group.
  const int kv_head = static_cast<int>(blockIdx.y) / group;
  const Rows<const T> k_bh(k, kst_, kv_head);
  const Rows<const T> v_bh(v, vst_, kv_head);
  const Rows<T> out_bh(out, ost);
  // Without VARLEN (the kernels called without cu_seqlens) ncu is taken as 0: no varlen code.
  const SeqMap sm(cu, VARLEN ? ncu : 0, Tq);
  float* lse_bh = stat_rows(lse, lst);
  const bool vec_ok =
      vec4_ok(q, qst) && vec4_ok(k, kst_) && vec4_ok(v, vst_) && vec4_ok(out, ost);

  // This group's queries: QPT consecutive rows; slot r of lane g holds row r ^ tq.
  FwdLane<DB, G, QPT, KC> st;
  const int tau = Sp::tau(g);
  const int tq = tau / KC;
  st.tq = tq;
  st.row0 = q0 + (tid / G) * QPT;
  st.tk = tau % KC;
#pragma unroll
  for (int h = 0; h < Sp::NB; ++h) st.koff[h] = ((h ^ (st.tk / Sp::KB)) * Sp::KB) * DB;
  // VARLEN: the key span of each owned query slot, in LDS (only this thread reads its entries,
  // after its own writes: no barrier). The kernels without VARLEN have no such array.
  const int2* spans = nullptr;
  if constexpr (VARLEN) {
    __shared__ int2 span_lds[Sp::OQ * kThreads];
#pragma unroll
    for (int r = 0; r < Sp::OQ; ++r) {
      span_lds[r * kThreads + tid] = key_span(st.row0 + (r ^ st.tq), Tq, Tk, causal, sm);
    }
    spans = span_lds + tid;
  }
#pragma unroll
  for (int r = 0; r < QPT; ++r) {
    const int i = q0 + (tid / G) * QPT + (r ^ tq);
    const bool row_ok = i < Tq;
    st.qs[r].load(q_bh.row(row_ok ? i : 0), row_ok, D, g, vec_ok, scale * kLog2e);
    st.acc[r].zero();
    st.m[r] = kNoMax;
  }
#pragma unroll
  for (int r = 0; r < Sp::OQ; ++r) st.l[r] = 0.0f;
  // Keys any row of the block can see: [kv_begin, kv_end) (kv_begin = 0 without cu_seqlens).
  // Tiles wholly visible to every query of the block (without cu_seqlens the first query sees
  // the fewest keys) skip the per-key mask.
  const KeyRange keys = block_keys(q0, q0 + Cfg::ROWS, Tq, Tk, causal, sm);
  const int kv_end = keys.end;
  const int kv_begin = keys.begin / BKV * BKV;  // tiles start at multiples of BKV

  // K/V tiles: tile t+1 is loaded into registers while tile t is used from LDS.
  using Stager = TileStager<BKV, DB, T>;
  Stager kst, vst;
  auto load_kv = [&](int r0) __attribute__((always_inline)) {
    // One condition for both: k and v rows are usually equally far apart (fused QKV, packed).
    if (Stager::fast_ok(Tk, r0, D, max(k_bh.seq, v_bh.seq), vec_ok)) {
      kst.load_fast(k_bh.row(r0), k_bh.seq, tid);
      vst.load_fast(v_bh.row(r0), v_bh.seq, tid);
    } else {
      kst.load_checked(k_bh.p, k_bh.seq, Tk, r0, D, vec_ok, tid);
      vst.load_checked(v_bh.p, v_bh.seq, Tk, r0, D, vec_ok, tid);
    }
  };
  if (kv_end > kv_begin) {
    load_kv(kv_begin);
    kst.store(kv_lds, tid);
    vst.store(kv_lds + BKV * DB, tid);
  }
  __syncthreads();
  // Tiles [0, j_full) are wholly visible to every query of the block; the rest take the
  // per-key mask. Two loops one after the other rather than a branch per tile: with the branch,
  // the accumulators are carried through two inner loops at once and the register allocator
  // copies them (and spills).
  auto tiles = [&](auto mask, int j_begin, int j_end) __attribute__((always_inline)) {
    for (int j0 = j_begin; j0 < j_end; j0 += BKV) {
      const bool more = j0 + BKV < kv_end;  // uniform
      if (more) load_kv(j0 + BKV);
      // Keeps those loads above the tile's LDS reads (the scheduler would sink them to their
      // use, the LDS store below, and expose their latency).
      hipk::sched_fence();
      fwd_tile<decltype(mask)::value, VARLEN, DB, G, QPT, BKV, KC>(kv_lds, sc_lds, st, j0, g,
                                                                    Tq, Tk, causal, spans);
      __syncthreads();  // the tile is no longer read
      if (more) {
        kst.store(kv_lds, tid);
        vst.store(kv_lds + BKV * DB, tid);
      }
      __syncthreads();
    }
  };
  // Whole tiles [kv_begin, j_full), then masked tiles [j_full, kv_end). With cu_seqlens every
  // tile takes the mask (j_full = kv_begin): a third loop for the masked tiles before the whole
  // ones (a sequence starting inside a tile) costs the d64 forward spills.
  const int j_full =
      sm.on() ? kv_begin : max(0, min(keys.full_end, kv_end)) / BKV * BKV;
  tiles(std::false_type{}, kv_begin, j_full);
  tiles(std::true_type{}, j_full, kv_end);

  // Every lane: the complete l of each of its query slots (all lanes take part).
  float lq[QPT];
#pragma unroll
  for (int r = 0; r < QPT; ++r) lq[r] = r < Sp::OQ ? st.l[r < Sp::OQ ? r : 0] : 0.0f;
  Sp::template gather_rows<false>(lq);
#pragma unroll
  for (int r = 0; r < QPT; ++r) {
    const int i = q0 + (tid / G) * QPT + (r ^ tq);
    if (i < Tq) {
      const bool any = lq[r] > 0.0f;  // padding of cu_seqlens: every tile masked, l = 0
      st.acc[r].store(out_bh.row(i), D, g, vec_ok, any ? 1.0f / lq[r] : 0.0f);
      // Lane 0 of a group holds its queries in order (tau(0) = 0).
      if (g == 0) lse_bh[i] = any ? (st.m[r] + __log2f(lq[r])) * kLn2 : kNegInf;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Backward
// ---------------------------------------------------------------------------------------------

/// delta_i = sum_d dout[i, d] * out[i, d] for the queries i < Tq of this block's (batch, head);
/// 16 lanes per row.
template <typename T>
__device__ __forceinline__ void bwd_dot(const T* __restrict__ out, Strides ost,
                                        const T* __restrict__ dout, Strides dost,
                                        float* __restrict__ delta, RowStrides dst, int Tq, int D) {
  constexpr int L = 16;
  const int tid = static_cast<int>(threadIdx.x);
  const int r = static_cast<int>(blockIdx.x) * (kThreads / L) + tid / L;
  const int lane = tid % L;
  const bool row_ok = r < Tq;
  const bool vec_ok = vec4_ok(out, ost) && vec4_ok(dout, dost);
  const T* o_row = Rows<const T>(out, ost).row(row_ok ? r : 0);
  const T* do_row = Rows<const T>(dout, dost).row(row_ok ? r : 0);
  float s = 0.0f;
  for (int c = 4 * lane; c < D; c += 4 * L) {
    float a[4];
    float b[4];
    hipk::load_vec<4>(o_row + c, row_ok ? D - c : 0, vec_ok, a);
    hipk::load_vec<4>(do_row + c, row_ok ? D - c : 0, vec_ok, b);
#pragma unroll
    for (int u = 0; u < 4; ++u) s = __builtin_fmaf(a[u], b[u], s);
  }
#pragma unroll
  for (int o = L / 2; o > 0; o /= 2) s += __shfl_xor(s, o);
  if (row_ok && lane == 0) stat_rows(delta, dst)[r] = s;
}

/// p_ij = exp(s_ij - lse_i), with s2 = s_ij * log2 e and lse2 = lse_i * log2 e; 0 when the key
/// is masked or the row saw no key (lse = -inf).
__device__ __forceinline__ float recompute_p(float s2, float lse2, bool visible) {
  return visible && lse2 != kNegInf ? exp2f(s2 - lse2) : 0.0f;
}

template <typename T, int DB>
__device__ __forceinline__ void bwd_dkdv(const T* __restrict__ q, Strides qst,
                                         const T* __restrict__ k, Strides kst,
                                         const T* __restrict__ v, Strides vst,
                                         const T* __restrict__ dout, Strides dost,
                                         const float* __restrict__ lse,
                                         const float* __restrict__ delta, RowStrides lst,
                                         T* __restrict__ dk, Strides dkst, T* __restrict__ dv,
                                         Strides dvst, int Tq, int Tk, int D, float scale,
                                         int causal_flag, int group, const int* __restrict__ cu,
                                         int ncu) {
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
  const bool vec_ok = vec4_ok(q, qst) && vec4_ok(k, kst) && vec4_ok(v, vst) &&
                      vec4_ok(dout, dost) && vec4_ok(dk, dkst) && vec4_ok(dv, dvst);
  const SeqMap sm(cu, ncu, Tq);

  // This block's key/value head is blockIdx.y (grid.y = n_kv_heads); its query heads are
  // blockIdx.y * group + [0, group).
  Slice<DB, G> ks, vs, dks, dvs;
  ks.load(Rows<const T>(k, kst).row(key_ok ? j : 0), key_ok, D, g, vec_ok, 1.0f);
  vs.load(Rows<const T>(v, vst).row(key_ok ? j : 0), key_ok, D, g, vec_ok, 1.0f);
  dks.zero();
  dvs.zero();
  const float s2_scale = scale * kLog2e;

  // Without cu_seqlens query i sees key j iff j <= i + Tk - Tq: the queries of the block's
  // keys start at the first one that sees key j0 and run to Tq. With cu_seqlens they are
  // those of the sequences of the block's keys, and key j is seen by the queries [i_lo, i_hi)
  // (none for padding).
  const int2 queries = block_queries(j0, j0 + Cfg::ROWS, Tq, Tk, causal, sm);
  const int i_start = (queries.x / BQ) * BQ;
  // Key j is seen by the queries [i_lo, i_hi): without cu_seqlens i >= j - (Tk - Tq) when
  // causal (j <= last_key(i)), and i < Tq; none when the key is past Tk.
  int i_lo = causal ? j - (Tk - Tq) : 0;
  int i_hi = key_ok ? Tq : 0;
  if (sm.on()) {
    const int2 sj = sm.seq(key_ok ? j : Tk);
    i_lo = causal ? j : sj.x;
    i_hi = sj.y;
  }
  // dk and dv sum over the group's query heads in order, in registers: deterministic.
#pragma unroll 1
  for (int hh = 0; hh < group; ++hh) {
  const int head = static_cast<int>(blockIdx.y) * group + hh;
  const float* lse_bh = stat_rows(lse, lst, head);
  const float* delta_bh = stat_rows(delta, lst, head);
  const Rows<const T> q_bh(q, qst, head);
  const Rows<const T> do_bh(dout, dost, head);
  for (int i0 = i_start; i0 < queries.y; i0 += BQ) {
    __syncthreads();
    stage_rows<BQ, DB>(q_lds, q_bh.p, q_bh.seq, Tq, i0, D, vec_ok, tid);
    stage_rows<BQ, DB>(do_lds, do_bh.p, do_bh.seq, Tq, i0, D, vec_ok, tid);
    for (int r = tid; r < BQ; r += kThreads) {
      const bool ok = i0 + r < Tq;
      lse2_lds[r] = ok ? lse_bh[i0 + r] * kLog2e : kNegInf;
      delta_lds[r] = ok ? delta_bh[i0 + r] : 0.0f;
    }
    __syncthreads();
#pragma unroll 1  // 4 slices of 16 registers are live; unrolling spills at d128
    for (int r = 0; r < BQ; ++r) {
      const int i = i0 + r;
      const bool visible = i >= i_lo && i < i_hi;
      const float s2 = group_sum<G>(ks.dot(q_lds + r * DB, g)) * s2_scale;
      const float dp = group_sum<G>(vs.dot(do_lds + r * DB, g));
      const float p = recompute_p(s2, lse2_lds[r], visible);
      const float ds = p * (dp - delta_lds[r]);
      dvs.axpy(p, do_lds + r * DB, g);
      dks.axpy(ds, q_lds + r * DB, g);
    }
  }
  }

  if (key_ok) {
    dks.store(Rows<T>(dk, dkst).row(j), D, g, vec_ok, scale);
    dvs.store(Rows<T>(dv, dvst).row(j), D, g, vec_ok, 1.0f);
  }
}

/// The dq kernel's lane groups: G lanes own QPT queries (d32: 4, 1; d64: 8, 2; d96: 8, 1;
/// d128: 16, 2: 8 columns per lane, 12 at d96), so QROWS = 256 / G * QPT = 64 / 64 / 32 / 32.
/// Scores and dp are spread over the group like the forward's (Spread); KC keys per step.
template <int DB> struct DqCfg {
  static constexpr int G = DB == 32 ? 4 : (DB == 128 ? 16 : 8);
  static constexpr int QPT = DB == 64 || DB == 128 ? 2 : 1;
  static constexpr int ROWS = kThreads / G * QPT;
  static constexpr int KC = G / QPT;  // one owned score per lane and step
  // Keys per LDS tile. d96 takes 16 (12 KiB of LDS) so that 3 blocks fit a CU: 3 waves/SIMD.
  static constexpr int BKV = DB <= 64 ? 64 : (DB == 96 ? 16 : 32);
  static_assert(ROWS == BwdCfg<DB>::ROWS, "the launcher's dq rows per block");
};

template <typename T, int DB, bool VARLEN>
__device__ __forceinline__ void bwd_dq_spread(const T* __restrict__ q, Strides qst,
                                              const T* __restrict__ k, Strides kst,
                                              const T* __restrict__ v, Strides vst,
                                              const T* __restrict__ dout, Strides dost,
                                              const float* __restrict__ lse,
                                              const float* __restrict__ delta, RowStrides lst,
                                              T* __restrict__ dq, Strides dqst, int Tq,
                                              int Tk, int D, float scale, int causal_flag,
                                              int group, const int* __restrict__ cu, int ncu) {
  using Cfg = DqCfg<DB>;
  constexpr int G = Cfg::G;
  constexpr int QPT = Cfg::QPT;
  constexpr int KC = Cfg::KC;
  constexpr int BKV = Cfg::BKV;
  using Sp = Spread<G, QPT, KC>;
  static_assert(Sp::OWN == 1 && Sp::OQ == 1, "one owned score per lane and step");
  constexpr int NC = Slice<DB, G>::NC;
  __shared__ float kv_lds[2 * BKV * DB];  // K tile, then V tile

  const bool causal = causal_flag != 0;
  const int tid = static_cast<int>(threadIdx.x);
  const int g = tid % G;
  const int tile = causal ? static_cast<int>(gridDim.x - 1 - blockIdx.x)
                          : static_cast<int>(blockIdx.x);
  const int q0 = tile * Cfg::ROWS;
  const bool vec_ok = vec4_ok(q, qst) && vec4_ok(k, kst) && vec4_ok(v, vst) &&
                      vec4_ok(dout, dost) && vec4_ok(dq, dqst);

  // Slot r of lane g holds query row0 + (r ^ tq); its keys of a step come in the order u ^ tk.
  const int tau = Sp::tau(g);
  const int tq = tau / KC;
  const int tk = tau % KC;
  const int row0 = q0 + (tid / G) * QPT;
  Slice<DB, G> qs[QPT], dos[QPT], dqs[QPT];
#pragma unroll
  for (int r = 0; r < QPT; ++r) {
    const int i = row0 + (r ^ tq);
    const bool ok = i < Tq;
    qs[r].load(Rows<const T>(q, qst).row(ok ? i : 0), ok, D, g, vec_ok, scale * kLog2e);
    dos[r].load(Rows<const T>(dout, dost).row(ok ? i : 0), ok, D, g, vec_ok, 1.0f);
    dqs[r].zero();
  }
  // The owned query slot (0): its statistics and last visible key.
  const int own_row = row0 + tq;
  const bool own_ok = own_row < Tq;
  const float lse2 = own_ok ? stat_rows(lse, lst)[own_row] * kLog2e : kNegInf;
  const float dlt = own_ok ? stat_rows(delta, lst)[own_row] : 0.0f;
  const SeqMap sm(cu, VARLEN ? ncu : 0, Tq);  // no varlen code without VARLEN
  // The owned query's keys [x, y]; without VARLEN only y (x = 0) is kept live.
  const int2 span = key_span(own_row, Tq, Tk, causal, sm);
  const int jmax = own_ok ? last_key(own_row, Tq, Tk, causal) : -1;
  // The key blocks of a step in this lane's order: LDS float offsets (Sp::NB of them).
  int koff[Sp::NB];
#pragma unroll
  for (int h = 0; h < Sp::NB; ++h) koff[h] = ((h ^ (tk / Sp::KB)) * Sp::KB) * DB;

  const KeyRange keys = block_keys(q0, q0 + Cfg::ROWS, Tq, Tk, causal, sm);
  const int last = keys.end;
  const int kv_head = static_cast<int>(blockIdx.y) / group;  // grouped-query heads
  const Rows<const T> k_bh(k, kst, kv_head);
  const Rows<const T> v_bh(v, vst, kv_head);
  const float* k_g = kv_lds + Slice<DB, G>::col(0, g);
  // Item i of the step at key slot jc: key slot u = (i / NC) % KC, chunk c = i % NC; items
  // [0, KC NC) read K (scores), [KC NC, 2 KC NC) V (dp), [2 KC NC, 3 KC NC) K again (dq).
  constexpr int kItems = KC * NC;
  auto item = [&](int jc, int i) __attribute__((always_inline)) {
    const int u = (i / NC) % KC;
    const int tensor = i / kItems == 1 ? BKV * DB : 0;
    return reinterpret_cast<const float4*>(k_g + tensor + koff[u / Sp::KB] +
                                           (jc + u % Sp::KB) * DB + 4 * G * (i % NC));
  };
  // x[r][u] += this lane's part of a[r] . (item w); the query levels once key u is complete.
  auto partial = [&](float (&x)[QPT][KC], const Slice<DB, G>(&a)[QPT], int u, int c, float4 w)
                     __attribute__((always_inline)) {
#pragma unroll
    for (int r = 0; r < QPT; ++r) {
      float y = c == 0 ? 0.0f : x[r][u];
      y = __builtin_fmaf(a[r].x[c][0], w.x, y);
      y = __builtin_fmaf(a[r].x[c][1], w.y, y);
      y = __builtin_fmaf(a[r].x[c][2], w.z, y);
      x[r][u] = __builtin_fmaf(a[r].x[c][3], w.w, y);
    }
    if (c == NC - 1) Sp::rs_queries(x, u);
  };
  for (int j0 = keys.begin / BKV * BKV; j0 < last; j0 += BKV) {
    __syncthreads();
    stage_rows<BKV, DB>(kv_lds, k_bh.p, k_bh.seq, Tk, j0, D, vec_ok, tid);
    stage_rows<BKV, DB>(kv_lds + BKV * DB, v_bh.p, v_bh.seq, Tk, j0, D, vec_ok, tid);
    __syncthreads();
    float4 carry = *item(0, 0);
    hipk::sched_barrier();  // as in fwd_tile: keeps the read ahead, and the marker neutral
    HIPK_HOT_LOOP_BEGIN("dq_step");  // KC keys x QPT queries
#pragma unroll 1
    for (int jc = 0; jc < BKV; jc += KC) {
      float s[QPT][KC], dp[QPT][KC];
      // Three streams, each reading the next one's first item ahead: K (scores), V (dp), K
      // again (dq += ds k); the last one reads the next step's first K item (after the last
      // step: V's first rows, unused).
      stream_lds<kItems>(
          [&](int i) __attribute__((always_inline)) { return item(jc, i); },
          [&](int i, float4 w) __attribute__((always_inline)) {
            partial(s, qs, i / NC, i % NC, w);
          },
          carry, item(jc, kItems));
      stream_lds<kItems>(
          [&](int i) __attribute__((always_inline)) { return item(jc, kItems + i); },
          [&](int i, float4 w) __attribute__((always_inline)) {
            partial(dp, dos, i / NC, i % NC, w);
          },
          carry, item(jc, 2 * kItems));
      // The owned score: p = exp(s - lse), ds = p (dp - delta); then every lane's ds.
      Sp::rs_keys(s);
      Sp::rs_keys(dp);
      const int jo = j0 + jc + tk;
      const bool seen = VARLEN ? jo >= span.x && jo <= span.y : jo <= jmax;
      const float p = recompute_p(s[0][0], lse2, seen);
      dp[0][0] = p * (dp[0][0] - dlt);
      Sp::ag_keys(dp);
      stream_lds<kItems>(
          [&](int i) __attribute__((always_inline)) { return item(jc, 2 * kItems + i); },
          [&](int i, float4 w) __attribute__((always_inline)) {
            const int u = i / NC;
            const int c = i % NC;
            if (c == 0) Sp::ag_queries(dp, u);
#pragma unroll
            for (int r = 0; r < QPT; ++r) {
              const float ds = dp[r][u];
              dqs[r].x[c][0] = __builtin_fmaf(ds, w.x, dqs[r].x[c][0]);
              dqs[r].x[c][1] = __builtin_fmaf(ds, w.y, dqs[r].x[c][1]);
              dqs[r].x[c][2] = __builtin_fmaf(ds, w.z, dqs[r].x[c][2]);
              dqs[r].x[c][3] = __builtin_fmaf(ds, w.w, dqs[r].x[c][3]);
            }
          },
          carry, item(jc + KC, 0));
    }
    HIPK_HOT_LOOP_END("dq_step");
  }

#pragma unroll
  for (int r = 0; r < QPT; ++r) {
    const int i = row0 + (r ^ tq);
    if (i < Tq) dqs[r].store(Rows<T>(dq, dqst).row(i), D, g, vec_ok, scale);
  }
}

/// dq for db 32 and 96 (one query per lane group: a spread over the group would leave 4 B of
/// LDS per FMA there, and cost d96 its third wave per SIMD).
template <typename T, int DB, bool VARLEN>
__device__ __forceinline__ void bwd_dq_rows(const T* __restrict__ q, Strides qst,
                                            const T* __restrict__ k, Strides kst,
                                            const T* __restrict__ v, Strides vst,
                                            const T* __restrict__ dout, Strides dost,
                                            const float* __restrict__ lse,
                                            const float* __restrict__ delta, RowStrides lst,
                                            T* __restrict__ dq, Strides dqst, int Tq, int Tk, int D,
                                            float scale, int causal_flag, int group,
                                            const int* __restrict__ cu, int ncu) {
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
  const bool vec_ok = vec4_ok(q, qst) && vec4_ok(k, kst) && vec4_ok(v, vst) &&
                      vec4_ok(dout, dost) && vec4_ok(dq, dqst);

  const int row = row_ok ? i : 0;
  Slice<DB, G> qs, dos, dqs;
  qs.load(Rows<const T>(q, qst).row(row), row_ok, D, g, vec_ok, scale * kLog2e);
  dos.load(Rows<const T>(dout, dost).row(row), row_ok, D, g, vec_ok, 1.0f);
  dqs.zero();
  const float lse2 = row_ok ? stat_rows(lse, lst)[row] * kLog2e : kNegInf;
  const float dlt = row_ok ? stat_rows(delta, lst)[row] : 0.0f;

  const SeqMap sm(cu, VARLEN ? ncu : 0, Tq);  // no varlen code without VARLEN
  const int2 span = key_span(i, Tq, Tk, causal, sm);  // this query's keys (VARLEN)
  const int jmax = row_ok ? last_key(i, Tq, Tk, causal) : -1;
  const KeyRange keys = block_keys(q0, q0 + Cfg::ROWS, Tq, Tk, causal, sm);
  const int kv_end = keys.end;
  const int kv_head = static_cast<int>(blockIdx.y) / group;  // grouped-query heads
  const Rows<const T> k_bh(k, kst, kv_head);
  const Rows<const T> v_bh(v, vst, kv_head);
  for (int j0 = keys.begin / BKV * BKV; j0 < kv_end; j0 += BKV) {
    __syncthreads();
    stage_rows<BKV, DB>(k_lds, k_bh.p, k_bh.seq, Tk, j0, D, vec_ok, tid);
    stage_rows<BKV, DB>(v_lds, v_bh.p, v_bh.seq, Tk, j0, D, vec_ok, tid);
    __syncthreads();
#pragma unroll 2
    for (int u = 0; u < BKV; ++u) {
      const float s2 = group_sum<G>(qs.dot(k_lds + u * DB, g));
      const float dp = group_sum<G>(dos.dot(v_lds + u * DB, g));
      const int j = j0 + u;
      const bool seen = VARLEN ? j >= span.x && j <= span.y : j <= jmax;
      const float p = recompute_p(s2, lse2, seen);
      dqs.axpy(p * (dp - dlt), k_lds + u * DB, g);
    }
  }

  if (row_ok) dqs.store(Rows<T>(dq, dqst).row(i), D, g, vec_ok, scale);
}

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
  if constexpr (DqCfg<DB>::QPT > 1) {
    bwd_dq_spread<T, DB, VARLEN>(q, qst, k, kst, v, vst, dout, dost, lse, delta, lst, dq, dqst, Tq, Tk,
                         D, scale, causal_flag, group, cu, ncu);
  } else {
    bwd_dq_rows<T, DB, VARLEN>(q, qst, k, kst, v, vst, dout, dost, lse, delta, lst, dq, dqst, Tq, Tk, D,
                       scale, causal_flag, group, cu, ncu);
  }
}

}  // namespace hipk_attn

// ---------------------------------------------------------------------------------------------
// Exported kernels
// ---------------------------------------------------------------------------------------------

#define HIPK_ATTN_KERNEL(NAME) extern "C" __global__ void __launch_bounds__(256, 2) NAME

// VARIANT is empty or _varlen; VARLEN the matching bool: the launcher picks the _varlen kernels
// when cu_seqlens is given, so the others hold no varlen code (and keep their registers).
#define HIPK_ATTN_FWD_V(DB, VARIANT, VARLEN, SUFFIX, T)                                     \
  HIPK_ATTN_KERNEL(attention_fwd_d##DB##VARIANT##_##SUFFIX)                                 \
  (const T* q, hipk_attn::Strides qs, const T* k, hipk_attn::Strides ks, const T* v,        \
   hipk_attn::Strides vs, T* out, hipk_attn::Strides os, float* lse,                        \
   hipk_attn::RowStrides ls, int Tq, int Tk, int D, float scale, int causal, int group,     \
   const int* cu, int ncu) {                                                                \
    hipk_attn::fwd<T, DB, VARLEN>(q, qs, k, ks, v, vs, out, os, lse, ls, Tq, Tk, D, scale,  \
                                  causal, group, cu, ncu);                                  \
  }

#define HIPK_ATTN_FWD(DB, SUFFIX, T)                                                        \
  HIPK_ATTN_FWD_V(DB, , false, SUFFIX, T) HIPK_ATTN_FWD_V(DB, _varlen, true, SUFFIX, T)

#define HIPK_ATTN_DQ(DB, VARIANT, VARLEN, SUFFIX, T)                                          \
  HIPK_ATTN_KERNEL(attention_bwd_dq_d##DB##VARIANT##_##SUFFIX)                                \
  (const T* q, hipk_attn::Strides qs, const T* k, hipk_attn::Strides ks, const T* v,          \
   hipk_attn::Strides vs, const T* dout, hipk_attn::Strides dos, const float* lse,            \
   const float* delta, hipk_attn::RowStrides ls, T* dq, hipk_attn::Strides dqs, int Tq,       \
   int Tk, int D, float scale, int causal, int group, const int* cu, int ncu) {               \
    hipk_attn::bwd_dq<T, DB, VARLEN>(q, qs, k, ks, v, vs, dout, dos, lse, delta, ls, dq, dqs, \
                                     Tq, Tk, D, scale, causal, group, cu, ncu);               \
  }

#define HIPK_ATTN_BWD(DB, SUFFIX, T)                                                          \
  HIPK_ATTN_KERNEL(attention_bwd_dkdv_d##DB##_##SUFFIX)                                       \
  (const T* q, hipk_attn::Strides qs, const T* k, hipk_attn::Strides ks, const T* v,          \
   hipk_attn::Strides vs, const T* dout, hipk_attn::Strides dos, const float* lse,            \
   const float* delta, hipk_attn::RowStrides ls, T* dk, hipk_attn::Strides dks, T* dv,        \
   hipk_attn::Strides dvs, int Tq, int Tk, int D, float scale, int causal, int group,       \
   const int* cu, int ncu) {                                                                  \
    hipk_attn::bwd_dkdv<T, DB>(q, qs, k, ks, v, vs, dout, dos, lse, delta, ls, dk, dks, dv,   \
                               dvs, Tq, Tk, D, scale, causal, group, cu, ncu);                \
  }                                                                                           \
  HIPK_ATTN_DQ(DB, , false, SUFFIX, T) HIPK_ATTN_DQ(DB, _varlen, true, SUFFIX, T)

#define HIPK_ATTN_BUCKETS(SUFFIX, T)                                                          \
  HIPK_ATTN_FWD(32, SUFFIX, T) HIPK_ATTN_FWD(64, SUFFIX, T) HIPK_ATTN_FWD(96, SUFFIX, T)      \
  HIPK_ATTN_FWD(128, SUFFIX, T) HIPK_ATTN_BWD(32, SUFFIX, T) HIPK_ATTN_BWD(64, SUFFIX, T)     \
  HIPK_ATTN_BWD(96, SUFFIX, T) HIPK_ATTN_BWD(128, SUFFIX, T)                                  \
  HIPK_ATTN_KERNEL(attention_bwd_dot_##SUFFIX)                                                \
  (const T* out, hipk_attn::Strides os, const T* dout, hipk_attn::Strides dos, float* delta,  \
   hipk_attn::RowStrides ds, int Tq, int D) {                                                 \
    hipk_attn::bwd_dot<T>(out, os, dout, dos, delta, ds, Tq, D);                              \
  }

HIPK_DTYPES(HIPK_ATTN_BUCKETS)
