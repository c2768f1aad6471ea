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

/// Two f32 (packed math on gfx90a: v_pk_fma_f32, v_pk_add_f32).
typedef float f32x2 __attribute__((ext_vector_type(2)));

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

/// Two f32 rounded toward zero to f16 in one word, lo in the low half (v_cvt_pkrtz_f16_f32 on
/// the device; the same rounding in software on hip-emu's host build).
__device__ __forceinline__ uint32_t pack_f16x2_rtz(float lo, float hi) {
#if defined(__AMDGCN__)
  return __builtin_bit_cast(uint32_t, __builtin_amdgcn_cvt_pkrtz(lo, hi));
#else
  auto rtz = [](float x) -> uint32_t {
    uint32_t b = hipk::to_bits(hipk::from_float<__half>(x));  // nearest, ties to even
    // One step toward zero when nearest rounded away from zero (never for 0 or NaN).
    const float back = hipk::to_float(__ushort_as_half(static_cast<unsigned short>(b)));
    if ((b & 0x7fffu) != 0u && fabsf(back) > fabsf(x)) b -= 1u;
    return b;
  };
  return rtz(lo) | (rtz(hi) << 16);
#endif
}

/// 4 f32 as two operands, hi + lo, with hi = x rounded toward zero to T's significand and
/// lo = (x - hi) rounded toward zero to T: hi + lo carries about twice T's significand
/// (relative error below 2^-20 for f16, 2^-14 for bf16; x - hi is exact), so a product through
/// both tile MACs is close to one with x in f32 (p and dS are f32 in the vector kernels and in
/// the golden tolerances). Rounding toward zero is what keeps it cheap: hi is x with its low
/// significand bits cleared (one AND), and the packing is one v_cvt_pkrtz_f16_f32 (f16) or
/// one v_perm_b32 taking the high halves (bf16) per two values; no conversion back to f32.
/// f16 below its normal range (|x| < 2^-14) loses its bits past 2^-24 (absolute error below
/// 2^-24, as with nearest rounding); x past f16's range is not representable either way.
template <typename T, typename Vec>
__device__ __forceinline__ void split4(const float (&x)[4], Vec& hi, Vec& lo) {
  constexpr bool kBf16 = std::is_same<T, bf16>::value;
  // f32 keeps 24 significant bits; f16 11 (clear 13), bf16 8 (clear 16).
  constexpr uint32_t kMask = kBf16 ? 0xffff0000u : 0xffffe000u;
  float h[4], r[4];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    h[2 * i] = __uint_as_float(__float_as_uint(x[2 * i]) & kMask);
    h[2 * i + 1] = __uint_as_float(__float_as_uint(x[2 * i + 1]) & kMask);
    // Exact: the cleared bits (one packed subtraction for two values).
    const f32x2 d = f32x2{x[2 * i], x[2 * i + 1]} - f32x2{h[2 * i], h[2 * i + 1]};
    r[2 * i] = d[0];
    r[2 * i + 1] = d[1];
  }
  uint32_t wh[2], wl[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if constexpr (kBf16) {
      // The high halves (truncation toward zero), first value in the low half.
      wh[i] = __builtin_amdgcn_perm(__float_as_uint(h[2 * i + 1]), __float_as_uint(h[2 * i]),
                                    0x07060302u);
      wl[i] = __builtin_amdgcn_perm(__float_as_uint(r[2 * i + 1]), __float_as_uint(r[2 * i]),
                                    0x07060302u);
    } else {
      wh[i] = pack_f16x2_rtz(h[2 * i], h[2 * i + 1]);
      wl[i] = pack_f16x2_rtz(r[2 * i], r[2 * i + 1]);
    }
  }
  __builtin_memcpy(&hi, wh, sizeof(hi));
  __builtin_memcpy(&lo, wl, sizeof(lo));
}

/// -x of the 4 16-bit floats of an operand (their sign bits flipped; exact).
template <typename Vec> __device__ __forceinline__ Vec neg4(Vec x) {
  uint32_t w[2];
  __builtin_memcpy(w, &x, sizeof(w));
  w[0] ^= 0x80008000u;
  w[1] ^= 0x80008000u;
  __builtin_memcpy(&x, w, sizeof(w));
  return x;
}

/// Makes the pointer p opaque to the optimiser, held in a VGPR pair at this point (emits no
/// instruction): its computation is not sunk past the loops that follow.
template <typename P> __device__ __forceinline__ void in_vgprs(P*& p) {
#if defined(__AMDGCN__)
  __asm__ __volatile__("" : "+v"(p));
#else
  (void)p;
#endif
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

/// quad_max with no per-call address arithmetic: l ^ 16 by ds_swizzle (bitmask mode: and 31,
/// xor 16, within each 32 lanes), l ^ 32 by ds_bpermute from `bp32` = 4 (lane ^ 32), which the
/// caller computes once outside its loop.
__device__ __forceinline__ float quad_max_at(float x, int bp32) {
  x = fmaxf(x, __int_as_float(__builtin_amdgcn_ds_swizzle(__float_as_int(x), 0x401f)));
  return fmaxf(x, __int_as_float(__builtin_amdgcn_ds_bpermute(bp32, __float_as_int(x))));
}

}  // namespace hipk_attn_mc
