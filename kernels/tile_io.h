// kernels/tile_io.h — bounds-checked vector loads and stores for the tiled kernels (matmul,
// attention). Never run on a GPU: compiled and resource-checked for gfx906 only.
//
// Unlike hipk::load_floats / store_floats (common.h), the bound is a 32-bit count of valid
// elements and the alignment test is a uniform flag computed once per kernel, and the tail is
// branch-free. In the tiled kernels, 64-bit per-element compares unrolled over a register block
// kept one saved exec mask per element live and spilled SGPRs.
#pragma once

#include "common.h"

namespace hipk {

/// r[u] = p[u] for u < min(V, valid), 0 beyond. `vec_ok` (uniform): p is aligned to V elements.
template <int V, typename T>
__device__ __forceinline__ void load_vec(const T* p, int valid, bool vec_ok, float (&r)[V]) {
  constexpr int kBytes = V * static_cast<int>(sizeof(T));
  if (vec_ok && valid >= V) {
    using Raw = typename hipk::RawWords<kBytes>::type;
    const Raw raw = *reinterpret_cast<const Raw*>(p);
    uint32_t w[kBytes / 4];
    __builtin_memcpy(w, &raw, kBytes);
#pragma unroll
    for (int u = 0; u < V; ++u) {
      const uint32_t bits = sizeof(T) == 4 ? w[u] : (w[u / 2] >> (16 * (u % 2))) & 0xffffu;
      r[u] = hipk::from_bits(static_cast<T*>(nullptr), bits);
    }
  } else if (valid > 0) {
    // Branch-free tail: clamp the index into [0, valid) (always a legal address), then zero
    // what lies past the end. Per-element branches here cost a saved exec mask each.
#pragma unroll
    for (int u = 0; u < V; ++u) {
      const float x = hipk::to_float(p[u < valid ? u : valid - 1]);
      r[u] = u < valid ? x : 0.0f;
    }
  } else {
#pragma unroll
    for (int u = 0; u < V; ++u) r[u] = 0.0f;
  }
}

/// A compiler-only memory fence: the scheduler keeps every memory access on its side of it
/// (non-memory instructions still move across). Emits no instruction.
__device__ __forceinline__ void sched_fence() { __asm__ __volatile__("" ::: "memory"); }

/// A full scheduling barrier (LLVM >= 15): the machine scheduler moves no instruction across
/// it. Emits no instruction; a no-op where the builtin does not exist (host emulation).
__device__ __forceinline__ void sched_barrier() {
#if defined(__has_builtin)
#if __has_builtin(__builtin_amdgcn_sched_barrier)
  __builtin_amdgcn_sched_barrier(0);
#endif
#endif
}

/// Makes v opaque to the optimiser at this point; emits no instruction. In a loop, it stops LICM
/// from hoisting the zero-extension of a 32-bit offset out of the loop, which would hide the
/// (uniform 64-bit base + zero-extended 32-bit offset) address shape that selects the
/// scalar-base form of global_load (no 64-bit VALU address add per load).
template <typename U> __device__ __forceinline__ void opaque(U& v) {
  static_assert(sizeof(U) == 4, "one 32-bit register");
#if defined(__AMDGCN__)
  __asm__ __volatile__("" : "+v"(v));
#else
  (void)v;
#endif
}

/// w = the W 32-bit words at p, as one 4-, 8- or 16-byte vector load (p aligned to that size).
/// Unchecked: the caller guarantees the whole vector is inside the tensor.
template <int W, typename T>
__device__ __forceinline__ void load_raw_vec(const T* p, uint32_t (&w)[W]) {
  using Raw = typename hipk::RawWords<4 * W>::type;
  const Raw raw = *reinterpret_cast<const Raw*>(p);
  __builtin_memcpy(w, &raw, 4 * W);
}

/// The V elements p[0..V) as raw packed words (element u in bits 16 * (u % 2) of word u / 2 for
/// 2-byte T), elements at or past `valid` as 0 bits (0.0 in every storage type) and never
/// read. `vec_ok` (uniform): p is aligned to V elements. Same branch-free tail as load_vec.
template <int V, typename T>
__device__ __forceinline__ void load_raw(const T* p, int valid,
                                         bool vec_ok, uint32_t (&w)[V * sizeof(T) / 4]) {
  constexpr int W = V * static_cast<int>(sizeof(T)) / 4;
  static_assert(W * 4 == V * static_cast<int>(sizeof(T)), "whole words");
  if (vec_ok && valid >= V) {
    load_raw_vec<W>(p, w);
  } else if (valid > 0) {
#pragma unroll
    for (int k = 0; k < W; ++k) w[k] = 0;
#pragma unroll
    for (int u = 0; u < V; ++u) {
      const uint32_t bits = hipk::to_bits(p[u < valid ? u : valid - 1]);
      const uint32_t x = u < valid ? bits : 0u;
      if (sizeof(T) == 4) {
        w[u] = x;
      } else {
        w[u / 2] |= x << (16 * (u % 2));
      }
    }
  } else {
#pragma unroll
    for (int k = 0; k < W; ++k) w[k] = 0;
  }
}

/// p[u] = v[u] rounded to T for u < min(V, valid). `vec_ok` (uniform): p aligned to V elements.
template <int V, typename T>
__device__ __forceinline__ void store_vec(T* p, int valid, bool vec_ok, const float (&v)[V]) {
  constexpr int kBytes = V * static_cast<int>(sizeof(T));
  if (vec_ok && valid >= V) {
    using Raw = typename hipk::RawWords<kBytes>::type;
    uint32_t w[kBytes / 4];
#pragma unroll
    for (int k = 0; k < kBytes / 4; ++k) w[k] = 0;
#pragma unroll
    for (int u = 0; u < V; ++u) {
      const uint32_t bits = hipk::to_bits(hipk::from_float<T>(v[u]));
      if (sizeof(T) == 4) {
        w[u] = bits;
      } else {
        w[u / 2] |= bits << (16 * (u % 2));
      }
    }
    Raw raw;
    __builtin_memcpy(&raw, w, kBytes);
    *reinterpret_cast<Raw*>(p) = raw;
  } else {
#pragma unroll
    for (int u = 0; u < V; ++u) {
      if (u < valid) p[u] = hipk::from_float<T>(v[u]);
    }
  }
}

/// True (uniform) when every row start of every batch item of x is aligned to V elements.
template <int V, typename T>
__device__ __forceinline__ bool rows_aligned(const T* x, int64_t ld, int64_t stride) {
  return hipk::is_aligned(x, V * sizeof(T)) && ld % V == 0 && stride % V == 0;
}

}  // namespace hipk
