// kernels/attention_mc.h — building blocks of kernels/attention_mc.hip (attention on the
// matrix-core tile of kernels/mc_tile.h): the tile MAC per storage type, the lane roles of
// the two accumulator layouts, and the global -> registers -> LDS stagers (row-major and
// transposed). Included by kernels/attention_mc.hip only; see its header comment.
#pragma once

#include "attention.h"
#include "common.h"
#include "mc_tile.h"
#include "tile_io.h"

#include <type_traits>

namespace hipk_attn_mc {

using hipk::bf16;
using hipk::mc::f32x4;
using hipk_attn::kNegInf;

/// LDS row padding (halves): 16 bytes, so rows stay 16-byte aligned and shift banks.
constexpr int kPad = 8;

/// The tile MAC of a storage type (operands: 4 raw 16-bit values per lane).
template <typename T> struct Mac;
template <> struct Mac<__half> {
  using Vec = hipk::mc::f16x4;
  __device__ static __forceinline__ f32x4 mac(Vec a, Vec b, f32x4 c) {
    return hipk::mc::tile_f16(a, b, c);
  }
};
template <> struct Mac<bf16> {
  using Vec = hipk::mc::bf16x4;
  __device__ static __forceinline__ f32x4 mac(Vec a, Vec b, f32x4 c) {
    return hipk::mc::tile_bf16(a, b, c);
  }
};

/// Two finite f32 rounded to bf16 (nearest, ties to even) in one word, lo in the low half.
/// No NaN handling (common.h's f32_to_bf16 has it, at 2 more VALU per value): p and dS, the
/// only values rounded here, are finite whenever q, k, v and dout are; a NaN among those makes
/// the rounded operand some unspecified value instead of NaN.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const uint32_t a = __float_as_uint(lo);
  const uint32_t b = __float_as_uint(hi);
  const uint32_t ra = a + 0x7fffu + ((a >> 16) & 1u);
  const uint32_t rb = b + 0x7fffu + ((b >> 16) & 1u);
  return __builtin_amdgcn_perm(rb, ra, 0x07060302u);  // high halves: ra's low, rb's high
}

/// 4 f32 rounded to T (round to nearest even) as one operand.
template <typename T, typename Vec>
__device__ __forceinline__ Vec pack4(float x0, float x1, float x2, float x3) {
  uint32_t w[2];
  if constexpr (std::is_same<T, bf16>::value) {
    w[0] = pack_bf16x2(x0, x1);
    w[1] = pack_bf16x2(x2, x3);
  } else {
    w[0] = hipk::to_bits(hipk::from_float<T>(x0)) | (hipk::to_bits(hipk::from_float<T>(x1)) << 16);
    w[1] = hipk::to_bits(hipk::from_float<T>(x2)) | (hipk::to_bits(hipk::from_float<T>(x3)) << 16);
  }
  Vec v;
  __builtin_memcpy(&v, w, sizeof(v));
  return v;
}

/// 4 f32 as two operands, hi + lo, with hi = x rounded to T and lo = (x - hi) rounded to T:
/// hi + lo carries about twice T's significand (22 bits for f16, 16 for bf16), so a product
/// through both tile MACs is as accurate as one with x in f32 (p and dS are f32 in the vector
/// kernels and in the golden tolerances of the forward and the strided backward).
template <typename T, typename Vec>
__device__ __forceinline__ void split4(const float (&x)[4], Vec& hi, Vec& lo) {
  float h[4], l[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    if constexpr (std::is_same<T, bf16>::value) {
      const uint32_t a = __float_as_uint(x[e]);
      h[e] = __uint_as_float((a + 0x7fffu + ((a >> 16) & 1u)) & 0xffff0000u);
    } else {
      h[e] = hipk::to_float(hipk::from_float<T>(x[e]));
    }
    l[e] = x[e] - h[e];  // exact (Sterbenz / the rounding error of one rounding)
  }
  hi = pack4<T, Vec>(h[0], h[1], h[2], h[3]);  // exact: h is representable in T
  lo = pack4<T, Vec>(l[0], l[1], l[2], l[3]);
}

/// Two raw words as one operand.
template <typename Vec> __device__ __forceinline__ Vec vec_of(const uint32_t (&w)[2]) {
  Vec v;
  __builtin_memcpy(&v, w, sizeof(v));
  return v;
}

