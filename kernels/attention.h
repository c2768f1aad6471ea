// kernels/attention.h — device building blocks of kernels/attention.hip (lane-group slices,
// tile staging, the LDS read stream, the DPP spread of scores over a lane group). Included by
// kernels/attention.hip only; see its header comment for the algorithms and figures.
#pragma once

#include "common.h"
#include "tile_io.h"

namespace hipk_attn {

constexpr int kThreads = 256;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kNegInf = -__builtin_huge_valf();

/// 2^x as one v_exp_f32 (about 1 ulp; results below 2^-126 flush to 0). exp2f goes through
/// ocml, which adds a denormal range fix-up (compare, two selects, a multiply) around it; the
/// softmax only feeds it arguments <= 0 whose results are summed with at least one 1.0, so
/// values below 2^-126 do not matter (and exp2(-inf) is still 0).
__device__ __forceinline__ float fast_exp2(float x) { return __builtin_exp2f(x); }

/// Sum over the G consecutive lanes of a group (G in {1, 2, 4, 8}); all lanes get the result.
/// Three DPP adds at most (no LDS traffic): after the two quad steps every lane of a quad holds
/// the quad's sum, so adding the mirrored lane of the other quad completes a group of 8.
/// Every lane of the wave must be active (no divergent branch around a call).
template <int G> __device__ __forceinline__ float group_sum(float x) {
  if constexpr (G >= 2) {  // quad_perm [1, 0, 3, 2]: partner lane ^ 1
    x += __int_as_float(__builtin_amdgcn_update_dpp(0, __float_as_int(x), 0xB1, 0xF, 0xF, false));
  }
  if constexpr (G >= 4) {  // quad_perm [2, 3, 0, 1]: partner lane ^ 2
    x += __int_as_float(__builtin_amdgcn_update_dpp(0, __float_as_int(x), 0x4E, 0xF, 0xF, false));
  }
  if constexpr (G >= 8) {  // row_half_mirror: partner lane 7 - (lane % 8), in the other quad
    x += __int_as_float(__builtin_amdgcn_update_dpp(0, __float_as_int(x), 0x141, 0xF, 0xF, false));
  }
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

/// Copies rows [r0, r0 + ROWS) of a [rows_total, D] tensor (rows `seq` elements apart) into an
/// LDS tile [ROWS][DB] as f32, zero-filling rows past rows_total and columns past D. All
/// threads of the block take part.
template <int ROWS, int DB, typename T>
__device__ __forceinline__ void stage_rows(float* lds, const T* x, int64_t seq, int rows_total,
                                           int r0, int D, bool vec_ok, int tid) {
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
    hipk::load_vec<4>(x + static_cast<int64_t>(ok ? r0 + r : 0) * seq + c, ok ? D - c : 0,
                      vec_ok, w);
    *reinterpret_cast<float4*>(lds + r * DB + c) = make_float4(w[0], w[1], w[2], w[3]);
  }
}

/// Last key index visible to query i (may be < 0: none); Tk - 1 when not causal.
__device__ __forceinline__ int last_key(int i, int Tq, int Tk, bool causal) {
  return causal ? min(i + Tk - Tq, Tk - 1) : Tk - 1;
}

/// Variable-length sequences (cu_seqlens): this block's batch row of n sequence starts (n - 1
/// sequences; sequence s is positions [cu[s], cu[s + 1])), over T = Tq = Tk positions.
/// Positions outside [cu[0], cu[n - 1]) are padding. n == 0: no cu_seqlens (one sequence of
/// Tq queries and Tk keys per row, the causal mask bottom-right aligned). Every value read is
/// clamped to [0, T], so a bad buffer (the launcher does not read it back) gives wrong values
/// but never an access outside the tensors.
struct SeqMap {
  const int* cu;
  int n;
  int T;

  __device__ __forceinline__ SeqMap(const int* cu_all, int ncu, int t)
      : cu(cu_all + static_cast<int64_t>(blockIdx.z) * ncu), n(ncu), T(t) {}

  __device__ __forceinline__ bool on() const { return n > 0; }
  __device__ __forceinline__ int at(int s) const { return min(max(cu[s], 0), T); }
  /// The first position of the first sequence and the end of the last: [first, last) holds
  /// every position that is not padding.
  __device__ __forceinline__ int first() const { return n > 1 ? at(0) : 0; }
  __device__ __forceinline__ int last() const { return n > 1 ? at(n - 1) : 0; }

