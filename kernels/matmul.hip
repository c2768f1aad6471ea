// kernels/matmul.hip — tiled GEMM: out = alpha * op(A) * op(B) + beta * C, row-major, strided batch,
// optionally with a bias (+ GELU-tanh) epilogue fused into the store.
//
// NEVER RUN ON A GPU. Compiled and resource-checked for gfx906 (hipcc 5.2 / clang 15, --genco
// -O3, -Rpass-analysis=kernel-resource-usage); the device tests ran on hip-emu (the CPU-emulated
// device) against the CPU reference, never on a GPU.
//
// Exported kernels (C linkage), one per tile size x layout x dtype x epilogue, 48 in all:
//   matmul_<ab>_<dtype>              128x128 block tile (big problems)
//   matmul_small_<ab>_<dtype>         64x64 block tile  (skinny problems or few tiles; more blocks)
//   matmul_bias_<ab>_<dtype>, matmul_small_bias_<ab>_<dtype>: the same GEMMs with the bias
//     epilogue (below)
// with <ab> in {nn, nt, tn, tt} (first letter: A transposed?, second: B transposed?) and <dtype>
// in {f32, f16, bf16}. Storage is <dtype>; accumulation is always f32.
//
// Arguments (all kernels): a, b, c, out, M, N, K, lda, ldb, ldc, ldo, stride_a, stride_b,
// stride_c, stride_o, alpha, beta.
//   op(A) is M x K: A is [M, lda>=K] row-major, or [K, lda>=M] when A is transposed.
//   op(B) is K x N: B is [K, ldb>=N] row-major, or [N, ldb>=K] when B is transposed.
//   C and out are [M, ld>=N]; c may alias out. When beta == 0, C is never read (it may be null,
//   uninitialised or NaN, as in BLAS). stride_* are elements between batch items.
//   Any M, N, K >= 0 works: edge tiles load zeros past the matrix (bounds-checked, never an
//   out-of-bounds read) and store only inside it. K == 0 gives out = beta * C.
// The bias kernels take three more: bias, pre_gelu, gelu. v = alpha * acc + beta * C + bias[n]
//   in f32 (bias [N], broadcast over the rows: one value per output column, as GPT-2's / llm.c's
//   Linear layers); pre_gelu (null, or laid out as out: ldo, stride_o) gets v rounded to T;
//   out gets gelu_tanh(v) (gelu != 0, computed in f32 from the unrounded v) or v, rounded once to
//   T. The epilogue is a template flag: the plain kernels' code is instruction-for-instruction
//   what it was before the bias kernels existed; pre_gelu and gelu are wave-uniform branches.
// Launch: block (256, 1, 1); grid (ceil(N / BN), ceil(M / BM), items), one batch item per
// blockIdx.z; the launcher splits batches over 65535 items into launches with offset pointers.
// No dynamic LDS.
//
// Algorithm: each block owns a BM x BN tile of out. K is walked in BK-deep slices, staged
// global -> registers -> LDS "k-major" (sm[k][m], sm[k][n]) whatever the layout, so the inner
// loop is the same for all four layouts. LDS is double buffered with one barrier per slice:
// slice t+1 is loaded into registers while slice t is multiplied, then written into the other
// buffer. Each thread keeps a TM x TN = 8x8 (4x4 for the small tile) register block of
// accumulators; its rows are TM/4 groups of 4 consecutive rows, THR_M*4 apart (the same for
// columns), so the fragments are 16-byte LDS reads without bank conflicts.
//   f32 and bf16: LDS holds f32 (bf16 widened exactly); one v_fma_f32 (v_fmac) per MAC.
//   f16: LDS holds k-pairs of halves (sm[k/2][m] = {A[m][k], A[m][k+1]}), and the inner loop uses
//        v_dot2_f32_f16 (__builtin_amdgcn_fdot2: two f16 products summed into an f32
//        accumulator per instruction) on targets that have it, f32 FMAs elsewhere.
// What keeps the math unit busy (static figures below):
//   - the staging registers hold the raw words as loaded; bf16 widening and f16 k-pairing
//     (v_perm_b32) happen at the LDS store, after the slice's math, so the only vmcnt wait of a
//     slice sits after its FMAs;
//   - interior blocks (whole tile inside M x N, K a multiple of BK, aligned rows, row pitch
//     <= 2^22) take a K loop with no bounds checks and no branches: the prefetch of "slice nk"
//     re-reads slice nk-1 (uniform select); addresses are a uniform 64-bit base plus a 32-bit
//     per-thread offset (scalar-base global_load, no VALU address math); the loop is unrolled by
//     two slices so every LDS address is a register plus an immediate (not for the big f16
//     tile, where that costs 2 spilled VGPRs). Edge blocks, unaligned or partial-K problems take
//     a bounds-checked loop (rolled k rows, same staging);
//   - the k-row loop is fully unrolled with the fragments double-buffered in registers: row
//     kr+1's LDS reads are issued before row kr's FMAs (4 reads in flight; a scheduling barrier
//     per row keeps the look-ahead at one row, which bounds the fragment registers). The
//     pipeline crosses the slice boundary: the next slice is stored to LDS halfway through the
//     current one, the barrier comes before the last k row's FMAs, and row 0 of the next slice
//     is read before them, so no LDS or global wait of the interior loop stalls.
//
// Tiles (256 threads = 4 wave64, 16x16 threads):
//   big:   BM = BN = 128, TM = TN = 8, BK = 8 (f32/bf16) or 16 (f16); LDS 16896 bytes; 2 waves/SIMD
//   small: BM = BN = 64,  TM = TN = 4, BK = 16 (f32/bf16) or 32 (f16); LDS 16384 bytes (no row
//          padding: 4 blocks = 16 waves per 64 KiB CU); <= 64 VGPRs (__launch_bounds__(256, 4))
//
// gfx906 resource figures (hipcc 5.2 / clang 15, -O3, -Rpass-analysis=kernel-resource-usage),
// all 48 kernels: scratch 0, SGPR spills 0, VGPR spills 0.
//   big   f32 / bf16  VGPRs 126-128  LDS 16896  occupancy 2 waves/SIMD
//   big   f16         VGPRs 116-118  LDS 16896  occupancy 2
//   small             VGPRs  49-57   LDS 16384  occupancy 4 (LDS: 4 blocks per CU)
// The bias kernels have their plain twin's VGPRs and hot-loop figures (2 more SGPRs).
// Static hot-loop figures (`cargo xtask isa-report`, loop k_interior, docs/ISA-REPORT.md):
//   math/VALU and issue-bound estimate of FMA peak: big f32 99.6-100 %, f16 96.6-97.7 %,
//   bf16 98.1-98.5 %; small f32 100 %, f16 97.0-100 %, bf16 97.0 %; 0 blocking waits; LDS
//   1.0 (big f32/bf16), 0.5 (big f16), 2.0 / 1.0 (small) bytes per FMA-class instruction: the
//   small f32/bf16 tile sits exactly at the LDS bandwidth bound of the report's model.
// Performance: never measured (no device here); the figures above are static.

