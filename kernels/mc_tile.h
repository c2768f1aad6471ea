// kernels/mc_tile.h — one 16x16x16 tile multiply-accumulate on the matrix cores, whatever the
// arch calls it: D = C + A·B with A 16 x 16 and B 16 x 16 in f16 or bf16, C and D in f32
// (and a 16x16x4 f32 form where the arch has one). A wave-level operation: all 64 lanes take
// part, each holding the values kernels/mc_layout.h assigns to it.
//
//   hipk::mc::tile_f16(a, b, c)   a, b: f16x4 (4 halves: k = 4·(lane/16) .. +3), c: f32x4
//   hipk::mc::tile_bf16(a, b, c)  a, b: bf16x4 (raw bf16 bits)
//   hipk::mc::tile_f32(a, b, c)   a, b: one f32 (k = lane / 16), where HIPK_MC_HAVE_F32
//
// Spellings (chosen by the compiler's arch macros; HIPK_MC_ARCH says which, 0 = none):
//   gfx90a, gfx940-942   __builtin_amdgcn_mfma_f32_16x16x16f16 / _16x16x16bf16_1k / _16x16x4f32
//                        (cbsz, abid, blgp = 0: no broadcast). Compiled and checked here with
//                        Debian's hipcc 5.2 for gfx90a.
//   gfx908               the f16 and f32 forms; bf16 as two _16x16x8bf16 (2 values per lane
//                        each: the first takes values 0-1, the second 2-3 of every lane; the
//                        sum over k is the same). gfx908 rejects bf16_1k ("Cannot select").
//   gfx928, gfx92a,      __builtin_hcu_mmac_f32_16x16x16_f16 (half4) / _16x16x16_bf16 (short4
//   gfx936, gfx938,      of raw bf16 bits) when the compiler has them (__has_builtin), else the
//   gfx946               older DTK spelling __builtin_amdgcn_mmac_f32_16x16x16f16 / bf16; f32:
//                        __builtin_hcu_mmac_16x16x4_f32, else __builtin_amdgcn_mmac_f32_16x16x4f32.
//                        gfx938's `_lit_lts` variants (extra modifiers) are not used.
//   gfx926               f32 16x16x4 only (no f16/bf16 tile: HIPK_MC_HAVE_F16 is 0).
//   hip-emu (host build) hipemu::mma_tile (hip-build/shim/hip/hipemu_mma.h): every lane's
//                        operands are gathered at one wave-level exchange, the tile is
//                        computed per element in f32 and every lane gets its 4 accumulators,
//                        with the MFMA accumulator layout.
// The MMAC names, operand types and arch guards follow Hygon's public composable_kernel fork
// (HYGON-AI/composable_kernel-das, include/ck/utility/hcu_mmac.hpp: f16/bf16 16x16x16 on
// gfx928, gfx92a, gfx936, gfx938, gfx946 with half4 / int16x4 operands; f32 16x16x4 from
// gfx926) and public DCU code for the older spelling. No DTK compiler is available here, so
// none of the MMAC lines has been compiled: the first DTK build is their first check. The
// operand type of the older `__builtin_amdgcn_mmac_f32_16x16x16bf16` is not published:
// HIPK_MC_MMAC_OLD_BF16X4 (default: 4 x __bf16, bit-cast from the raw bits) is an assumption.
#pragma once

#include "mc_layout.h"

#if defined(__gfx90a__) || defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__)
#define HIPK_MC_ARCH 1  // CDNA2/3 MFMA
#elif defined(__gfx908__)
#define HIPK_MC_ARCH 2  // CDNA1 MFMA (no bf16_1k)
#elif defined(__gfx928__) || defined(__gfx92a__) || defined(__gfx936__) || defined(__gfx938__) || \
    defined(__gfx946__)
#define HIPK_MC_ARCH 3  // Hygon MMAC
#elif defined(__gfx926__)
#define HIPK_MC_ARCH 5  // Hygon MMAC, f32 only
#elif defined(HIPEMU)
#define HIPK_MC_ARCH 6  // hip-emu's emulation
#else
#define HIPK_MC_ARCH 0  // no matrix cores (gfx906): the tile functions trap
#endif

/// An f16/bf16 16x16x16 tile and an f32 16x16x4 tile exist on this arch.
#define HIPK_MC_HAVE_F16 (HIPK_MC_ARCH != 0 && HIPK_MC_ARCH != 5)
#define HIPK_MC_HAVE_F32 (HIPK_MC_ARCH != 0)

#if HIPK_MC_ARCH == 6
#include <hip/hipemu_mma.h>
#endif

