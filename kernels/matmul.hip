// kernels/matmul.hip — tiled GEMM: out = alpha * op(A) * op(B) + beta * C, row-major, strided batch.
//
// NEVER RUN ON A GPU. This file has only been compiled and resource-checked for gfx906
// (hipcc 5.2 / clang 15, --genco -O3, -Rpass-analysis=kernel-resource-usage); its results have
// not been compared with the CPU reference on a device. Indexing and masking were reviewed by hand.
//
// Exported kernels (C linkage), one per tile size x layout x dtype, 24 in all:
//   matmul_<ab>_<dtype>        128x128 block tile (big problems)
//   matmul_small_<ab>_<dtype>   64x64 block tile  (skinny problems or few tiles; more blocks)
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
// Launch: block (256, 1, 1); grid (ceil(N / BN), ceil(M / BM), items), one batch item per
// blockIdx.z; the launcher splits batches over 65535 items into launches with offset pointers.
// No dynamic LDS.
//
// Algorithm: each block owns a BM x BN tile of out. K is walked in BK-deep slices: the A and B
// slices are loaded from global memory (one 8- or 16-byte vector load per thread and operand when
// aligned and inside the matrix, scalar otherwise) into registers, converted, and written into
// LDS "k-major" (sm[k][m], sm[k][n]) whatever the layout, so the inner loop is the same for all
// four layouts. LDS is double buffered: slice t+1 is fetched from global memory while slice t is
// multiplied, then written into the other buffer; one barrier per slice. Each thread keeps a
// TM x TN = 8x8 (4x4 for the small tile) register block of accumulators; its rows are TM/4
// groups of 4 consecutive rows, THR_M*4 apart (the same for columns), so the fragments are
// 16-byte LDS reads without bank conflicts.
//   f32 and bf16: LDS holds f32 (bf16 widened exactly on the way in); one v_fma_f32 per MAC.
//   f16: LDS holds k-pairs of halves (sm[k/2][m] = {A[m][k], A[m][k+1]}), and the inner loop uses
//        v_dot2_f32_f16 (__builtin_amdgcn_fdot2: two f16 products summed into an f32
//        accumulator per instruction) on targets that have it, f32 FMAs elsewhere.
//
// Tiles (256 threads = 4 wave64, 16x16 threads):
//   big:   BM = BN = 128, TM = TN = 8, BK = 8 (f32/bf16) or 16 (f16); LDS 16896 bytes
//   small: BM = BN = 64,  TM = TN = 4, BK = 16 (f32/bf16) or 32 (f16); LDS 17408 bytes
// LDS <= 32 KiB and <= 128 VGPRs, so at least 2 blocks (2 waves per SIMD) fit on a 64 KiB CU.
//
// gfx906 resource figures (hipcc 5.2 / clang 15, -O3, -Rpass-analysis=kernel-resource-usage),
// all 24 kernels: scratch 0, SGPR spills 0, VGPR spills 0.
//   big   f32 / bf16  VGPRs 103-108  SGPRs 55-57  LDS 16896  occupancy 2 waves/SIMD
//   big   f16         VGPRs 113-118  SGPRs 64-65  LDS 16896  occupancy 2
//   small f32 / bf16  VGPRs  48-53   SGPRs 55-56  LDS 17408  occupancy 4-5
//   small f16         VGPRs  57-62   SGPRs 64-65  LDS 17408  occupancy 4
// Kernels are declared __launch_bounds__(256, 2) (at most 128 VGPRs). Two things were needed to
// get there: no grid-stride batch loop (LICM hoisted every row address out of it: 150 VGPRs and
// SGPR spills) and a non-unrolled k-row loop (see the comment there).
// Performance: never measured (no device here). Targets from the issue, unverified: f32 >= 80 %
// of hipBLAS at 4096^3 and >= 100 % on the skinny shapes.

#include "common.h"
#include "tile_io.h"