  /// The sequence [x, y) holding position i; {0, 0} for padding.
  __device__ __forceinline__ int2 seq(int i) const {
    if (n < 2 || i < at(0) || i >= at(n - 1)) return make_int2(0, 0);
    int lo = 0;
    int hi = n - 1;  // cu[lo] <= i < cu[hi]
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (at(mid) <= i) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
    return make_int2(at(lo), at(lo + 1));
  }
};

/// Keys visible to query i: [x, y] (y < x: none; rows i >= Tq see none).
__device__ __forceinline__ int2 key_span(int i, int Tq, int Tk, bool causal, const SeqMap& sm) {
  if (i >= Tq) return make_int2(0, -1);
  if (!sm.on()) return make_int2(0, last_key(i, Tq, Tk, causal));
  const int2 s = sm.seq(i);
  return make_int2(s.x, causal ? min(i, s.y - 1) : s.y - 1);
}

/// Keys any query of [q0, q1) sees: [begin, end); and the keys every non-padding query of
/// them sees, [full_begin, full_end) (full_end <= full_begin: none). Without cu_seqlens as
/// before: [0, last_key(q1 - 1) + 1) and [0, last_key(q0) + 1).
struct KeyRange {
  int begin, end, full_begin, full_end;
};

__device__ __forceinline__ KeyRange block_keys(int q0, int q1, int Tq, int Tk, bool causal,
                                               const SeqMap& sm) {
  q1 = min(q1, Tq);
  if (!sm.on()) {
    return {0, max(0, last_key(q1 - 1, Tq, Tk, causal) + 1), 0,
            min(last_key(q0, Tq, Tk, causal) + 1, Tk)};
  }
  const int a = max(q0, sm.first());
  const int b = min(q1, sm.last());
  if (a >= b) return {0, 0, 0, 0};
  const int2 sa = sm.seq(a);
  const int2 sb = sm.seq(b - 1);
  const bool one = sa.x == sb.x && sa.y == sb.y;
  return {sa.x, causal ? b : sb.y, one ? sa.x : 0, one ? (causal ? a + 1 : sa.y) : 0};
}

/// Queries that see any key of [k0, k1): [begin, end) (Tq = Tk with cu_seqlens). Without
/// cu_seqlens: from the first causal query of k0 to Tq.
__device__ __forceinline__ int2 block_queries(int k0, int k1, int Tq, int Tk, bool causal,
                                              const SeqMap& sm) {
  if (!sm.on()) return make_int2(causal ? max(0, k0 - (Tk - Tq)) : 0, Tq);
  const int a = max(k0, sm.first());
  const int b = min(min(k1, Tk), sm.last());
  if (a >= b) return make_int2(0, 0);
  return make_int2(causal ? a : sm.seq(a).x, sm.seq(b - 1).y);
}

/// Element strides of an attention tensor [B, H, T, D] (head_dim contiguous): row (b, h, t)
/// starts at b * batch + h * head + t * seq. The launcher passes 0 for a dimension of extent 1
/// and folds the layout's offset and the launch's first batch/head into the pointer.
struct Strides {
  int64_t batch;
  int64_t head;
  int64_t seq;
};

/// Strides of the per-row statistics lse and delta [B, H, Tq] (f32, rows contiguous).
struct RowStrides {
  int64_t batch;
  int64_t head;
};

/// The rows of this block's (batch, head) = (blockIdx.z, blockIdx.y) of a strided tensor.
template <typename T> struct Rows {
  T* p;         // row t = 0
  int64_t seq;  // elements between rows

  __device__ __forceinline__ Rows(T* base, Strides s)
      : p(base + static_cast<int64_t>(blockIdx.z) * s.batch +
          static_cast<int64_t>(blockIdx.y) * s.head),
        seq(s.seq) {}
  /// Head `head` of this block's batch (grouped-query attention: the key/value head of a
  /// query head, or one query head of a key/value head's group).
  __device__ __forceinline__ Rows(T* base, Strides s, int head)
      : p(base + static_cast<int64_t>(blockIdx.z) * s.batch + static_cast<int64_t>(head) * s.head),
        seq(s.seq) {}
  __device__ __forceinline__ T* row(int t) const { return p + static_cast<int64_t>(t) * seq; }
};

/// This block's (batch, head) row of lse or delta.
template <typename T> __device__ __forceinline__ T* stat_rows(T* base, RowStrides s) {
  return base + static_cast<int64_t>(blockIdx.z) * s.batch +
         static_cast<int64_t>(blockIdx.y) * s.head;
}

/// Row of lse or delta of query head `head` of this block's batch.
template <typename T> __device__ __forceinline__ T* stat_rows(T* base, RowStrides s, int head) {
  return base + static_cast<int64_t>(blockIdx.z) * s.batch + static_cast<int64_t>(head) * s.head;
}

/// True when every row of a strided tensor at x starts aligned for 4-element vector accesses
/// (uniform; columns past D never take the vector path of a partial chunk).
template <typename T> __device__ __forceinline__ bool vec4_ok(const T* x, Strides s) {
  return hipk::is_aligned(x, 4 * sizeof(T)) && ((s.batch | s.head | s.seq) & 3) == 0;
}

/// A ROWS x DB tile of a [rows_total, D] tensor (rows `seq` elements apart) moved global ->
/// registers -> LDS (f32), in
/// slots of 4 consecutive elements of one row (slot s = thread + 256 * it). load_*() keep the
/// raw words (issued early, waited for only at store()); store() widens them into the LDS
/// tile. Rows past rows_total and columns past D are zeros.
template <int ROWS, int DB, typename T> struct TileStager {
  static constexpr int kSlotsPerRow = DB / 4;
  static constexpr int kSlots = ROWS * kSlotsPerRow;
  static constexpr int kIters = (kSlots + kThreads - 1) / kThreads;
  static constexpr int kWords = 4 * static_cast<int>(sizeof(T)) / 4;  // per slot
  uint32_t w[kIters][kWords];

  /// Largest row stride whose tile offsets fit 32 bits: ROWS * seq * sizeof(T) < 2^32.
  static constexpr int64_t kMaxFastSeq =
      (int64_t{1} << 32) / (ROWS * static_cast<int64_t>(sizeof(T))) - 1;
  /// Whole tile inside the tensor, D == DB, rows aligned, row stride below kMaxFastSeq
  /// (uniform): load_fast() may be used.
  __device__ __forceinline__ static bool fast_ok(int rows_total, int r0, int D, int64_t seq,
                                                 bool vec_ok) {
    return vec_ok && D == DB && r0 + ROWS <= rows_total && seq <= kMaxFastSeq &&
           kSlots % kThreads == 0;
  }
  /// Per-thread byte offsets of the slots from the tile origin when D == DB, with rows
  /// seq_bytes apart (< 2^32, see kMaxFastSeq). Slot s: row s / kSlotsPerRow, 4-column chunk
  /// s % kSlotsPerRow.
  __device__ __forceinline__ static uint32_t slot_bytes(int it, int tid, uint32_t seq_bytes) {
    const int s = tid + it * kThreads;
    return static_cast<uint32_t>(s / kSlotsPerRow) * seq_bytes +
           static_cast<uint32_t>((s % kSlotsPerRow) * 4 * static_cast<int>(sizeof(T)));
  }
  /// Unchecked load of the tile whose first row starts at `origin` (uniform); see fast_ok().
  /// Address = uniform base + 32-bit offset: the scalar-base global_load, no 64-bit VALU
  /// address math.
  __device__ __forceinline__ void load_fast(const T* origin, int64_t seq, int tid) {
    const char* base = reinterpret_cast<const char*>(origin);
    const uint32_t seq_bytes = static_cast<uint32_t>(seq) * static_cast<uint32_t>(sizeof(T));
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      uint32_t off = slot_bytes(it, tid, seq_bytes);
      hipk::opaque(off);  // see hipk::opaque: keeps the scalar-base form inside loops
      hipk::load_raw_vec<kWords>(reinterpret_cast<const T*>(base + off), w[it]);
    }
  }
  /// Bounds-checked load of rows [r0, r0 + ROWS) (tail tiles, D != DB, unaligned rows).
  __device__ __forceinline__ void load_checked(const T* x, int64_t seq, int rows_total, int r0,
                                               int D, bool vec_ok, int tid) {
    hipk::opaque(tid);  // derive the addresses here, not in registers kept across the loop
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int s = tid + it * kThreads;
      const int r = s / kSlotsPerRow;
      const int c = (s % kSlotsPerRow) * 4;
      const bool ok = (kSlots % kThreads == 0 || s < kSlots) && r0 + r < rows_total;
      hipk::load_raw<4>(x + static_cast<int64_t>(ok ? r0 + r : 0) * seq + c, ok ? D - c : 0,
                        vec_ok, w[it]);
    }
  }
  __device__ __forceinline__ void store(float* lds, int tid) const {
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int s = tid + it * kThreads;
      if (kSlots % kThreads != 0 && s >= kSlots) break;
      float f[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        f[u] = sizeof(T) == 4 ? __uint_as_float(w[it][u])
                              : hipk::from_bits(static_cast<T*>(nullptr),
                                                (w[it][u / 2] >> (16 * (u % 2))) & 0xffffu);
      }
      // Slot s holds row s / kSlotsPerRow, columns 4 * (s % kSlotsPerRow): offset 4 * s.
      *reinterpret_cast<float4*>(lds + 4 * s) = make_float4(f[0], f[1], f[2], f[3]);
    }
  }
};

