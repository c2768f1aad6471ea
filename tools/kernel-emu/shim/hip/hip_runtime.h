// Host emulation of the subset of HIP device code that kernels/*.hip use, for checking indexing
// and masking on the CPU (tools/kernel-emu). One std::thread per GPU thread, blocks run one at a
// time; wave lanes exchange values through per-wave buffers and barriers, so a shuffle or DPP
// called from divergent code deadlocks here instead of silently misbehaving.
// NOT a performance model and NOT the device compiler: rounding of exp2/log2 differs slightly.
#pragma once
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)

struct emu_dim3 { unsigned x = 1, y = 1, z = 1; };
struct emu_tid { unsigned x = 0, y = 0, z = 0; };
inline thread_local emu_tid threadIdx;
inline emu_dim3 blockIdx_storage;
#define blockIdx blockIdx_storage
inline emu_dim3 gridDim;
inline emu_dim3 blockDim;
constexpr int warpSize = 64;

struct alignas(16) float4 { float x, y, z, w; };
struct alignas(16) uint4 { uint32_t x, y, z, w; };
struct alignas(8) uint2 { uint32_t x, y; };
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }

inline float __int_as_float(int x) { float f; std::memcpy(&f, &x, 4); return f; }
inline int __float_as_int(float x) { int i; std::memcpy(&i, &x, 4); return i; }
inline float __uint_as_float(uint32_t x) { float f; std::memcpy(&f, &x, 4); return f; }
inline uint32_t __float_as_uint(float x) { uint32_t i; std::memcpy(&i, &x, 4); return i; }
inline float __log2f(float x) { return std::log2(x); }
using std::max;
using std::min;

// ---- block / wave synchronisation ----
inline std::barrier<>* emu_block_barrier = nullptr;
inline std::vector<std::barrier<>*> emu_wave_barriers;
inline std::vector<int> emu_wave_buf;  // one int per thread of the block
inline void __syncthreads() { emu_block_barrier->arrive_and_wait(); }
inline int emu_tid_linear() { return static_cast<int>(threadIdx.x); }

/// Every lane of the wave publishes v and reads lane src(lane)'s value.
template <typename F> inline int emu_exchange(int v, F src) {
  const int t = emu_tid_linear();
  const int wave = t / warpSize, lane = t % warpSize;
  auto* bar = emu_wave_barriers[wave];
  emu_wave_buf[t] = v;
  bar->arrive_and_wait();
  const int r = emu_wave_buf[wave * warpSize + src(lane)];
  bar->arrive_and_wait();
  return r;
}
inline float __shfl_xor(float v, int mask, int width = warpSize) {
  return __int_as_float(emu_exchange(__float_as_int(v), [&](int lane) {
    return (lane & ~(width - 1)) | ((lane ^ mask) & (width - 1));
  }));
}
/// v of the wave's first active lane; every lane calls it (the kernels call it in uniform
/// code), so the first active lane is lane 0.
inline int emu_readfirstlane(int v) { return emu_exchange(v, [](int) { return 0; }); }
#define __builtin_amdgcn_readfirstlane emu_readfirstlane
/// v of lane `src` (an index the same in every lane).
inline int emu_readlane(int v, int src) { return emu_exchange(v, [&](int) { return src; }); }
#define __builtin_amdgcn_readlane emu_readlane
/// ds_swizzle in bitmask mode only (pattern bit 15 clear): within each group of 32 lanes, lane
/// reads ((lane & and_mask) | or_mask) ^ xor_mask.
inline int emu_ds_swizzle(int v, int pattern) {
  const int and_mask = pattern & 0x1f, or_mask = (pattern >> 5) & 0x1f, xor_mask = (pattern >> 10) & 0x1f;
  if (pattern & 0x8000) std::abort();  // quad-perm mode: not emulated
  return emu_exchange(v, [&](int lane) { return (lane & ~31) | (((lane & and_mask) | or_mask) ^ xor_mask); });
}
#define __builtin_amdgcn_ds_swizzle emu_ds_swizzle
/// quad_perm (dpp_ctrl < 0x100) and row_half_mirror (0x141) DPP, full row/bank masks; any other
/// control aborts.
inline int emu_update_dpp(int /*old*/, int src, int ctrl, int, int, bool) {
  if (ctrl == 0x141) return emu_exchange(src, [&](int lane) { return (lane & ~7) | (7 - (lane & 7)); });
  if (ctrl >= 0x100) std::abort();
  return emu_exchange(src, [&](int lane) { return (lane & ~3) | ((ctrl >> (2 * (lane & 3))) & 3); });
}
#define __builtin_amdgcn_update_dpp emu_update_dpp

typedef _Float16 emu_half2 __attribute__((ext_vector_type(2)));
inline float emu_fdot2(emu_half2 a, emu_half2 b, float c, bool) {
  return static_cast<float>(a.x) * static_cast<float>(b.x) +
         static_cast<float>(a.y) * static_cast<float>(b.y) + c;
}
#define __builtin_amdgcn_fdot2 emu_fdot2
/// v_perm_b32: byte i of the result is byte sel[i] of the 8-byte value {hi, lo} (selectors
/// 0-7 only; the constant selectors 0x0c..0xff are not emulated and abort).
inline uint32_t emu_perm(uint32_t hi, uint32_t lo, uint32_t sel) {
  const uint64_t v = (static_cast<uint64_t>(hi) << 32) | lo;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t s = (sel >> (8 * i)) & 0xff;
    if (s > 7) std::abort();
    r |= static_cast<uint32_t>((v >> (8 * s)) & 0xff) << (8 * i);
  }
  return r;
}
#define __builtin_amdgcn_perm emu_perm
#define __gfx906__ 1

/// Runs kernel(args...) over the grid with `threads` threads per block.
template <typename... A>
inline void emu_launch(void (*kernel)(A...), emu_dim3 grid, int threads, A... args) {
  gridDim = grid;
  blockDim = {static_cast<unsigned>(threads), 1, 1};
  const int waves = (threads + warpSize - 1) / warpSize;
  emu_wave_buf.assign(waves * warpSize, 0);
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        blockIdx = {x, y, z};
        std::barrier<> block_bar(threads);
        std::vector<std::barrier<>*> wb;
        for (int w = 0; w < waves; ++w) wb.push_back(new std::barrier<>(std::min(warpSize, threads - w * warpSize)));
        emu_block_barrier = &block_bar;
        emu_wave_barriers = wb;
        std::vector<std::thread> ts;
        for (int t = 0; t < threads; ++t)
          ts.emplace_back([&, t] { threadIdx = {static_cast<unsigned>(t), 0, 0}; kernel(args...); });
        for (auto& th : ts) th.join();
        for (auto* b : wb) delete b;
      }
}