#include "common.h"
#include "gelu.h"
#include "tile_io.h"

namespace hipk_matmul {

using hipk::bf16;

constexpr int kThreads = 256;
/// Largest row pitch (elements) of the unchecked path: a thread's byte offset inside a slice
/// (under 128 rows of pitch ld, 4-byte elements) then fits 32 bits.
constexpr int64_t kMaxFastLd = int64_t{1} << 22;

// Half-precision k-pair as used by v_dot2_f32_f16.
typedef _Float16 half2_t __attribute__((ext_vector_type(2)));

#if defined(__gfx906__) || defined(__gfx908__) || defined(__gfx90a__) || defined(__gfx926__) || \
    defined(__gfx928__) || defined(__gfx936__) || defined(__gfx938__) || defined(__gfx940__) ||   \
    defined(__gfx942__)
#define HIPK_MATMUL_HAVE_FDOT2 1
#else
#define HIPK_MATMUL_HAVE_FDOT2 0
#endif

// ---------------------------------------------------------------------------------------------
// How a storage type is held in LDS and multiplied.
// ---------------------------------------------------------------------------------------------

/// f32 / bf16: one f32 per k in LDS, one FMA per multiply-add.
struct F32Path {
  using Word = float;
  static constexpr int KP = 1;  // k values per LDS word
  __device__ static __forceinline__ float mac(float a, float b, float acc) {
    return __builtin_fmaf(a, b, acc);
  }
};

/// f16: two consecutive k per LDS word (a half2), one dot2 per two multiply-adds.
struct F16Path {
  using Word = half2_t;
  static constexpr int KP = 2;
  __device__ static __forceinline__ float mac(half2_t a, half2_t b, float acc) {
#if HIPK_MATMUL_HAVE_FDOT2
    return __builtin_amdgcn_fdot2(a, b, acc, false);
#else
    acc = __builtin_fmaf(static_cast<float>(a.x), static_cast<float>(b.x), acc);
    return __builtin_fmaf(static_cast<float>(a.y), static_cast<float>(b.y), acc);
#endif
  }
};

template <typename T> struct PathOf { using type = F32Path; };
template <> struct PathOf<__half> { using type = F16Path; };

/// Reads 4 consecutive LDS words (16 bytes, 16-byte aligned) into w[0..4).
__device__ __forceinline__ void lds_get4(const float* p, float* w) {
  const float4 v = *reinterpret_cast<const float4*>(p);
  w[0] = v.x;
  w[1] = v.y;
  w[2] = v.z;
  w[3] = v.w;
}
__device__ __forceinline__ void lds_get4(const half2_t* p, half2_t* w) {
  const uint4 v = *reinterpret_cast<const uint4*>(p);
  w[0] = __builtin_bit_cast(half2_t, v.x);
  w[1] = __builtin_bit_cast(half2_t, v.y);
  w[2] = __builtin_bit_cast(half2_t, v.z);
  w[3] = __builtin_bit_cast(half2_t, v.w);
}

// ---------------------------------------------------------------------------------------------
// Global -> register -> LDS staging of one operand slice (MN x BK of op(X)).
// ---------------------------------------------------------------------------------------------

/// Element u (0-based) of a run of 32-bit words holding packed elements of T, widened to f32.
template <typename T> __device__ __forceinline__ float word_elem(const uint32_t* w, int u) {
  if constexpr (sizeof(T) == 4) {
    return __uint_as_float(w[u]);
  } else {  // bf16 (the f16 path never widens): low half first, widened by placing it high
    return __uint_as_float(u % 2 == 0 ? w[u / 2] << 16 : w[u / 2] & 0xffff0000u);
  }
}

/// One operand slice: MN rows of op(X) (M for A, N for B) by BK values of k. K_CONTIG says
/// whether k is the contiguous dimension in memory (A not transposed, B transposed). Each of
/// the 256 threads moves V = MN * BK / 256 elements: R memory rows (1, or 2 consecutive k rows
/// for f16 with k not contiguous, so that it can build the k-pairs itself) of VR = V / R
/// consecutive elements.
///
/// The registers hold the raw words as loaded; conversion (bf16 widening, f16 k-pairing) happens
/// in store(), after the slice that was multiplied meanwhile, so no wait for the load sits in
/// front of that slice's math.
template <typename T, typename Path, int MN, int BK, bool K_CONTIG> struct Stager {
  static constexpr int V = MN * BK / kThreads;
  static constexpr int R = (Path::KP == 2 && !K_CONTIG) ? 2 : 1;
  static constexpr int VR = V / R;                           // elements per memory row
  static constexpr int COLS = K_CONTIG ? BK : MN;            // contiguous extent of the slice
  static constexpr int SLOTS = COLS / VR;                    // threads per memory row
  static constexpr int WR = VR * static_cast<int>(sizeof(T)) / 4;  // words per memory row
  static_assert(V == 4 || V == 8, "4 or 8 elements per thread");
  static_assert(COLS % VR == 0 && kThreads % SLOTS == 0, "slice tiles the block");
  static_assert((kThreads / SLOTS) * R * COLS == MN * BK, "every element moved once");
  static_assert(WR >= 1 && (VR * sizeof(T)) % 4 == 0, "whole words per row");
  static_assert(!K_CONTIG || V % 2 == 0, "k pairs stay in one thread");

  uint32_t w[R][WR];

  __device__ __forceinline__ static int row0(int tid) { return (tid / SLOTS) * R; }
  __device__ __forceinline__ static int col0(int tid) { return (tid % SLOTS) * VR; }

  /// Offset (elements, uniform) of the slice at (mn0, k0) from the item's first element.
  __device__ __forceinline__ static int64_t origin(int64_t ld, int mn0, int k0) {
    return K_CONTIG ? static_cast<int64_t>(mn0) * ld + k0 : static_cast<int64_t>(k0) * ld + mn0;
  }
  /// Byte offset of this thread's first element from the slice origin. Fits 32 bits when
  /// ld <= kMaxFastLd (the slice spans fewer than 128 rows).
  __device__ __forceinline__ static uint32_t thread_bytes(int64_t ld, int tid) {
    return static_cast<uint32_t>((row0(tid) * ld + col0(tid)) * static_cast<int64_t>(sizeof(T)));
  }

  /// Unchecked load of the slice whose origin is `o` (uniform): every element is inside the
  /// matrix and each row start is aligned to VR elements. The address is a uniform 64-bit base
  /// plus a 32-bit per-thread offset, so the compiler can use the scalar-base form of
  /// global_load (no 64-bit VALU address arithmetic in the loop).
  __device__ __forceinline__ void load_fast(const T* o, uint32_t off, int64_t ld) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const char* base = reinterpret_cast<const char*>(o + r * ld);
      hipk::load_raw_vec<WR>(reinterpret_cast<const T*>(base + off), w[r]);
    }
  }

  /// Checked load of the slice starting at (mn0, k0). x points at the batch item's first
  /// element; mn_total is M (for A) or N (for B); vec_ok from hipk::rows_aligned<VR>. Elements
  /// outside the matrix read as 0 and are never touched in memory.
  __device__ __forceinline__ void load_checked(const T* x, int64_t ld, int mn_total,
                                               int k_total, int mn0, int k0, bool vec_ok,
                                               int tid) {
    const int rows = K_CONTIG ? mn_total : k_total;
    const int cols = K_CONTIG ? k_total : mn_total;
    const int grow = (K_CONTIG ? mn0 : k0) + row0(tid);
    const int gcol = (K_CONTIG ? k0 : mn0) + col0(tid);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      // A row past the matrix loads nothing: valid = 0 (gcol < 2^31 - V, so no overflow).
      const int valid = grow + r < rows ? cols - gcol : 0;
      const int64_t row = grow + r < rows ? grow + r : 0;
      hipk::load_raw<VR>(x + row * ld + gcol, valid, vec_ok, w[r]);
    }
  }

  /// Converts and writes the registers into the LDS slice sm (BK / KP rows of `stride` words,
  /// k-major).
  __device__ __forceinline__ void store(typename Path::Word* sm, int stride, int tid) const {
    const int row = row0(tid);
    const int col = col0(tid);
    if constexpr (Path::KP == 2) {
      if constexpr (K_CONTIG) {
        // Memory row = mn; word j already is the k-pair (col + 2j, col + 2j + 1).
        uint32_t* base = reinterpret_cast<uint32_t*>(sm) + (col / 2) * stride + row;
#pragma unroll
        for (int j = 0; j < WR; ++j) base[j * stride] = w[0][j];
      } else {
        // Memory rows k = row (even) and k + 1; pair the halves of the same mn column.
        uint32_t p[VR];
#pragma unroll
        for (int e = 0; e < VR; ++e) {
          // Low (even e) or high halves of the two rows' word, in one v_perm_b32.
          p[e] = __builtin_amdgcn_perm(w[1][e / 2], w[0][e / 2],
                                       e % 2 == 0 ? 0x05040100u : 0x07060302u);
        }
        static_assert(VR == 4, "one 16-byte LDS write");
        *reinterpret_cast<uint4*>(reinterpret_cast<uint32_t*>(sm) + (row / 2) * stride + col) =
            uint4{p[0], p[1], p[2], p[3]};
      }
    } else {
      if constexpr (K_CONTIG) {
        // Memory row = mn, the V values are k = col .. col + V - 1.
        float* base = reinterpret_cast<float*>(sm) + col * stride + row;
#pragma unroll
        for (int u = 0; u < V; ++u) base[u * stride] = word_elem<T>(w[0], u);
      } else {
        // Memory row = k, the V values are mn = col .. col + V - 1 (16-byte aligned).
        float* base = reinterpret_cast<float*>(sm) + row * stride + col;
#pragma unroll
        for (int u = 0; u < V; u += 4) {
          *reinterpret_cast<float4*>(base + u) =
              make_float4(word_elem<T>(w[0], u), word_elem<T>(w[0], u + 1),
                          word_elem<T>(w[0], u + 2), word_elem<T>(w[0], u + 3));
        }
      }
    }
  }
};

