// kernels/matmul_mc.hip — GEMM on the matrix cores: out = alpha * op(A) * op(B) + beta * C,
// row-major, strided batch, f16 or bf16 storage, f32 accumulation, optionally with matmul.hip's
// bias (+ GELU-tanh) epilogue. Written once over the 16x16x16 tile multiply-accumulate of
// kernels/mc_tile.h (MFMA on CDNA, MMAC on Hygon's gfx928 and later), lane layout in
// kernels/mc_layout.h.
//
// NEVER RUN ON A GPU. Compiled for gfx90a with Debian's hipcc 5.2 (clang 15) and checked
// statically (`cargo xtask isa-mc`, docs/ISA-REPORT.md); the device tests ran on hip-emu (the
// CPU-emulated device, which emulates the tile instruction), never on a GPU. The MMAC build
// (gfx928/936/938) needs DTK's hipcc, which is not available here: not compiled, not run.
// On archs without matrix cores (gfx906) the kernels exist with a body that traps; the
// launcher (src/ops/matmul) never picks them there.
//
// Exported kernels (C linkage), 16 in all:
//   matmul_mc_<ab>_<dtype>, matmul_mc_bias_<ab>_<dtype>
// with <ab> in {nn, nt, tn, tt} and <dtype> in {f16, bf16}. Arguments, launch and semantics are
// those of matmul.hip's kernels (same argument list; beta == 0 never reads C; any M, N, K >= 0;
// bias [N] broadcast over rows, pre_gelu null or laid out as out, gelu 0/1).
// Launch: block (256, 1, 1); grid (ceil(N / 128), ceil(M / 128), items), one batch item per
// blockIdx.z. No dynamic LDS.
//
// Algorithm: a block owns a 128 x 128 tile of out; its 4 waves a 64 x 64 quarter each, as a
// 4 x 4 grid of 16 x 16 accumulator tiles (64 f32 per lane). K is walked in 32-deep slices:
// the slice is loaded global -> registers (raw words), stored into LDS "k-contiguous"
// (sa[m][k], sb[n][k]: each lane's 4 consecutive k of one row are one 8-byte LDS read, the
// operand layout of mc_layout.h) whatever the memory layout, and multiplied as 2 k-steps x 16
// tile MACs per wave. The next slice's global loads are issued before the current slice's tile
// MACs, so their latency hides behind 32 matrix instructions; one LDS buffer, two barriers per
// slice. Staging per thread and slice (16 elements of A and 16 of B):
//   k contiguous in memory (A not transposed, B transposed): one row, 16 consecutive k: two
//     16-byte loads, two 16-byte LDS writes;
//   k strided (A transposed, B not transposed): 4 k rows x 4 consecutive m (n): four 8-byte
//     loads, transposed in registers (v_perm_b32) into 4 rows x 4 k, four 8-byte LDS writes.
// Interior blocks (tile inside M x N, K a multiple of 32, rows aligned) take unchecked vector
// loads; edge blocks the same loop with bounds-checked loads (zeros past the matrix, never an
// out-of-bounds read). The epilogue walks the accumulators with the arch's accumulator layout
// (mc_layout.h: MFMA and the assumed MMAC layout differ) and stores only inside the matrix.
//
// LDS: A and B slices of 128 rows x 40 halves (32 k + 8 padding, 80-byte rows keep 16-byte
// alignment and shift banks between rows): 20480 bytes, 3 blocks per 64 KiB CU.
// gfx90a figures (hipcc 5.2 / clang 15, -O3; `cargo xtask isa-mc`, docs/ISA-REPORT.md,
// "Matrix-core matmul (gfx90a)"): all 16 kernels 90-92 VGPRs + 64 AGPRs (the accumulators),
// scratch 0, spills 0, LDS 20480, 3 waves/SIMD; interior loop 32 MFMAs (256 matrix slots) per
// 70-115 issue slots: matrix-bound under the report's overlap model (100 %), 75-87 % with no
// overlap at all, 66-74 % for one wave alone in llvm-mca. gfx908 (compiled by hand, not built
// by default): 0 spills, 2 waves/SIMD.
// Performance: never measured (no device here).