namespace hipk {
namespace mc {

typedef _Float16 f16x4 __attribute__((ext_vector_type(4)));
typedef short bf16x4 __attribute__((ext_vector_type(4)));
typedef float f32x4 __attribute__((ext_vector_type(4)));
typedef short bf16x2 __attribute__((ext_vector_type(2)));

#if HIPK_MC_ARCH == 3 && !__has_builtin(__builtin_hcu_mmac_f32_16x16x16_bf16) && \
    !defined(HIPK_MC_MMAC_OLD_BF16X4)
typedef __bf16 mmac_old_bf16x4 __attribute__((ext_vector_type(4)));
#define HIPK_MC_MMAC_OLD_BF16X4 ::hipk::mc::mmac_old_bf16x4
#endif

/// D = C + A·B over a 16x16x16 f16 tile (wave-level; layout in mc_layout.h).
__device__ __forceinline__ f32x4 tile_f16(f16x4 a, f16x4 b, f32x4 c) {
#if HIPK_MC_ARCH == 1 || HIPK_MC_ARCH == 2
  return __builtin_amdgcn_mfma_f32_16x16x16f16(a, b, c, 0, 0, 0);
#elif HIPK_MC_ARCH == 3
#if __has_builtin(__builtin_hcu_mmac_f32_16x16x16_f16)
  return __builtin_hcu_mmac_f32_16x16x16_f16(a, b, c);
#else
  return __builtin_amdgcn_mmac_f32_16x16x16f16(a, b, c);
#endif
#elif HIPK_MC_ARCH == 6
  float av[4], bv[4], cv[4] = {c[0], c[1], c[2], c[3]};
  for (int e = 0; e < 4; ++e) {
    av[e] = static_cast<float>(a[e]);
    bv[e] = static_cast<float>(b[e]);
  }
  hipemu::mma_tile<OperandLayout<16>, MfmaAcc>(av, bv, cv);
  return f32x4{cv[0], cv[1], cv[2], cv[3]};
#else
  (void)a;
  (void)b;
  __builtin_trap();
  return c;
#endif
}

/// D = C + A·B over a 16x16x16 bf16 tile (operands as raw bf16 bits).
__device__ __forceinline__ f32x4 tile_bf16(bf16x4 a, bf16x4 b, f32x4 c) {
#if HIPK_MC_ARCH == 1
  return __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(a, b, c, 0, 0, 0);
#elif HIPK_MC_ARCH == 2
  c = __builtin_amdgcn_mfma_f32_16x16x8bf16(bf16x2{a[0], a[1]}, bf16x2{b[0], b[1]}, c, 0, 0, 0);
  return __builtin_amdgcn_mfma_f32_16x16x8bf16(bf16x2{a[2], a[3]}, bf16x2{b[2], b[3]}, c, 0, 0, 0);
#elif HIPK_MC_ARCH == 3
#if __has_builtin(__builtin_hcu_mmac_f32_16x16x16_bf16)
  return __builtin_hcu_mmac_f32_16x16x16_bf16(a, b, c);
#else
  return __builtin_amdgcn_mmac_f32_16x16x16bf16(__builtin_bit_cast(HIPK_MC_MMAC_OLD_BF16X4, a),
                                                __builtin_bit_cast(HIPK_MC_MMAC_OLD_BF16X4, b), c);
#endif
#elif HIPK_MC_ARCH == 6
  float av[4], bv[4], cv[4] = {c[0], c[1], c[2], c[3]};
  for (int e = 0; e < 4; ++e) {
    av[e] = __uint_as_float(static_cast<uint32_t>(static_cast<uint16_t>(a[e])) << 16);
    bv[e] = __uint_as_float(static_cast<uint32_t>(static_cast<uint16_t>(b[e])) << 16);
  }
  hipemu::mma_tile<OperandLayout<16>, MfmaAcc>(av, bv, cv);
  return f32x4{cv[0], cv[1], cv[2], cv[3]};
#else
  (void)a;
  (void)b;
  __builtin_trap();
  return c;
#endif
}

/// D = C + A·B over a 16x16x4 f32 tile (one value of A and of B per lane).
__device__ __forceinline__ f32x4 tile_f32(float a, float b, f32x4 c) {
#if HIPK_MC_ARCH == 1 || HIPK_MC_ARCH == 2
  return __builtin_amdgcn_mfma_f32_16x16x4f32(a, b, c, 0, 0, 0);
#elif HIPK_MC_ARCH == 3 || HIPK_MC_ARCH == 5
#if __has_builtin(__builtin_hcu_mmac_16x16x4_f32)
  return __builtin_hcu_mmac_16x16x4_f32(a, b, c);
#else
  return __builtin_amdgcn_mmac_f32_16x16x4f32(a, b, c);
#endif
#elif HIPK_MC_ARCH == 6
  float cv[4] = {c[0], c[1], c[2], c[3]};
  hipemu::mma_tile<OperandLayout<4>, MfmaAcc>(&a, &b, cv);
  return f32x4{cv[0], cv[1], cv[2], cv[3]};
#else
  (void)a;
  (void)b;
  __builtin_trap();
  return c;
#endif
}

}  // namespace mc
}  // namespace hipk