// ---------------------------------------------------------------------------------------------
// The GEMM
// ---------------------------------------------------------------------------------------------

/// Reads the A and B fragments of LDS row `kr` (pa, pb: this thread's first column).
template <int TM, int TN, int THR_M, int THR_N, int SA, int SB, typename Word>
__device__ __forceinline__ void read_frags(const Word* pa, const Word* pb, int kr,
                                           Word (&fa)[TM], Word (&fb)[TN]) {
#pragma unroll
  for (int g = 0; g < TM / 4; ++g) lds_get4(pa + kr * SA + g * THR_M * 4, fa + 4 * g);
#pragma unroll
  for (int g = 0; g < TN / 4; ++g) lds_get4(pb + kr * SB + g * THR_N * 4, fb + 4 * g);
}

/// Multiplies one LDS slice (pa, pb) into the accumulators: KROWS k rows, fully unrolled, the
/// fragments double-buffered in registers. On entry row 0's fragments are in set 0 (read
/// already); row kr + 1 is read into the other set while row kr is multiplied. Halfway,
/// `mid()` runs (the LDS store of the next slice: its global loads have had half a slice of
/// FMAs to arrive, and the store has the other half to complete before the barrier). Before
/// the last row's FMAs, `end()` runs (the barrier) and row 0 of the next slice (na, nb) is read
/// into set 0, so its latency hides behind the last row's FMAs instead of stalling the next
/// slice's first row.
template <typename Path, int KROWS, int TM, int TN, int THR_M, int THR_N, int SA, int SB,
          typename Mid, typename End>