#include "common.h"
#include "gelu.h"
#include "mc_tile.h"
#include "tile_io.h"

namespace hipk_matmul_mc {

using hipk::bf16;

constexpr int kThreads = 256;
constexpr int BM = 128;
constexpr int BN = 128;
constexpr int BK = 32;
constexpr int LDK = BK + 8;  // LDS row pitch in halves (80 bytes)
constexpr int WT = 64;       // wave tile edge
constexpr int TI = WT / hipk::mc::kTile;  // 16x16 tiles per wave tile edge (4)
/// Largest row pitch (elements) of the unchecked path: a thread's byte offset inside a slice
/// (under 128 rows of pitch ld, 2-byte elements) then fits 32 bits.
constexpr int64_t kMaxFastLd = int64_t{1} << 22;

/// The tile MAC of a storage type: the LDS operand (4 raw halves) and the instruction.
template <typename T> struct TileOf;
template <> struct TileOf<__half> {
  using Vec = hipk::mc::f16x4;
  __device__ static __forceinline__ hipk::mc::f32x4 mac(Vec a, Vec b, hipk::mc::f32x4 c) {
    return hipk::mc::tile_f16(a, b, c);
  }
};
template <> struct TileOf<bf16> {
  using Vec = hipk::mc::bf16x4;
  __device__ static __forceinline__ hipk::mc::f32x4 mac(Vec a, Vec b, hipk::mc::f32x4 c) {
    return hipk::mc::tile_bf16(a, b, c);
  }
};

/// One operand slice: 128 rows of op(X) (m for A, n for B) by BK values of k, staged through
/// registers into LDS as rows of k. K_CONTIG: k is the contiguous dimension in memory.
template <typename T, bool K_CONTIG> struct Stager {
  // K_CONTIG: 1 row x 16 k per thread (2 x 8 elements); else 4 k rows x 4 mn (4 x 4 elements).
  static constexpr int LOADS = K_CONTIG ? 2 : 4;
  static constexpr int V = K_CONTIG ? 8 : 4;  // elements per load
  static constexpr int W = V / 2;             // 32-bit words per load
  uint32_t w[LOADS][W];

  /// Offset (elements, uniform) of the slice at (mn0, k0) from the item's first element.
  __device__ __forceinline__ static int64_t origin(int64_t ld, int mn0, int k0) {
    return K_CONTIG ? static_cast<int64_t>(mn0) * ld + k0 : static_cast<int64_t>(k0) * ld + mn0;
  }
  /// This thread's byte offset from a slice origin; fits 32 bits when ld <= kMaxFastLd.
  __device__ __forceinline__ static uint32_t thread_bytes(int64_t ld, int tid) {
    const int64_t e = K_CONTIG ? (tid / 2) * ld + (tid % 2) * 16 : (tid / 32) * 4 * ld + (tid % 32) * 4;
    return static_cast<uint32_t>(e * static_cast<int64_t>(sizeof(T)));
  }

  /// Unchecked load of the slice whose origin is `o` (uniform; every element inside the matrix,
  /// rows aligned): a uniform 64-bit base plus this thread's 32-bit offset `off`, so the
  /// compiler can use the scalar-base form of global_load (no 64-bit address math per load).
  __device__ __forceinline__ void load_fast(const T* o, uint32_t off, int64_t ld) {
#pragma unroll
    for (int r = 0; r < LOADS; ++r) {
      const char* base = reinterpret_cast<const char*>(o + (K_CONTIG ? r * V : r * ld));
      hipk::load_raw_vec<W>(reinterpret_cast<const T*>(base + off), w[r]);
    }
  }

  /// Bounds-checked load of the slice at (mn0, k0) of x (the batch item's first element):
  /// elements outside mn_total x k_total read as 0 and are never touched.
  __device__ __forceinline__ void load_checked(const T* x, int64_t ld, int mn_total, int k_total,
                                               int mn0, int k0, bool vec_ok, int tid) {
#pragma unroll
    for (int r = 0; r < LOADS; ++r) {
      // Memory row and column of this load.
      const int row = K_CONTIG ? mn0 + tid / 2 : k0 + (tid / 32) * 4 + r;
      const int col = K_CONTIG ? k0 + (tid % 2) * 16 + r * V : mn0 + (tid % 32) * 4;
      const int rows = K_CONTIG ? mn_total : k_total;
      const int cols = K_CONTIG ? k_total : mn_total;
      const int valid = row < rows ? cols - col : 0;
      const int64_t safe_row = row < rows ? row : 0;
      hipk::load_raw<V>(x + safe_row * ld + col, valid, vec_ok, w[r]);
    }
  }

  /// Writes the registers into the LDS slice s (128 rows of LDK halves, k contiguous).
  __device__ __forceinline__ void store(uint16_t* s, int tid) const {
    if constexpr (K_CONTIG) {
      uint32_t* p = reinterpret_cast<uint32_t*>(s + (tid / 2) * LDK + (tid % 2) * 16);
#pragma unroll
      for (int r = 0; r < LOADS; ++r) {
        *reinterpret_cast<uint4*>(p + r * W) = uint4{w[r][0], w[r][1], w[r][2], w[r][3]};
      }
    } else {
      // w[kk] holds 4 consecutive mn of k row kk; LDS row mn takes k = 4 * (tid / 32) + 0..3.
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        // Half u of each k row: low (u even) or high halves, k pairs (0, 1) and (2, 3).
        const uint32_t sel = u % 2 == 0 ? 0x05040100u : 0x07060302u;
        const uint32_t lo = __builtin_amdgcn_perm(w[1][u / 2], w[0][u / 2], sel);
        const uint32_t hi = __builtin_amdgcn_perm(w[3][u / 2], w[2][u / 2], sel);
        uint16_t* row = s + ((tid % 32) * 4 + u) * LDK + (tid / 32) * 4;
        *reinterpret_cast<uint2*>(row) = uint2{lo, hi};
      }
    }
  }
};