namespace hipk_matmul {

using hipk::bf16;

constexpr int kThreads = 256;

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

/// Writes one f32 value (already exact in the storage precision) as element (k, mn) of an LDS
/// operand tile whose rows hold `stride` words.
__device__ __forceinline__ void lds_put(float* sm, int stride, int k, int mn, float x) {
  sm[k * stride + mn] = x;
}
__device__ __forceinline__ void lds_put(half2_t* sm, int stride, int k, int mn, float x) {
  reinterpret_cast<_Float16*>(sm)[2 * ((k >> 1) * stride + mn) + (k & 1)] =
      static_cast<_Float16>(x);
}
/// Writes elements (k, mn) and (k + 1, mn), k even.
__device__ __forceinline__ void lds_put_pair(float* sm, int stride, int k, int mn, float x0,
                                             float x1) {
  sm[k * stride + mn] = x0;
  sm[(k + 1) * stride + mn] = x1;
}
__device__ __forceinline__ void lds_put_pair(half2_t* sm, int stride, int k, int mn, float x0,
                                             float x1) {
  half2_t w;
  w.x = static_cast<_Float16>(x0);
  w.y = static_cast<_Float16>(x1);
  sm[(k >> 1) * stride + mn] = w;
}

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

/// One operand slice: MN rows of op(X) (M for A, N for B) by BK values of k. K_CONTIG says
/// whether k is the contiguous dimension in memory (A not transposed, B transposed). Each of
/// the 256 threads moves exactly V = MN * BK / 256 consecutive elements of memory.
template <typename T, typename Path, int MN, int BK, bool K_CONTIG> struct Stager {
  static constexpr int V = MN * BK / kThreads;
  static constexpr int COLS = K_CONTIG ? BK : MN;  // contiguous extent of the slice in memory
  static constexpr int SLOTS_PER_ROW = COLS / V;
  static_assert(V == 4 || V == 8, "one 4- or 8-element vector per thread");
  static_assert(COLS % V == 0 && (MN * BK) % (V * kThreads) == 0, "slice tiles the block");
  static_assert(!K_CONTIG || V % 2 == 0, "k pairs stay in one thread");

  float r[V];

  /// Loads the slice starting at (mn0, k0). x points at the batch item's first element; ld is
  /// its row pitch; mn_total is M (for A) or N (for B); vec_ok from hipk::rows_aligned<V>.
  /// Elements outside the matrix read as 0 and are never touched in memory.
  __device__ __forceinline__ void load(const T* x, int64_t ld, int mn_total, int k_total,
                                       int mn0, int k0, bool vec_ok, int tid) {
    const int row = tid / SLOTS_PER_ROW;
    const int col = (tid % SLOTS_PER_ROW) * V;
    // Memory row / column of this thread's vector, and the matrix extent along each.
    const int grow = (K_CONTIG ? mn0 : k0) + row;
    const int rows = K_CONTIG ? mn_total : k_total;
    const int gcol = (K_CONTIG ? k0 : mn0) + col;
    const int cols = K_CONTIG ? k_total : mn_total;
    // A row past the matrix loads nothing: valid = 0 (gcol < 2^31 - V, so no overflow).
    const int valid = grow < rows ? cols - gcol : 0;
    hipk::load_vec<V>(x + static_cast<int64_t>(grow) * ld + gcol, valid, vec_ok, r);
  }

  /// Writes the registers into the LDS slice sm (BK / KP rows of `stride` words, k-major).
  __device__ __forceinline__ void store(typename Path::Word* sm, int stride, int tid) const {
    const int row = tid / SLOTS_PER_ROW;
    const int col = (tid % SLOTS_PER_ROW) * V;
    if constexpr (K_CONTIG) {
      // Memory row = mn, the V values are k = col .. col + V - 1 (col even).
#pragma unroll
      for (int u = 0; u < V; u += 2) lds_put_pair(sm, stride, col + u, row, r[u], r[u + 1]);
    } else {
      // Memory row = k, the V values are mn = col .. col + V - 1.
#pragma unroll
      for (int u = 0; u < V; ++u) lds_put(sm, stride, row, col + u, r[u]);
    }
  }
};

// ---------------------------------------------------------------------------------------------
// The GEMM
// ---------------------------------------------------------------------------------------------

template <typename T, bool TRANS_A, bool TRANS_B, int BM, int BN, int BK, int TM, int TN>
__device__ __forceinline__ void gemm(const T* __restrict__ a, const T* __restrict__ b,
                                     const T* c, T* out, int M, int N, int K, int64_t lda,
                                     int64_t ldb, int64_t ldc, int64_t ldo, int64_t stride_a,
                                     int64_t stride_b, int64_t stride_c, int64_t stride_o,
                                     float alpha, float beta) {
  using Path = typename PathOf<T>::type;
  using Word = typename Path::Word;
  constexpr int KP = Path::KP;
  constexpr int KROWS = BK / KP;  // LDS rows per slice
  constexpr int THR_N = BN / TN;  // threads along n
  constexpr int THR_M = BM / TM;  // threads along m
  static_assert(THR_M * THR_N == kThreads, "thread grid covers the tile");
  static_assert(TM % 4 == 0 && TN % 4 == 0 && BK % KP == 0, "fragments are 4-wide");
  constexpr int PAD = 4;  // words; keeps rows 16-byte aligned and shifts banks between rows
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

  Stager<T, Path, BM, BK, !TRANS_A> stage_a;
  Stager<T, Path, BN, BK, TRANS_B> stage_b;
  using StageA = decltype(stage_a);
  using StageB = decltype(stage_b);
  const bool a_vec = hipk::rows_aligned<StageA::V>(a, lda, stride_a);
  const bool b_vec = hipk::rows_aligned<StageB::V>(b, ldb, stride_b);
  const bool o_vec = hipk::rows_aligned<4>(out, ldo, stride_o);
  const bool c_vec = beta != 0.0f && hipk::rows_aligned<4>(c, ldc, stride_c);

  // One batch item per blockIdx.z (the launcher splits batches over 65535 into several launches
  // with offset pointers). No grid-stride loop over items on purpose: with one, LICM hoists every
  // row address of the staging and the epilogue out of it and keeps them live across the K loop
  // (that cost ~40 VGPRs and spilled).
  {
    const int64_t item = blockIdx.z;
    const T* a_item = a + item * stride_a;
    const T* b_item = b + item * stride_b;

    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i) {
#pragma unroll
      for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;
    }

    if (nk > 0) {
      stage_a.load(a_item, lda, M, K, m0, 0, a_vec, tid);
      stage_b.load(b_item, ldb, N, K, n0, 0, b_vec, tid);
      stage_a.store(sm_a[0], SA, tid);
      stage_b.store(sm_b[0], SB, tid);
    }
    __syncthreads();

    for (int t = 0; t < nk; ++t) {
      const int cur = t & 1;
      const bool more = t + 1 < nk;
      if (more) {  // fetch slice t + 1 while slice t is multiplied
        stage_a.load(a_item, lda, M, K, m0, (t + 1) * BK, a_vec, tid);
        stage_b.load(b_item, ldb, N, K, n0, (t + 1) * BK, b_vec, tid);
      }
      const Word* pa = sm_a[cur];
      const Word* pb = sm_b[cur];
      // Not unrolled: unrolling lets the scheduler hoist the fragment reads of later k rows
      // ahead of the FMAs, (TM + TN) VGPRs per row; the big f16 tile then spills at the
      // 128-VGPR budget of 2 waves/SIMD. The two resident waves hide the LDS latency instead.
#pragma unroll 1
      for (int kr = 0; kr < KROWS; ++kr) {
        Word fa[TM];
        Word fb[TN];
#pragma unroll
        for (int g = 0; g < TM / 4; ++g) lds_get4(pa + kr * SA + g * THR_M * 4 + ty * 4, fa + 4 * g);
#pragma unroll
        for (int g = 0; g < TN / 4; ++g) lds_get4(pb + kr * SB + g * THR_N * 4 + tx * 4, fb + 4 * g);
#pragma unroll
        for (int i = 0; i < TM; ++i) {
#pragma unroll
          for (int j = 0; j < TN; ++j) acc[i][j] = Path::mac(fa[i], fb[j], acc[i][j]);
        }
      }
      if (more) {  // the other buffer was last read before the previous barrier
        stage_a.store(sm_a[cur ^ 1], SA, tid);
        stage_b.store(sm_b[cur ^ 1], SB, tid);
      }
      __syncthreads();
    }

    // Epilogue: out = alpha * acc + beta * C, 4 consecutive columns at a time.
    T* o_item = out + item * stride_o;
    const T* c_item = c + item * stride_c;  // only dereferenced when beta != 0
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
        hipk::store_vec<4>(o_item + static_cast<int64_t>(m) * ldo + n, valid, o_vec, v);
      }
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

#define HIPK_MM_KERNEL(PREFIX, AB, TA, TB, BM, BN, BKX, TM, TN, SUFFIX, T)                       \
  extern "C" __global__ void __launch_bounds__(256, 2) PREFIX##AB##_##SUFFIX                                                      \
  (const T* a, const T* b, const T* c, T* out, int M, int N, int K, int64_t lda, int64_t ldb,    \
   int64_t ldc, int64_t ldo, int64_t stride_a, int64_t stride_b, int64_t stride_c,               \
   int64_t stride_o, float alpha, float beta) {                                       \
    hipk_matmul::gemm<T, TA, TB, BM, BN, BKX(T), TM, TN>(a, b, c, out, M, N, K, lda, ldb, ldc,  \
                                                        ldo, stride_a, stride_b, stride_c,      \
                                                        stride_o, alpha, beta);          \
  }

#define HIPK_MM_LAYOUTS(PREFIX, BM, BN, BKX, TM, TN, SUFFIX, T)                \
  HIPK_MM_KERNEL(PREFIX, nn, false, false, BM, BN, BKX, TM, TN, SUFFIX, T)     \
  HIPK_MM_KERNEL(PREFIX, nt, false, true, BM, BN, BKX, TM, TN, SUFFIX, T)      \
  HIPK_MM_KERNEL(PREFIX, tn, true, false, BM, BN, BKX, TM, TN, SUFFIX, T)      \
  HIPK_MM_KERNEL(PREFIX, tt, true, true, BM, BN, BKX, TM, TN, SUFFIX, T)

#define HIPK_MM_BIG(SUFFIX, T) HIPK_MM_LAYOUTS(matmul_, 128, 128, HIPK_MM_BK_BIG, 8, 8, SUFFIX, T)
#define HIPK_MM_SMALL(SUFFIX, T) \
  HIPK_MM_LAYOUTS(matmul_small_, 64, 64, HIPK_MM_BK_SMALL, 4, 4, SUFFIX, T)

HIPK_DTYPES(HIPK_MM_BIG)
HIPK_DTYPES(HIPK_MM_SMALL)