/// The roles of the lanes (see attention_mc.hip, "Lane roles"). Both layouts give lane l the
/// query (forward, dq) or key (dkdv) row l % 16 of every score tile it accumulates, with 4
/// values idx(l, 0..3) along the other dimension; what differs is which operand goes first.
template <typename Acc> struct Roles;
/// MFMA (accumulator row 4 (l / 16) + e, column l % 16): tiles are computed transposed, the
/// shared operand (read from LDS by every lane) as A and the lane's own rows as B.
template <> struct Roles<hipk::mc::MfmaAcc> {
  __device__ static __forceinline__ int idx(int lane, int e) { return 4 * (lane / 16) + e; }
  /// Source row (in a 16-row block) of position p of a transposed stage (identity).
  __device__ static __forceinline__ int tpos(int p) { return p; }
  template <typename M, typename Vec>
  __device__ static __forceinline__ f32x4 mac(Vec shared, Vec own, f32x4 c) {
    return M::mac(shared, own, c);
  }
};
/// MMAC (ASSUMED accumulator row l % 16, column l / 16 + 4 e): the lane's own rows as A; the
/// 4 values of a lane are the logical k's l / 16 + 4 e, so transposed stages store row
/// 4 (p % 4) + p / 4 at position p of each 16-row block (a self-inverse permutation).
template <> struct Roles<hipk::mc::MmacAcc> {
  __device__ static __forceinline__ int idx(int lane, int e) { return lane / 16 + 4 * e; }
  __device__ static __forceinline__ int tpos(int p) { return 4 * (p % 4) + p / 4; }
  template <typename M, typename Vec>
  __device__ static __forceinline__ f32x4 mac(Vec shared, Vec own, f32x4 c) {
    return M::mac(own, shared, c);
  }
};
using Lane = Roles<hipk::mc::AccLayout>;

/// True when every row (b, h, t) of a strided tensor at x starts aligned to N elements.
template <int N, typename T>
__device__ __forceinline__ bool vec_ok(const T* x, hipk_attn::Strides s) {
  return hipk::is_aligned(x, N * sizeof(T)) && ((s.batch | s.head | s.seq) % N) == 0;
}