/// The GEMM; see the file comment. BIAS is a compile-time flag (the plain kernels carry no
/// epilogue code).
template <typename T, bool TRANS_A, bool TRANS_B, bool BIAS>
__device__ __forceinline__ void gemm(const T* __restrict__ a, const T* __restrict__ b,
                                     const T* c, T* out, int M, int N, int K, int64_t lda,
                                     int64_t ldb, int64_t ldc, int64_t ldo, int64_t stride_a,
                                     int64_t stride_b, int64_t stride_c, int64_t stride_o,
                                     float alpha, float beta, const T* __restrict__ bias,
                                     T* __restrict__ pre, int gelu) {
  using Tile = TileOf<T>;
  using Vec = typename Tile::Vec;
  using Op = hipk::mc::OperandLayout<16>;
  using Acc = hipk::mc::AccLayout;
  __shared__ __attribute__((aligned(16))) uint16_t sa[BM * LDK];
  __shared__ __attribute__((aligned(16))) uint16_t sb[BN * LDK];

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % 64;
  const int wave = tid / 64;
  const int wm = (wave / 2) * WT;  // this wave's rows and columns inside the block tile
  const int wn = (wave % 2) * WT;
  const int m0 = static_cast<int>(blockIdx.y) * BM;
  const int n0 = static_cast<int>(blockIdx.x) * BN;
  const int nk = (K + BK - 1) / BK;

  using StageA = Stager<T, !TRANS_A>;
  using StageB = Stager<T, TRANS_B>;
  StageA stage_a;
  StageB stage_b;
  const bool a_vec = hipk::rows_aligned<StageA::V>(a, lda, stride_a);
  const bool b_vec = hipk::rows_aligned<StageB::V>(b, ldb, stride_b);
  const bool interior = a_vec && b_vec && m0 + BM <= M && n0 + BN <= N && K > 0 &&
                        K % BK == 0 && lda <= kMaxFastLd && ldb <= kMaxFastLd;

  const int64_t item = blockIdx.z;
  const T* a_item = a + item * stride_a;
  const T* b_item = b + item * stride_b;

  hipk::mc::f32x4 acc[TI][TI];
#pragma unroll
  for (int i = 0; i < TI; ++i) {
#pragma unroll
    for (int j = 0; j < TI; ++j) acc[i][j] = hipk::mc::f32x4{0.0f, 0.0f, 0.0f, 0.0f};
  }

  // This lane's operand rows and k offset in the LDS slices (mc_layout.h's operand layout).
  const uint16_t* pa = sa + (wm + Op::mn(lane)) * LDK + Op::k(lane, 0);
  const uint16_t* pb = sb + (wn + Op::mn(lane)) * LDK + Op::k(lane, 0);

  // The slice in LDS times the wave's accumulators: 2 k-steps x 16 tile MACs.
  auto multiply = [&]() __attribute__((always_inline)) {
#pragma unroll
    for (int ks = 0; ks < BK; ks += hipk::mc::kTile) {
      Vec fa[TI];
      Vec fb[TI];
#pragma unroll
      for (int i = 0; i < TI; ++i) {
        fa[i] = *reinterpret_cast<const Vec*>(pa + i * hipk::mc::kTile * LDK + ks);
        fb[i] = *reinterpret_cast<const Vec*>(pb + i * hipk::mc::kTile * LDK + ks);
      }
#pragma unroll
      for (int i = 0; i < TI; ++i) {
#pragma unroll
        for (int j = 0; j < TI; ++j) acc[i][j] = Tile::mac(fa[i], fb[j], acc[i][j]);
      }
    }
  };

  if (interior) {
    uint32_t off_a = StageA::thread_bytes(lda, tid);
    uint32_t off_b = StageB::thread_bytes(ldb, tid);
    stage_a.load_fast(a_item + StageA::origin(lda, m0, 0), off_a, lda);
    stage_b.load_fast(b_item + StageB::origin(ldb, n0, 0), off_b, ldb);
    HIPK_HOT_LOOP_BEGIN("k_interior");
    for (int t = 0; t < nk; ++t) {
      __syncthreads();  // every wave is done reading the previous slice
      stage_a.store(sa, tid);
      stage_b.store(sb, tid);
      __syncthreads();
      // The next slice (a re-read of the last one at the end: uniform select, no branch).
      const int k_next = (t + 1 < nk ? t + 1 : t) * BK;
      // Loop-carried and opaque: keeps the offsets' zero-extension in the loop, so the loads
      // use the scalar-base form (see hipk::opaque).
      hipk::opaque(off_a);
      hipk::opaque(off_b);
      stage_a.load_fast(a_item + StageA::origin(lda, m0, k_next), off_a, lda);
      stage_b.load_fast(b_item + StageB::origin(ldb, n0, k_next), off_b, ldb);
      // Keeps the loads above the tile MACs: sunk to their use (the next LDS store), their
      // latency would be fully exposed at the next barrier.
      hipk::sched_fence();
      multiply();
    }
    HIPK_HOT_LOOP_END("k_interior");
  } else {
    if (nk > 0) {
      stage_a.load_checked(a_item, lda, M, K, m0, 0, a_vec, tid);
      stage_b.load_checked(b_item, ldb, N, K, n0, 0, b_vec, tid);
    }
    for (int t = 0; t < nk; ++t) {
      __syncthreads();
      stage_a.store(sa, tid);
      stage_b.store(sb, tid);
      __syncthreads();
      // Slice nk (past K) loads nothing: every element reads as 0.
      stage_a.load_checked(a_item, lda, M, K, m0, (t + 1) * BK, a_vec, tid);
      stage_b.load_checked(b_item, ldb, N, K, n0, (t + 1) * BK, b_vec, tid);
      multiply();
    }
  }

  // Epilogue: v = alpha * acc + beta * C (+ bias[n], pre_gelu, GELU), one element at a time,
  // at the positions the accumulator layout gives; nothing outside M x N is read or written.
  T* o_item = out + item * stride_o;
  const T* c_item = c + item * stride_c;  // only dereferenced when beta != 0
#pragma unroll
  for (int i = 0; i < TI; ++i) {
#pragma unroll
    for (int j = 0; j < TI; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int m = m0 + wm + i * hipk::mc::kTile + Acc::row(lane, e);
        const int n = n0 + wn + j * hipk::mc::kTile + Acc::col(lane, e);
        if (m >= M || n >= N) continue;
        float v = alpha * acc[i][j][e];
        if (beta != 0.0f) {
          v = __builtin_fmaf(beta, hipk::load_as_float(c_item, static_cast<int64_t>(m) * ldc + n), v);
        }
        const int64_t o = static_cast<int64_t>(m) * ldo + n;
        if constexpr (BIAS) {
          v += hipk::load_as_float(bias, n);
          if (pre != nullptr) hipk::store_from_float(pre + item * stride_o, o, v);
          if (gelu != 0) v = hipk::gelu_tanh(v);
        }
        hipk::store_from_float(o_item, o, v);
      }
    }
  }
}

}  // namespace hipk_matmul_mc

