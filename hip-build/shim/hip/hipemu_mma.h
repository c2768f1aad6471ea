// hip-emu host shim: the matrix-core tile multiply-accumulate as a wave-level operation.
//
// hipemu::mma_tile<Operand, Acc>(a, b, c): every lane of the wave passes its share of A and B
// (Operand::kPerLane values each, already widened to f32) and its 4 accumulators; when the
// whole wave has arrived, D = C + A·B is computed per element and each lane gets its 4 values
// of D back in c. Operand (which lane holds which A/B element) and Acc (which lane holds which
// accumulator) are layout descriptions, given by the caller (kernels/mc_layout.h is the
// repository's one description; kernels/mc_tile.h calls this on the host build).
//
// Mechanism: the same wave-level rendezvous as the shim's other cross-lane operations (a
// HIPEMU_WAVE_BARRIER wave operation, which the executor completes once every existing lane of
// the wave waits at the same source line). Before it, each lane publishes a pointer to its
// record (on its own fibre stack: it stays valid while the lane is suspended) in a per-wave
// table; after it, the first lane of the wave to run computes the whole tile from the table
// and fills every lane's record, marking them done, so the others only read their result. No
// lane can publish its next record before every lane has passed this rendezvous (the next
// tile's rendezvous needs all of them), so the table is never overwritten while in use.
// Lanes that do not exist (the partial last wave of a block) contribute zeros, as inactive
// lanes read 0 in the shim's ds_bpermute.
//
// Arithmetic: the products of f16/bf16/f32 inputs are summed in f32 in ascending k, starting
// from C, one fused multiply-add per k (f16 and bf16 products are exact in f32). The device's
// summation order inside the instruction is not published: results agree with the device to
// f32 rounding, not bit for bit.
#pragma once

#include <math.h>
#include <stdint.h>

namespace hipemu {

/// One lane's part of a tile operation.
struct MmaRecord {
  float a[4];
  float b[4];
  float c[4];
  bool done;
};

/// Published records of the waves of the running block (launches and blocks run one at a
/// time, at most 1024 threads = 16 waves per block).
inline MmaRecord* mma_table[16][64];

/// D = C + A·B over one 16x16xK tile, K = 4 · Operand::kPerLane; see the file comment.
template <typename Operand, typename Acc>
inline void mma_tile(const float* a, const float* b, float (&c)[4],
                     const char* file = __builtin_FILE(), unsigned line = __builtin_LINE()) {
  constexpr int kPer = Operand::kPerLane;
  constexpr int K = 4 * kPer;
  MmaRecord rec;
  for (int e = 0; e < 4; ++e) {
    rec.a[e] = e < kPer ? a[e] : 0.0f;
    rec.b[e] = e < kPer ? b[e] : 0.0f;
    rec.c[e] = c[e];
  }
  rec.done = false;
  const unsigned tid = linear_tid();
  const unsigned wave = tid / 64;
  mma_table[wave][tid % 64] = &rec;
  hipemu_wave_op(HIPEMU_WAVE_BARRIER, 0, 0, 0, file, line);
  if (!rec.done) {
    // The first lane of the wave to resume: the table holds every existing lane's record.
    const uint64_t exist = wave_exist_mask();
    float A[16][K] = {};
    float B[K][16] = {};
    float C[16][16] = {};
    for (int l = 0; l < 64; ++l) {
      if (!((exist >> l) & 1)) continue;
      const MmaRecord* r = mma_table[wave][l];
      for (int e = 0; e < kPer; ++e) {
        A[Operand::mn(l)][Operand::k(l, e)] = r->a[e];
        B[Operand::k(l, e)][Operand::mn(l)] = r->b[e];
      }
      for (int e = 0; e < 4; ++e) C[Acc::row(l, e)][Acc::col(l, e)] = r->c[e];
    }
    for (int l = 0; l < 64; ++l) {
      if (!((exist >> l) & 1)) continue;
      MmaRecord* r = mma_table[wave][l];
      for (int e = 0; e < 4; ++e) {
        const int m = Acc::row(l, e);
        const int n = Acc::col(l, e);
        float d = C[m][n];
        for (int k = 0; k < K; ++k) d = fmaf(A[m][k], B[k][n], d);
        r->c[e] = d;
      }
      r->done = true;
    }
  }
  for (int e = 0; e < 4; ++e) c[e] = rec.c[e];
}

}  // namespace hipemu