/// Streams N float4 LDS reads through `use(i, value)` in order, the read of item i + 1 issued
/// before item i is used. Item 0 comes in `carry` (read earlier, by the previous step), and the
/// last item's turn reads `*next` (item 0 of the next step) into `carry`: a step never starts
/// on a read it has just issued. The scheduling barriers keep exactly that order: left alone,
/// the scheduler hoists every read of the unrolled loop and runs out of registers.
template <int N, typename Addr, typename Use>
__device__ __forceinline__ void stream_lds(Addr addr, Use use, float4& carry, const float4* next) {
  float4 buf[2];
  buf[0] = carry;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    hipk::sched_barrier();
    if (i + 1 < N) {
      buf[(i + 1) % 2] = *addr(i + 1);
    } else {
      carry = *next;
    }
    use(i, buf[i % 2]);
  }
}

constexpr int ilog2(int x) { return x <= 1 ? 0 : 1 + ilog2(x / 2); }

/// Level LV of the exchange inside a lane group: lane g trades with lane g ^ kLevelMask[LV]
/// (DPP quad_perm [1,0,3,2], quad_perm [2,3,0,1], row_half_mirror, row_mirror). The masks
/// 1, 2, 7, 15 have their top bits at 0, 1, 2, 3: together they reach every lane of a group of
/// 2, 4, 8 or 16. Every lane of the wave must be active.
constexpr int kLevelMask[4] = {1, 2, 7, 15};
template <int LV> __device__ __forceinline__ float level_xchg(float x) {
  constexpr int kCtrl[4] = {0xB1, 0x4E, 0x141, 0x140};
  static_assert(LV >= 0 && LV < 4, "groups of at most 16 lanes");
  // bound_ctrl: one v_mov_b32_dpp (no `old` operand to initialise; every source is in range).
  return __int_as_float(__builtin_amdgcn_mov_dpp(__float_as_int(x), kCtrl[LV], 0xF, 0xF, true));
}