__device__ __forceinline__ void multiply_slice(const typename Path::Word* pa,
                                               const typename Path::Word* pb,
                                               const typename Path::Word* na,
                                               const typename Path::Word* nb,
                                               typename Path::Word (&fa)[2][TM],
                                               typename Path::Word (&fb)[2][TN],
                                               float (&acc)[TM][TN], Mid mid, End end) {
  static_assert(KROWS % 2 == 0, "row 0 of the next slice lands in set 0");
#pragma unroll
  for (int kr = 0; kr < KROWS; ++kr) {
    const int cur = kr & 1;
    // Reads one row ahead of their use and no further: the scheduler would otherwise hoist
    // later rows' reads too, (TM + TN) VGPRs per row, and spill at the 128-VGPR budget of 2
    // waves/SIMD.
    hipk::sched_barrier();
    if (kr == KROWS / 2) mid();
    if (kr + 1 < KROWS) {
      read_frags<TM, TN, THR_M, THR_N, SA, SB>(pa, pb, kr + 1, fa[cur ^ 1], fb[cur ^ 1]);
    } else {
      end();
      read_frags<TM, TN, THR_M, THR_N, SA, SB>(na, nb, 0, fa[0], fb[0]);
    }
    hipk::sched_barrier();
#pragma unroll
    for (int i = 0; i < TM; ++i) {
#pragma unroll
      for (int j = 0; j < TN; ++j) acc[i][j] = Path::mac(fa[cur][i], fb[cur][j], acc[i][j]);
    }
  }
}