/// A ROWS x DB tile of a [rows, D] tensor (rows `seq` elements apart) moved global ->
/// registers -> LDS as 16-bit values.
///   TRANS false: LDS [ROWS][DB + kPad] (row-major); a slot is 8 consecutive elements of a row
///     (one 16-byte load and store).
///   TRANS true: LDS [DB][ROWS + kPad] (transposed: rows contiguous); a slot is 4 rows x 4
///     columns (four 8-byte loads, permuted in registers into four 8-byte stores). Position p
///     of a 16-row block holds row Lane::tpos(p) of the block.
/// Rows past `rows` (the valid rows from the tile's first) and columns past D read as 0.
template <typename T, int ROWS, int DB, int THREADS, bool TRANS> struct Stage {
  static constexpr int V = TRANS ? 4 : 8;       // elements per load
  static constexpr int W = V / 2;               // words per load
  static constexpr int LOADS = TRANS ? 4 : 1;   // loads per slot
  static constexpr int EL = V * LOADS;          // elements per slot
  static constexpr int SLOTS = ROWS * DB / EL;
  static constexpr int NS = (SLOTS + THREADS - 1) / THREADS;
  static constexpr int PITCH = TRANS ? ROWS + kPad : DB + kPad;
  static constexpr int LDS = TRANS ? DB * PITCH : ROWS * PITCH;  // halves
  static_assert(ROWS % 16 == 0 && DB % 16 == 0, "whole 16 x 16 tiles");
  uint32_t w[NS][LOADS][W];

  /// Largest row stride (elements) of load_fast: every offset inside the tile fits 32 bits.
  static constexpr int64_t kMaxFastSeq = (int64_t{1} << 31) / (ROWS * 2);

  /// Row (in the tile) and column of load `r` of slot s.
  __device__ static __forceinline__ int2 at(int s, int r) {
    if constexpr (TRANS) {
      const int p = (s / (DB / 4)) * 4 + r;  // position: 4 per slot
      return make_int2((p & ~15) | Lane::tpos(p & 15), (s % (DB / 4)) * 4);
    } else {
      return make_int2(s / (DB / 8), (s % (DB / 8)) * 8);
    }
  }

  /// The whole tile inside the tensor, D == DB, rows aligned to V, seq small enough (uniform).
  __device__ static __forceinline__ bool fast_ok(int rows, int D, int64_t seq, bool aligned) {
    return aligned && rows >= ROWS && D == DB && seq <= kMaxFastSeq;
  }

  /// Unchecked load of the tile whose first row is `x` (uniform; see fast_ok()): vector loads
  /// from a uniform base plus 32-bit offsets (the scalar-base global_load).
  __device__ __forceinline__ void load_fast(const T* x, int64_t seq, int tid) {
    const char* base = reinterpret_cast<const char*>(x);
#pragma unroll
    for (int i = 0; i < NS; ++i) {
      const int s = SLOTS % THREADS == 0 ? tid + i * THREADS : min(tid + i * THREADS, SLOTS - 1);
#pragma unroll
      for (int r = 0; r < LOADS; ++r) {
        const int2 rc = at(s, r);
        uint32_t off = static_cast<uint32_t>(rc.x * seq + rc.y) * 2u;
        hipk::opaque(off);
        hipk::load_raw_vec<W>(reinterpret_cast<const T*>(base + off), w[i][r]);
      }
    }
  }

  /// Bounds-checked load of the tile whose first row is `x`: `rows` valid rows, D columns.
  __device__ __forceinline__ void load_checked(const T* x, int64_t seq, int rows, int D,
                                               bool aligned, int tid) {
#pragma unroll
    for (int i = 0; i < NS; ++i) {
      const int s = tid + i * THREADS;
#pragma unroll
      for (int r = 0; r < LOADS; ++r) {
        const int2 rc = at(s, r);
        const bool ok = (SLOTS % THREADS == 0 || s < SLOTS) && rc.x < rows;
        hipk::load_raw<V>(x + static_cast<int64_t>(ok ? rc.x : 0) * seq + rc.y,
                          ok ? D - rc.y : 0, aligned, w[i][r]);
      }
    }
  }

  /// load_fast() when FAST (the caller knows fast_ok() holds: no checked code is compiled),
  /// else whichever fast_ok() allows.
  template <bool FAST>
  __device__ __forceinline__ void load(const T* x, int64_t seq, int rows, int D, bool aligned,
                                       int tid) {
    if (FAST || fast_ok(rows, D, seq, aligned)) {
      load_fast(x, seq, tid);
    } else {
      load_checked(x, seq, rows, D, aligned, tid);
    }
  }

  /// Writes the registers into the LDS tile (halves).
  __device__ __forceinline__ void store(uint16_t* lds, int tid) const {
#pragma unroll
    for (int i = 0; i < NS; ++i) {
      const int s = tid + i * THREADS;
      if (SLOTS % THREADS != 0 && s >= SLOTS) break;
      if constexpr (TRANS) {
        // w[r] holds 4 columns of the row at position p0 + r; LDS row c0 + u takes the 4
        // positions p0..p0 + 3 of column c0 + u.
        const int p0 = (s / (DB / 4)) * 4;
        const int c0 = (s % (DB / 4)) * 4;
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const uint32_t sel = u % 2 == 0 ? 0x05040100u : 0x07060302u;
          const uint32_t lo = __builtin_amdgcn_perm(w[i][1][u / 2], w[i][0][u / 2], sel);
          const uint32_t hi = __builtin_amdgcn_perm(w[i][3][u / 2], w[i][2][u / 2], sel);
          *reinterpret_cast<uint2*>(lds + (c0 + u) * PITCH + p0) = uint2{lo, hi};
        }
      } else {
        const int2 rc = at(s, 0);
        *reinterpret_cast<uint4*>(lds + rc.x * PITCH + rc.y) =
            uint4{w[i][0][0], w[i][0][1], w[i][0][2], w[i][0][3]};
      }
    }
  }
};

/// This lane's operand of a 16 x 16 tile at (row0, col0) of an LDS tile with `pitch` halves
/// per row: row row0 + lane % 16, columns col0 + 4 (lane / 16) .. + 3 (mc_layout.h).
template <typename Vec>
__device__ __forceinline__ Vec lds_op(const uint16_t* lds, int pitch, int row0, int col0,
                                      int lane) {
  return *reinterpret_cast<const Vec*>(lds + (row0 + lane % 16) * pitch + col0 + 4 * (lane / 16));
}

/// This lane's operands of its own row `row` of a tensor (rows of `rows`; nothing read when
/// !ok): columns 16 t + 4 (lane / 16) .. + 3 for t < ND, zeros past D.
template <typename T, typename Vec, int ND>
__device__ __forceinline__ void load_own(Vec (&op)[ND], const hipk_attn::Rows<const T>& rows,
                                         int row, bool ok, int D, bool aligned, int lane) {
  const T* x = rows.row(ok ? row : 0);
#pragma unroll
  for (int t = 0; t < ND; ++t) {
    const int col = 16 * t + 4 * (lane / 16);
    uint32_t w[2];
    hipk::load_raw<4>(x + col, ok ? D - col : 0, aligned, w);
    op[t] = vec_of<Vec>(w);
  }
}

/// Sum and max over the 4 lanes l % 16 + 16 i (the lanes that share a row of the lane roles).
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor(x, 16);
  return x + __shfl_xor(x, 32);
}
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor(x, 16));
  return fmaxf(x, __shfl_xor(x, 32));
}

}  // namespace hipk_attn_mc