/// How the QPT x KC scores of one step are spread over the G lanes of a group. Each lane
/// computes partial dot products (over its columns) of all N = QPT * KC scores, in slots
/// i = r * KC + u; lane g's slot i holds the logical score i ^ tau(g) (query r ^ tq, key
/// u ^ tk), tau linear with tau(kLevelMask[LV]) = N >> (LV + 1). Then a reduce-scatter (level
/// LV adds the partner's slot i + N/2^(LV+1) into slot i) leaves each lane the complete scores
/// of its OWN = N / G slots [0, OWN), which it alone turns into probabilities (the exp is paid
/// once per score, not once per lane), and an all-gather (the same levels backwards) gives every
/// lane all N probabilities for p * V. The permutation costs nothing: a lane loads its queries
/// in the order r ^ tq and reads its keys in the order u ^ tk.
template <int G, int QPT, int KC> struct Spread {
  static constexpr int L = ilog2(G);                                // levels
  static constexpr int N = QPT * KC;                                // scores per step
  static constexpr int OWN = N / G;                                 // complete per lane
  static constexpr int LQ = L < ilog2(QPT) ? L : ilog2(QPT);        // levels over queries
  static constexpr int OQ = QPT / G > 1 ? QPT / G : 1;              // owned query slots
  static constexpr int KB = KC >> (L - LQ);                         // keys per permuted block
  static constexpr int NB = KC / KB;                                // permuted key blocks
  static_assert((1 << L) == G && (1 << ilog2(QPT)) == QPT && OWN >= 1, "powers of two");
  static_assert(OWN == OQ * KB, "owned slots: OQ queries x KB keys");

  /// tau(g): lane g of the group written in the basis kLevelMask (top bit first).
  __device__ __forceinline__ static int tau(int g) {
    int t = 0;
#pragma unroll
    for (int lv = L - 1; lv >= 0; --lv) {
      if (g & (1 << lv)) {
        g ^= kLevelMask[lv];
        t ^= N >> (lv + 1);
      }
    }
    return t;
  }

  // The levels over queries come first (LV < LQ: slot r with r + QPT / 2^(LV+1), the same
  // key), so they run per key as soon as its partial sums are complete; the levels over keys
  // (only when G > QPT, then OQ = 1) run on query slot 0's KC scores.
  template <int LV = 0>
  __device__ __forceinline__ static void rs_queries(float (&s)[QPT][KC], int u) {
    if constexpr (LV < LQ) {
      constexpr int kHalf = QPT >> (LV + 1);
#pragma unroll
      for (int r = 0; r < kHalf; ++r) s[r][u] += level_xchg<LV>(s[r + kHalf][u]);
      rs_queries<LV + 1>(s, u);
    }
  }
  template <int LV = LQ> __device__ __forceinline__ static void rs_keys(float (&s)[QPT][KC]) {
    if constexpr (LV < L) {
      constexpr int kHalf = KC >> (LV - LQ + 1);
#pragma unroll
      for (int u = 0; u < kHalf; ++u) s[0][u] += level_xchg<LV>(s[0][u + kHalf]);
      rs_keys<LV + 1>(s);
    }
  }
  template <int LV = L - 1>
  __device__ __forceinline__ static void ag_keys(float (&s)[QPT][KC]) {
    if constexpr (LV >= LQ) {
      constexpr int kHalf = KC >> (LV - LQ + 1);
#pragma unroll
      for (int u = 0; u < kHalf; ++u) s[0][u + kHalf] = level_xchg<LV>(s[0][u]);
      ag_keys<LV - 1>(s);
    }
  }
  template <int LV = LQ - 1>
  __device__ __forceinline__ static void ag_queries(float (&s)[QPT][KC], int u) {
    if constexpr (LV >= 0) {
      constexpr int kHalf = QPT >> (LV + 1);
#pragma unroll
      for (int r = 0; r < kHalf; ++r) s[r + kHalf][u] = level_xchg<LV>(s[r][u]);
      ag_queries<LV - 1>(s, u);
    }
  }
  /// Every slot of every lane complete again (the reduce-scatter undone with the sums).
  __device__ __forceinline__ static void all_gather(float (&s)[QPT][KC]) {
    ag_keys(s);
#pragma unroll
    for (int u = 0; u < KC; ++u) ag_queries(s, u);
  }
  /// From per-lane values of the owned query slots (partial over this lane's keys) to the
  /// complete value of every query slot of this lane: combine over the key levels (sum, or max
  /// with kMax), then gather over the query levels.
  template <bool kMax, int LV = L - 1>
  __device__ __forceinline__ static void gather_rows(float (&x)[QPT]) {
    if constexpr (LV >= LQ) {
      const float y = level_xchg<LV>(x[0]);
      x[0] = kMax ? fmaxf(x[0], y) : x[0] + y;
      gather_rows<kMax, LV - 1>(x);
    } else if constexpr (LV >= 0) {
      constexpr int kHalf = QPT >> (LV + 1);
#pragma unroll
      for (int i = 0; i < kHalf; ++i) x[i + kHalf] = level_xchg<LV>(x[i]);
      gather_rows<kMax, LV - 1>(x);
    }
  }
};

/// N (1, 2 or 4) floats to / from LDS at p (aligned to N floats) in one access.
template <int N> __device__ __forceinline__ void store_own(float* p, const float (&x)[N]) {
  if constexpr (N == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(x[0], x[1], x[2], x[3]);
  } else if constexpr (N == 2) {
    *reinterpret_cast<float2*>(p) = make_float2(x[0], x[1]);
  } else {
    static_assert(N == 1, "1, 2 or 4 owned scores");
    *p = x[0];
  }
}
template <int N> __device__ __forceinline__ void load_own(const float* p, float (&x)[N]) {
  if constexpr (N == 4) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
  } else if constexpr (N == 2) {
    const float2 v = *reinterpret_cast<const float2*>(p);
    x[0] = v.x, x[1] = v.y;
  } else {
    static_assert(N == 1, "1, 2 or 4 owned scores");
    x[0] = *p;
  }
}

}  // namespace hipk_attn