/// multiply_slice for the bounds-checked path (edge blocks): the k-row loop is not unrolled
/// and each row's fragments are read and then used. The checked loads of the next slice need
/// many address registers, which the unrolled form's fragment registers cannot spare.
template <typename Path, int KROWS, int TM, int TN, int THR_M, int THR_N, int SA, int SB>
__device__ __forceinline__ void multiply_slice_rolled(const typename Path::Word* pa,
                                                      const typename Path::Word* pb,
                                                      float (&acc)[TM][TN]) {
  using Word = typename Path::Word;
#pragma unroll 1
  for (int kr = 0; kr < KROWS; ++kr) {
    Word fa[TM];
    Word fb[TN];
#pragma unroll
    for (int g = 0; g < TM / 4; ++g) lds_get4(pa + kr * SA + g * THR_M * 4, fa + 4 * g);
#pragma unroll
    for (int g = 0; g < TN / 4; ++g) lds_get4(pb + kr * SB + g * THR_N * 4, fb + 4 * g);
#pragma unroll
    for (int i = 0; i < TM; ++i) {
#pragma unroll
      for (int j = 0; j < TN; ++j) acc[i][j] = Path::mac(fa[i], fb[j], acc[i][j]);
    }
  }
}

/// The GEMM. With BIAS (a compile-time flag: the plain kernels' code has no trace of the
/// epilogue), the store adds bias[n] (broadcast over rows) to alpha·acc + beta·C in f32, writes
/// that sum rounded to T to `pre` when pre != null (same ldo / stride_o as out), and applies
/// GELU-tanh in f32 when gelu != 0, then rounds once to T. Without BIAS, bias, pre and gelu
/// are ignored.
template <typename T, bool TRANS_A, bool TRANS_B, int BM, int BN, int BK, int TM, int TN,
          bool BIAS>
