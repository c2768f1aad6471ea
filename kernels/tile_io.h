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