// ---------------------------------------------------------------------------------------------
// Exported kernels
// ---------------------------------------------------------------------------------------------

// Without a 16x16x16 f16/bf16 tile (gfx906, gfx926) the kernels only trap: same names in every
// code object, never launched there.
#if HIPK_MC_HAVE_F16
#define HIPK_MC_BODY(TA, TB, BIAS, T, BIAS_ARGS)                                              \
  hipk_matmul_mc::gemm<T, TA, TB, BIAS>(a, b, c, out, M, N, K, lda, ldb, ldc, ldo, stride_a, \
                                        stride_b, stride_c, stride_o, alpha, beta, BIAS_ARGS);
#else
#define HIPK_MC_BODY(TA, TB, BIAS, T, BIAS_ARGS) __builtin_trap();
#endif
#define HIPK_MC_NO_BIAS nullptr, nullptr, 0
#define HIPK_MC_BIAS_ARGS bias, pre_gelu, gelu

#define HIPK_MC_KERNEL(AB, TA, TB, SUFFIX, T)                                                 \
  extern "C" __global__ void __launch_bounds__(256) matmul_mc_##AB##_##SUFFIX(                \
      const T* a, const T* b, const T* c, T* out, int M, int N, int K, int64_t lda,           \
      int64_t ldb, int64_t ldc, int64_t ldo, int64_t stride_a, int64_t stride_b,              \
      int64_t stride_c, int64_t stride_o, float alpha, float beta) {                           \
    HIPK_MC_BODY(TA, TB, false, T, HIPK_MC_NO_BIAS)                                           \
  }                                                                                           \
  extern "C" __global__ void __launch_bounds__(256) matmul_mc_bias_##AB##_##SUFFIX(           \
      const T* a, const T* b, const T* c, T* out, int M, int N, int K, int64_t lda,           \
      int64_t ldb, int64_t ldc, int64_t ldo, int64_t stride_a, int64_t stride_b,              \
      int64_t stride_c, int64_t stride_o, float alpha, float beta, const T* bias,              \
      T* pre_gelu, int gelu) {                                                                 \
    HIPK_MC_BODY(TA, TB, true, T, HIPK_MC_BIAS_ARGS)                                          \
  }

#define HIPK_MC_LAYOUTS(SUFFIX, T)           \
  HIPK_MC_KERNEL(nn, false, false, SUFFIX, T) \
  HIPK_MC_KERNEL(nt, false, true, SUFFIX, T)  \
  HIPK_MC_KERNEL(tn, true, false, SUFFIX, T)  \
  HIPK_MC_KERNEL(tt, true, true, SUFFIX, T)

HIPK_MC_LAYOUTS(f16, __half)
HIPK_MC_LAYOUTS(bf16, ::hipk::bf16)