__device__ __forceinline__ void gemm(const T* __restrict__ a, const T* __restrict__ b,
                                     const T* c, T* out, int M, int N, int K, int64_t lda,
                                     int64_t ldb, int64_t ldc, int64_t ldo, int64_t stride_a,
                                     int64_t stride_b, int64_t stride_c, int64_t stride_o,
                                     float alpha, float beta, const T* __restrict__ bias,
                                     T* __restrict__ pre, int gelu) {
  using Path = typename PathOf<T>::type;
  using Word = typename Path::Word;
  constexpr int KP = Path::KP;
  constexpr int KROWS = BK / KP;  // LDS rows per slice
  constexpr int THR_N = BN / TN;  // threads along n
  constexpr int THR_M = BM / TM;  // threads along m
  static_assert(THR_M * THR_N == kThreads, "thread grid covers the tile");
  static_assert(TM % 4 == 0 && TN % 4 == 0 && BK % KP == 0, "fragments are 4-wide");
  // Row padding (words): keeps rows 16-byte aligned and shifts banks between k rows for the
  // transposing LDS writes. The small tile has none, to stay at 16 KiB (4 blocks per CU).
  constexpr int PAD = BM >= 128 ? 4 : 0;
  constexpr int SA = BM + PAD;
  constexpr int SB = BN + PAD;

  __shared__ Word sm_a[2][KROWS * SA];
  __shared__ Word sm_b[2][KROWS * SB];

  const int tid = static_cast<int>(threadIdx.x);
  const int tx = tid % THR_N;
  const int ty = tid / THR_N;
  const int m0 = static_cast<int>(blockIdx.y) * BM;
  const int n0 = static_cast<int>(blockIdx.x) * BN;
  const int nk = (K + BK - 1) / BK;

  using StageA = Stager<T, Path, BM, BK, !TRANS_A>;
  using StageB = Stager<T, Path, BN, BK, TRANS_B>;
  StageA stage_a;
  StageB stage_b;
  const bool a_vec = hipk::rows_aligned<StageA::VR>(a, lda, stride_a);
  const bool b_vec = hipk::rows_aligned<StageB::VR>(b, ldb, stride_b);
  const bool o_vec = hipk::rows_aligned<4>(out, ldo, stride_o);
  const bool c_vec = beta != 0.0f && hipk::rows_aligned<4>(c, ldc, stride_c);
  const bool pre_vec = BIAS && pre != nullptr && hipk::rows_aligned<4>(pre, ldo, stride_o);
  // Interior block (decided once, uniform): every slice is whole, in range and aligned, so the
  // K loop has no bounds checks and no branches.
  const bool interior = a_vec && b_vec && m0 + BM <= M && n0 + BN <= N && K > 0 &&
                        K % BK == 0 && lda <= kMaxFastLd && ldb <= kMaxFastLd;

  // One batch item per blockIdx.z (the launcher splits batches over 65535 into several launches
  // with offset pointers). No grid-stride loop over items on purpose: with one, LICM hoists every
  // row address of the staging and the epilogue out of it and keeps them live across the K loop
  // (that cost ~40 VGPRs and spilled).
  const int64_t item = blockIdx.z;
  const T* a_item = a + item * stride_a;
  const T* b_item = b + item * stride_b;

  float acc[TM][TN];
#pragma unroll
  for (int i = 0; i < TM; ++i) {
#pragma unroll
    for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;
  }

  // This thread's fragment columns in an LDS slice.
  const int frag_a = ty * 4;
  const int frag_b = tx * 4;
  if (interior) {
    // Slice t + 1 is loaded (raw words) while slice t is multiplied, then converted into the
    // other LDS buffer; one barrier per slice. The load of "slice nk" re-reads slice nk - 1
    // (in range) instead of branching; its LDS store goes to the unused buffer.
    // f16 with the big tile keeps a rolled loop: unrolled, the two buffers' addresses push it
    // past 128 VGPRs (2 spilled registers); rolled it pays ~4 VALU per slice to switch buffers.
    constexpr bool kUnroll2 = !(KP == 2 && BM >= 128);
    // The report's hot loop: the first loop after the marker (the prologue has none), one
    // iteration = two slices. Not marked in the rolled form: there the marker shifts the
    // register allocation of the loop, which --verify-markers rejects; the report's automatic
    // region finds the same loop.
    if constexpr (kUnroll2) HIPK_HOT_LOOP_BEGIN("k_interior");
    uint32_t off_a = StageA::thread_bytes(lda, tid);
    uint32_t off_b = StageB::thread_bytes(ldb, tid);
    stage_a.load_fast(a_item + StageA::origin(lda, m0, 0), off_a, lda);
    stage_b.load_fast(b_item + StageB::origin(ldb, n0, 0), off_b, ldb);
    stage_a.store(sm_a[0], SA, tid);
    stage_b.store(sm_b[0], SB, tid);
    __syncthreads();
    Word fa[2][TM];
    Word fb[2][TN];
    read_frags<TM, TN, THR_M, THR_N, SA, SB>(sm_a[0] + frag_a, sm_b[0] + frag_b, 0, fa[0], fb[0]);
    // One slice; `cur` is a constant after inlining (the loop below is unrolled by two), so
    // every LDS address is a loop-invariant register plus an immediate offset.
    auto slice = [&](int t, int cur) __attribute__((always_inline)) {
      const int k_next = (t + 1 < nk ? t + 1 : t) * BK;  // uniform select, not a branch
      // Loop-carried and opaque: keeps the offsets' zero-extension inside the loop, so the
      // loads below use the scalar-base form (see hipk::opaque).
      hipk::opaque(off_a);
      hipk::opaque(off_b);
      stage_a.load_fast(a_item + StageA::origin(lda, m0, k_next), off_a, lda);
      stage_b.load_fast(b_item + StageB::origin(ldb, n0, k_next), off_b, ldb);
      // Keeps the global loads above the slice's LDS reads: without it the scheduler sinks
      // them next to their use (the LDS store), and the wait for them is fully exposed.
      hipk::sched_fence();
      multiply_slice<Path, KROWS, TM, TN, THR_M, THR_N, SA, SB>(
          sm_a[cur] + frag_a, sm_b[cur] + frag_b, sm_a[cur ^ 1] + frag_a, sm_b[cur ^ 1] + frag_b,
          fa, fb, acc,
          [&]() __attribute__((always_inline)) {
            // The other buffer was last read before the previous barrier. Slice "nk" (a
            // re-read of nk - 1) lands in the buffer nobody reads again.
            stage_a.store(sm_a[cur ^ 1], SA, tid);
            stage_b.store(sm_b[cur ^ 1], SB, tid);
          },
          []() __attribute__((always_inline)) { __syncthreads(); });
    };
    int t = 0;
    if constexpr (kUnroll2) {
      for (; t + 2 <= nk; t += 2) {
        slice(t, 0);
        slice(t + 1, 1);
      }
      if (t < nk) slice(t, 0);
    } else {
      for (; t < nk; ++t) slice(t, t & 1);
    }
    if constexpr (kUnroll2) HIPK_HOT_LOOP_END("k_interior");
  } else {
    // Edge blocks, unaligned rows or a partial last slice: bounds-checked loads.
    if (nk > 0) {
      stage_a.load_checked(a_item, lda, M, K, m0, 0, a_vec, tid);
      stage_b.load_checked(b_item, ldb, N, K, n0, 0, b_vec, tid);
      stage_a.store(sm_a[0], SA, tid);
      stage_b.store(sm_b[0], SB, tid);
    }
    __syncthreads();
    for (int t = 0; t < nk; ++t) {
      const int cur = t & 1;
      // Slice nk (past K) loads nothing and stores zeros into the unused buffer.
      stage_a.load_checked(a_item, lda, M, K, m0, (t + 1) * BK, a_vec, tid);
      stage_b.load_checked(b_item, ldb, N, K, n0, (t + 1) * BK, b_vec, tid);
      multiply_slice_rolled<Path, KROWS, TM, TN, THR_M, THR_N, SA, SB>(sm_a[cur] + frag_a,
                                                                      sm_b[cur] + frag_b, acc);
      stage_a.store(sm_a[cur ^ 1], SA, tid);
      stage_b.store(sm_b[cur ^ 1], SB, tid);
      __syncthreads();
    }
  }

  // Epilogue: out = alpha * acc + beta * C (+ bias, GELU), 4 consecutive columns at a time.
  T* o_item = out + item * stride_o;
  const T* c_item = c + item * stride_c;  // only dereferenced when beta != 0
  // The bias of this thread's TN columns, loaded once (f32); columns past N read as 0.
  float bv[TN / 4][4];
  if constexpr (BIAS) {
    const bool bias_vec = hipk::is_aligned(bias, 4 * sizeof(T));
#pragma unroll
    for (int g = 0; g < TN / 4; ++g) {
      const int n = n0 + g * THR_N * 4 + tx * 4;
      hipk::load_vec<4>(bias + n, N - n, bias_vec, bv[g]);
    }
  }
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int m = m0 + (i / 4) * THR_M * 4 + ty * 4 + (i % 4);
    if (m >= M) continue;
#pragma unroll
    for (int g = 0; g < TN / 4; ++g) {
      const int n = n0 + g * THR_N * 4 + tx * 4;
      const int valid = N - n;  // may be <= 0: nothing is read or written
      float v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) v[u] = alpha * acc[i][4 * g + u];
      if (beta != 0.0f) {
        float cv[4];
        hipk::load_vec<4>(c_item + static_cast<int64_t>(m) * ldc + n, valid, c_vec, cv);
#pragma unroll
        for (int u = 0; u < 4; ++u) v[u] = __builtin_fmaf(beta, cv[u], v[u]);
      }
      if constexpr (BIAS) {
#pragma unroll
        for (int u = 0; u < 4; ++u) v[u] += bv[g][u];
        // pre and gelu are kernel arguments: wave-uniform branches.
        if (pre != nullptr) {
          hipk::store_vec<4>(pre + item * stride_o + static_cast<int64_t>(m) * ldo + n, valid,
                             pre_vec, v);
        }
        if (gelu != 0) {
#pragma unroll
          for (int u = 0; u < 4; ++u) v[u] = hipk::gelu_tanh(v[u]);
        }
      }
      hipk::store_vec<4>(o_item + static_cast<int64_t>(m) * ldo + n, valid, o_vec, v);
    }
  }
}

}  // namespace hipk_matmul

