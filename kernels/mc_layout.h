// kernels/mc_layout.h — which lane of a wave64 holds which element of a matrix-core tile.
//
// THE one description of the lane layout of the 16x16xK tile multiply-accumulate
// (D = C + A·B, A 16 x K, B K x 16, C and D 16 x 16, f32 accumulators) of kernels/mc_tile.h.
// The matrix-core matmul (kernels/matmul_mc.hip), hip-emu's emulation of the tile instruction
// (hip-build/shim/hip/hipemu_mma.h) and the tests (hip-emu's tile test kernel) all read it from
// here. Plain constexpr C++: no HIP builtin, usable on the device and on the host.
//
// Operands (K = 16: 4 values per lane, f16 or bf16; K = 4: 1 f32 value per lane):
//   A: lane l, value e  ->  row m = l % 16,  k = (K / 4) * (l / 16) + e
//   B: lane l, value e  ->  k = (K / 4) * (l / 16) + e,  column n = l % 16
// i.e. lanes 0-15 hold k 0..K/4-1 of rows (A) / columns (B) 0-15, lanes 16-31 the next K/4
// values of k, and so on. Since D sums over k, any arrangement of k works as long as A and B
// agree; what matters for a kernel is that each lane's K/4 values are consecutive in k (one
// 8-byte LDS read for f16/bf16).
//
// Accumulators (4 f32 per lane), two variants:
//   MFMA (CDNA gfx908 / gfx90a / gfx94x, verified against public sources):
//        lane l, value e  ->  row m = 4 * (l / 16) + e,  column n = l % 16
//   MMAC (Hygon gfx926 / gfx928 / gfx92a / gfx936 / gfx938 / gfx946): ASSUMED, NOT CONFIRMED
//   ON A CARD.
//        lane l, value e  ->  row m = l % 16,  column n = l / 16 + 4 * e
//
// Where these come from (facts, in our words; no code was copied):
// - MFMA: AMD's composable_kernel describes v_mfma_f32_16x16x16f16 (and the bf16_1k and f32
//   16x16x4 forms) as 16 threads per block along m/n, 4 input blocks along k of 4 (f32: 1)
//   values each, and one output group of 4 consecutive rows per lane
//   (include/ck/tensor_operation/gpu/warp/xdlops_gemm.hpp, mfma_type<...>: num_threads_per_blk
//   16, num_input_blks 4, k_per_blk 4, group_size 4, num_groups_per_blk 1). The same layout is
//   what AMD's matrix instruction calculator prints for these instructions.
// - MMAC: Hygon does not document it publicly. The operand layout above is what a public
//   single-wave DCU example (a 16x16x16 f16 MMAC test against a CPU GEMM) loads; the same
//   example stores lane l's 4 results at row l % 16, columns l / 16 + 4e, which is the
//   accumulator layout assumed here. One example is not a specification: run the tile test
//   (hip-emu's test kernel hipemu_test_mc_tile_*, built with DTK's hipcc for the card) on a
//   DCU before trusting matmul_mc there. A wrong guess gives wrong results (the device tests
//   catch it), never out-of-bounds accesses: every (row, column) stays inside the 16 x 16 tile.
#pragma once

namespace hipk {
namespace mc {

/// Lanes per wave and edge of the tile.
constexpr int kWave = 64;
constexpr int kTile = 16;

/// Operand layout (A and B) of a 16x16xK tile, K = 16 (4 values per lane) or 4 (1 value).
template <int K> struct OperandLayout {
  static_assert(K == 16 || K == 4, "16x16x16 (f16, bf16) or 16x16x4 (f32)");
  /// Values of A (and of B) per lane.
  static constexpr int kPerLane = K / 4;
  /// Row of A (= column of B) that lane l holds.
  static constexpr int mn(int lane) { return lane % 16; }
  /// k of the lane's value e (0 <= e < kPerLane).
  static constexpr int k(int lane, int e) { return kPerLane * (lane / 16) + e; }
};

/// Accumulator layout of CDNA's MFMA (verified, see above).
struct MfmaAcc {
  static constexpr int row(int lane, int e) { return 4 * (lane / 16) + e; }
  static constexpr int col(int lane, int /*e*/) { return lane % 16; }
};

/// Accumulator layout of Hygon's MMAC (ASSUMED, see above: confirm on a DCU).
struct MmacAcc {
  static constexpr int row(int lane, int /*e*/) { return lane % 16; }
  static constexpr int col(int lane, int e) { return lane / 16 + 4 * e; }
};

/// Layout ids (kernel arguments of the tile test kernels, hip-emu's emulation).
constexpr int kLayoutMfma = 0;
constexpr int kLayoutMmac = 1;

/// The accumulator layout of the arch being compiled: MMAC on Hygon's matrix-core archs, MFMA
/// everywhere else (CDNA, and hip-emu, which emulates the verified MFMA layout).
#if defined(__gfx926__) || defined(__gfx928__) || defined(__gfx92a__) || defined(__gfx936__) || \
    defined(__gfx938__) || defined(__gfx946__)
using AccLayout = MmacAcc;
constexpr int kArchLayout = kLayoutMmac;
#else
using AccLayout = MfmaAcc;
constexpr int kArchLayout = kLayoutMfma;
#endif

}  // namespace mc
}  // namespace hipk
