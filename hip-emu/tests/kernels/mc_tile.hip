// hip-emu/tests/kernels/mc_tile.hip — TEST-ONLY kernels: hip-emu's emulation of the matrix-core
// tile multiply-accumulate (kernels/mc_tile.h, hip-build/shim/hip/hipemu_mma.h), driven with the
// lane layout of kernels/mc_layout.h. Launched by tests/exec_mc_tile.rs with one block.
#include <hip/hip_runtime.h>
#include <stdint.h>

// By relative path: the registry scan preprocesses a test kernel with only the shim and its
// own directory on the include path.
#include "../../../kernels/mc_tile.h"

using hipk::mc::OperandLayout;

namespace {
/// Raw bf16 bits of x (x has no bits below bf16's precision in the tests: exact).
short bf16_bits(float x) { return static_cast<short>(__float_as_uint(x) >> 16); }
}  // namespace

// D = C + A·B over one tile per wave (every wave of the block computes the same tile).
// dtype 0: f16 16x16x16 (hipk::mc::tile_f16), 1: bf16 (tile_bf16), 2: f32 16x16x4 (tile_f32),
// all with the arch's accumulator layout (MFMA on hip-emu); dtype 3: f16 through
// hipemu::mma_tile with the MMAC accumulator layout (the assumed layout's emulation).
// A: 16 x K, B: K x 16, C, D: 16 x 16, row-major f32 (values exact in the dtype).
extern "C" __global__ void hipemu_test_mc_tile(int dtype, const float* A, const float* B,
                                               const float* C, float* D) {
  const int lane = static_cast<int>(threadIdx.x % 64);
  const bool mmac = dtype == 3;
  const int K = dtype == 2 ? 4 : 16;
  float c[4];
  for (int e = 0; e < 4; ++e) {
    const int m = mmac ? hipk::mc::MmacAcc::row(lane, e) : hipk::mc::AccLayout::row(lane, e);
    const int n = mmac ? hipk::mc::MmacAcc::col(lane, e) : hipk::mc::AccLayout::col(lane, e);
    c[e] = C[m * 16 + n];
  }
  hipk::mc::f32x4 acc{c[0], c[1], c[2], c[3]};
  if (dtype == 2) {
    using L = OperandLayout<4>;
    acc = hipk::mc::tile_f32(A[L::mn(lane) * K + L::k(lane, 0)], B[L::k(lane, 0) * 16 + L::mn(lane)],
                             acc);
  } else {
    using L = OperandLayout<16>;
    float a[4], b[4];
    for (int e = 0; e < 4; ++e) {
      a[e] = A[L::mn(lane) * K + L::k(lane, e)];
      b[e] = B[L::k(lane, e) * 16 + L::mn(lane)];
    }
    if (dtype == 0) {
      acc = hipk::mc::tile_f16(hipk::mc::f16x4{static_cast<_Float16>(a[0]), static_cast<_Float16>(a[1]),
                                                static_cast<_Float16>(a[2]), static_cast<_Float16>(a[3])},
                               hipk::mc::f16x4{static_cast<_Float16>(b[0]), static_cast<_Float16>(b[1]),
                                                static_cast<_Float16>(b[2]), static_cast<_Float16>(b[3])},
                               acc);
    } else if (dtype == 1) {
      acc = hipk::mc::tile_bf16(hipk::mc::bf16x4{bf16_bits(a[0]), bf16_bits(a[1]), bf16_bits(a[2]), bf16_bits(a[3])},
                                hipk::mc::bf16x4{bf16_bits(b[0]), bf16_bits(b[1]), bf16_bits(b[2]), bf16_bits(b[3])},
                                acc);
    } else {
      float cv[4] = {acc[0], acc[1], acc[2], acc[3]};
      hipemu::mma_tile<L, hipk::mc::MmacAcc>(a, b, cv);
      acc = hipk::mc::f32x4{cv[0], cv[1], cv[2], cv[3]};
    }
  }
  // Wave w of the block writes its own copy of D.
  float* d = D + (threadIdx.x / 64) * 256;
  for (int e = 0; e < 4; ++e) {
    const int m = mmac ? hipk::mc::MmacAcc::row(lane, e) : hipk::mc::AccLayout::row(lane, e);
    const int n = mmac ? hipk::mc::MmacAcc::col(lane, e) : hipk::mc::AccLayout::col(lane, e);
    d[m * 16 + n] = acc[e];
  }
}

// The layout tables of kernels/mc_layout.h, per lane l and value e (index l * 4 + e):
// A row / k (K = 16), accumulator row / column for MFMA and for MMAC.
extern "C" __global__ void hipemu_test_mc_layout(int* a_m, int* a_k, int* f4_k, int* mfma_row,
                                                 int* mfma_col, int* mmac_row, int* mmac_col) {
  const int l = static_cast<int>(threadIdx.x);
  for (int e = 0; e < 4; ++e) {
    const int i = l * 4 + e;
    a_m[i] = OperandLayout<16>::mn(l);
    a_k[i] = OperandLayout<16>::k(l, e);
    f4_k[i] = e == 0 ? OperandLayout<4>::k(l, 0) : -1;
    mfma_row[i] = hipk::mc::MfmaAcc::row(l, e);
    mfma_col[i] = hipk::mc::MfmaAcc::col(l, e);
    mmac_row[i] = hipk::mc::MmacAcc::row(l, e);
    mmac_col[i] = hipk::mc::MmacAcc::col(l, e);
  }
}