// ---------------------------------------------------------------------------------------------
// Exported kernels
// ---------------------------------------------------------------------------------------------

/// BK per tile size and dtype: f16 slices are twice as deep (k-pairs), same LDS bytes.
#define HIPK_MM_BK_BIG(T) (sizeof(T) == 2 && !__is_same(T, ::hipk::bf16) ? 16 : 8)
#define HIPK_MM_BK_SMALL(T) (sizeof(T) == 2 && !__is_same(T, ::hipk::bf16) ? 32 : 16)

#define HIPK_MM_KERNEL(PREFIX, AB, TA, TB, BM, BN, BKX, TM, TN, SUFFIX, T, WAVES)           \
  extern "C" __global__ void __launch_bounds__(256, WAVES) PREFIX##AB##_##SUFFIX(           \
      const T* a, const T* b, const T* c, T* out, int M, int N, int K, int64_t lda,         \
      int64_t ldb, int64_t ldc, int64_t ldo, int64_t stride_a, int64_t stride_b,            \
      int64_t stride_c, int64_t stride_o, float alpha, float beta) {                         \
    hipk_matmul::gemm<T, TA, TB, BM, BN, BKX(T), TM, TN, false>(                             \
        a, b, c, out, M, N, K, lda, ldb, ldc, ldo, stride_a, stride_b, stride_c, stride_o,   \
        alpha, beta, nullptr, nullptr, 0);                                                   \
  }

/// The bias epilogue's kernels: the plain arguments, then bias [N], pre_gelu (null, or laid
/// out as out) and gelu (0 or 1).
#define HIPK_MM_BIAS_KERNEL(PREFIX, AB, TA, TB, BM, BN, BKX, TM, TN, SUFFIX, T, WAVES)      \
  extern "C" __global__ void __launch_bounds__(256, WAVES) PREFIX##bias_##AB##_##SUFFIX(    \
      const T* a, const T* b, const T* c, T* out, int M, int N, int K, int64_t lda,         \
      int64_t ldb, int64_t ldc, int64_t ldo, int64_t stride_a, int64_t stride_b,            \
      int64_t stride_c, int64_t stride_o, float alpha, float beta, const T* bias,            \
      T* pre_gelu, int gelu) {                                                               \
    hipk_matmul::gemm<T, TA, TB, BM, BN, BKX(T), TM, TN, true>(                              \
        a, b, c, out, M, N, K, lda, ldb, ldc, ldo, stride_a, stride_b, stride_c, stride_o,   \
        alpha, beta, bias, pre_gelu, gelu);                                                  \
  }

#define HIPK_MM_LAYOUTS(K, PREFIX, BM, BN, BKX, TM, TN, SUFFIX, T, WAVES)  \
  K(PREFIX, nn, false, false, BM, BN, BKX, TM, TN, SUFFIX, T, WAVES)       \
  K(PREFIX, nt, false, true, BM, BN, BKX, TM, TN, SUFFIX, T, WAVES)        \
  K(PREFIX, tn, true, false, BM, BN, BKX, TM, TN, SUFFIX, T, WAVES)        \
  K(PREFIX, tt, true, true, BM, BN, BKX, TM, TN, SUFFIX, T, WAVES)

#define HIPK_MM_TILES(K, SUFFIX, T)                                                 \
  HIPK_MM_LAYOUTS(K, matmul_, 128, 128, HIPK_MM_BK_BIG, 8, 8, SUFFIX, T, 2)         \
  HIPK_MM_LAYOUTS(K, matmul_small_, 64, 64, HIPK_MM_BK_SMALL, 4, 4, SUFFIX, T, 4)

#define HIPK_MM_PLAIN(SUFFIX, T) HIPK_MM_TILES(HIPK_MM_KERNEL, SUFFIX, T)
#define HIPK_MM_BIAS(SUFFIX, T) HIPK_MM_TILES(HIPK_MM_BIAS_KERNEL, SUFFIX, T)

HIPK_DTYPES(HIPK_MM_PLAIN)
HIPK_DTYPES(HIPK_MM_BIAS)
