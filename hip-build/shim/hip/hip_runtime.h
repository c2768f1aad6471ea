// hip-emu host shim of the HIP device builtins that kernels/*.hip use.
//
// The kernels are compiled as ordinary host C++ (clang++ >= 15) against this header and run by
// hip-emu's executor (hip-emu/src/exec): one fibre per GPU thread, blocks one after another,
// wavefront 64 (lane = linear thread index % 64), gfx906 code paths (__gfx906__ is defined).
//
// Every synchronising builtin (__syncthreads, shuffles, DPP, ballot/any/all, readfirstlane,
// wave barrier) suspends the calling fibre into the executor, which completes the operation
// once every participant has arrived and reports misuse (divergence, a barrier some threads
// never reach, different barrier sites) as a launch error naming the kernel, the block and the
// call sites. The call site is the caller's file:line (default arguments __builtin_FILE() /
// __builtin_LINE()).
//
// __shared__ variables are function-local statics in the linker section `hipemu_lds_<n>` of their
// kernel source file, which the executor fills with 0xFF bytes (NaN as f32, f16, bf16 and f64; -1 as integers) before every
// block. Launches are serialised, so one copy per variable is enough. Dynamic LDS
// (`extern __shared__ T name[];`, rewritten by build.rs, or HIP_DYNAMIC_SHARED) is a buffer of
// the launch's dynamic size, filled the same way.
//
// NOT the device compiler: exp2/log2/sqrt round as the host libm does, f16 dot products round
// twice, the memory model is sequential. Nothing measured here is a device figure.
#pragma once

#include <hip/hip_fp16.h>
#include <hip/hipemu_device_functions.h>
#include <math.h>
#include <stdio.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

// Every kernel goes to one section (and is kept): hip-build's host build lists the functions
// defined there and registers each under its symbol (C++ kernels under their mangled name).
#define __global__ __attribute__((annotate("hipemu_kernel"), section("hipemu_kernels"), used))
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
// One section per kernel source (build.rs defines HIPEMU_LDS_SECTION per generated TU), so a
// block refills only its own file's LDS.
#ifndef HIPEMU_LDS_SECTION
#define HIPEMU_LDS_SECTION "hipemu_lds"
#endif
#define __shared__ static __attribute__((section(HIPEMU_LDS_SECTION)))
#define HIP_DYNAMIC_SHARED(type, var) type* var = reinterpret_cast<type*>(hipemu_dynamic_lds());
#define HIPEMU_EXTERN_SHARED(type, var) type* const var = reinterpret_cast<type*>(hipemu_dynamic_lds())
#define HIP_DYNAMIC_SHARED_ATTRIBUTE
#define __align__(n) alignas(n)

// Code paths of the emulated device: a gfx906 (wave64) DCU on the AMD platform, as hipcc
// defines them (hip-build's host build also passes these on the command line, so code that
// tests them before including this header sees them too). Not defined: __HIP_DEVICE_COMPILE__
// and __AMDGCN__, which select address-space casts and inline GCN assembly.
#ifndef __gfx906__
#define __gfx906__ 1
#endif
#ifndef __AMDGCN_WAVEFRONT_SIZE
#define __AMDGCN_WAVEFRONT_SIZE 64
#endif
#ifndef __HIP_PLATFORM_AMD__
#define __HIP_PLATFORM_AMD__ 1
#endif
#ifndef __HIP_PLATFORM_HCC__
#define __HIP_PLATFORM_HCC__ 1
#endif
#ifndef __HIP__
#define __HIP__ 1
#endif
#ifndef __HIPCC__
#define __HIPCC__ 1
#endif
#ifndef HIPEMU
#define HIPEMU 1
#endif

constexpr int warpSize = 64;

// ---------------------------------------------------------------------------------------------
// Executor interface (hip-emu/src/exec; C ABI)
// ---------------------------------------------------------------------------------------------

struct hipemu_uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};

/// Per-launch and per-fibre state, written by the executor before it resumes a fibre.
struct hipemu_state_t {
  hipemu_uint3 thread_idx;
  hipemu_uint3 block_idx;
  hipemu_uint3 block_dim;
  hipemu_uint3 grid_dim;
  void* dynamic_lds;
  unsigned block_threads;
};

extern "C" {
extern hipemu_state_t hipemu_state;
/// Block barrier at file:line.
void hipemu_barrier(const char* file, unsigned line);
/// Wave operation at file:line (kinds below); returns this lane's result.
uint64_t hipemu_wave_op(unsigned kind, uint64_t value, int src_lane, uint64_t fallback,
                        const char* file, unsigned line);
}

enum : unsigned {
  HIPEMU_WAVE_PERMUTE = 0,        // result = value of lane src_lane, or fallback (invalid/inactive)
  HIPEMU_WAVE_BALLOT = 1,         // result = mask of lanes whose value != 0
  HIPEMU_WAVE_READFIRSTLANE = 2,  // result = value of the lowest active lane
  HIPEMU_WAVE_BARRIER = 3,        // no data; every lane of the wave must arrive
  HIPEMU_GRID_SYNC = 4,           // no data; every thread of the grid must arrive (cooperative)
};

#define threadIdx (hipemu_state.thread_idx)
#define blockIdx (hipemu_state.block_idx)
#define blockDim (hipemu_state.block_dim)
#define gridDim (hipemu_state.grid_dim)

inline void* hipemu_dynamic_lds() { return hipemu_state.dynamic_lds; }

namespace hipemu {
/// Linear thread index in the block.
inline unsigned linear_tid() {
  return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}
inline int lane_id() { return static_cast<int>(linear_tid() % warpSize); }
/// Lanes of this thread's wave that exist (a block of 96 threads has a second wave of 32).
inline uint64_t wave_exist_mask() {
  const unsigned first = linear_tid() / warpSize * warpSize;
  const unsigned n = hipemu_state.block_threads - first;
  return n >= 64 ? ~0ull : ((1ull << n) - 1);
}
template <typename T> inline uint64_t to_u64(T v) {
  static_assert(sizeof(T) <= 8, "wave operations move at most 8 bytes per lane");
  uint64_t u = 0;
  memcpy(&u, &v, sizeof(T));
  return u;
}
template <typename T> inline T from_u64(uint64_t u) {
  T v;
  memcpy(&v, &u, sizeof(T));
  return v;
}
template <typename T>
inline T permute(T v, int src, T fallback, const char* file, unsigned line) {
  return from_u64<T>(hipemu_wave_op(HIPEMU_WAVE_PERMUTE, to_u64(v), src, to_u64(fallback), file,
                                    line));
}
}  // namespace hipemu

// ---------------------------------------------------------------------------------------------
// Synchronisation and wave operations
// ---------------------------------------------------------------------------------------------

inline void __syncthreads(const char* file = __builtin_FILE(), unsigned line = __builtin_LINE()) {
  hipemu_barrier(file, line);
}
inline void __threadfence() {}
inline void __threadfence_block() {}
inline void __threadfence_system() {}
inline void __builtin_amdgcn_s_barrier(const char* file = __builtin_FILE(),
                                       unsigned line = __builtin_LINE()) {
  hipemu_barrier(file, line);
}
/// Wave-level convergence point: every lane of the wave must arrive (lanes are not in lockstep
/// here, so this is where a wave's LDS exchanges become visible to each other).
inline void hipemu_wave_barrier(const char* file = __builtin_FILE(),
                                unsigned line = __builtin_LINE()) {
  hipemu_wave_op(HIPEMU_WAVE_BARRIER, 0, 0, 0, file, line);
}
#define __builtin_amdgcn_wave_barrier hipemu_wave_barrier

inline unsigned __lane_id() { return static_cast<unsigned>(hipemu::lane_id()); }

// ds_bpermute semantics: the source lane is (index & 63); an inactive source lane reads 0.
// Index arithmetic as in HIP's amd_warp_functions.h.
template <typename T>
inline T __shfl(T var, int src_lane, int width = warpSize, const char* file = __builtin_FILE(),
                unsigned line = __builtin_LINE()) {
  const int self = hipemu::lane_id();
  const int index = src_lane + (self & ~(width - 1));
  return hipemu::permute<T>(var, index & 63, T{}, file, line);
}
template <typename T>
inline T __shfl_xor(T var, int lane_mask, int width = warpSize,
                    const char* file = __builtin_FILE(), unsigned line = __builtin_LINE()) {
  const int self = hipemu::lane_id();
  int index = self ^ lane_mask;
  index = index >= ((self + width) & ~(width - 1)) ? self : index;
  return hipemu::permute<T>(var, index & 63, T{}, file, line);
}
template <typename T>
inline T __shfl_up(T var, unsigned lane_delta, int width = warpSize,
                   const char* file = __builtin_FILE(), unsigned line = __builtin_LINE()) {
  const int self = hipemu::lane_id();
  int index = self - static_cast<int>(lane_delta);
  index = (index < (self & ~(width - 1))) ? self : index;
  return hipemu::permute<T>(var, index & 63, T{}, file, line);
}
template <typename T>
inline T __shfl_down(T var, unsigned lane_delta, int width = warpSize,
                     const char* file = __builtin_FILE(), unsigned line = __builtin_LINE()) {
  const int self = hipemu::lane_id();
  int index = self + static_cast<int>(lane_delta);
  index = static_cast<int>((self & (width - 1)) + lane_delta) >= width ? self : index;
  return hipemu::permute<T>(var, index & 63, T{}, file, line);
}
inline int hipemu_ds_bpermute(int addr, int v, const char* file = __builtin_FILE(),
                              unsigned line = __builtin_LINE()) {
  return hipemu::permute<int>(v, (addr >> 2) & 63, 0, file, line);
}
#define __builtin_amdgcn_ds_bpermute hipemu_ds_bpermute

inline unsigned long long __ballot(int predicate, const char* file = __builtin_FILE(),
                                   unsigned line = __builtin_LINE()) {
  return hipemu_wave_op(HIPEMU_WAVE_BALLOT, predicate != 0, 0, 0, file, line);
}
inline int __any(int predicate, const char* file = __builtin_FILE(),
                 unsigned line = __builtin_LINE()) {
  return __ballot(predicate, file, line) != 0;
}
inline int __all(int predicate, const char* file = __builtin_FILE(),
                 unsigned line = __builtin_LINE()) {
  return __ballot(predicate, file, line) == hipemu::wave_exist_mask();
}
inline int hipemu_readfirstlane(int v, const char* file = __builtin_FILE(),
                                unsigned line = __builtin_LINE()) {
  return static_cast<int>(hipemu_wave_op(HIPEMU_WAVE_READFIRSTLANE,
                                         static_cast<uint32_t>(v), 0, 0, file, line));
}
#define __builtin_amdgcn_readfirstlane hipemu_readfirstlane

/// DPP (gfx9): quad_perm, row_shl/shr/ror, wave_shl/rol/shr/ror, row_mirror, row_half_mirror,
/// row_bcast15/31. A lane whose source is out of range or inactive gets 0 with bound_ctrl,
/// else `old`; a lane whose row (row_mask) or bank (bank_mask) is disabled keeps `old`.
inline int hipemu_update_dpp(int old, int src, int ctrl, int row_mask, int bank_mask,
                             bool bound_ctrl, const char* file = __builtin_FILE(),
                             unsigned line = __builtin_LINE()) {
  const int lane = hipemu::lane_id();
  const int row = lane >> 4, in_row = lane & 15, row_base = lane & ~15;
  int from = -1;
  if (ctrl >= 0 && ctrl <= 0xFF) {
    from = (lane & ~3) | ((ctrl >> (2 * (lane & 3))) & 3);
  } else if (ctrl >= 0x101 && ctrl <= 0x10F) {  // row_shl
    const int n = ctrl & 15;
    from = in_row + n < 16 ? lane + n : -1;
  } else if (ctrl >= 0x111 && ctrl <= 0x11F) {  // row_shr
    const int n = ctrl & 15;
    from = in_row >= n ? lane - n : -1;
  } else if (ctrl >= 0x121 && ctrl <= 0x12F) {  // row_ror
    const int n = ctrl & 15;
    from = row_base | ((in_row - n) & 15);
  } else if (ctrl == 0x130) {  // wave_shl1
    from = lane + 1 < 64 ? lane + 1 : -1;
  } else if (ctrl == 0x134) {  // wave_rol1
    from = (lane + 1) & 63;
  } else if (ctrl == 0x138) {  // wave_shr1
    from = lane - 1;
  } else if (ctrl == 0x13C) {  // wave_ror1
    from = (lane - 1) & 63;
  } else if (ctrl == 0x140) {  // row_mirror
    from = row_base | (15 - in_row);
  } else if (ctrl == 0x141) {  // row_half_mirror
    from = (lane & ~7) | (7 - (lane & 7));
  } else if (ctrl == 0x142) {  // row_bcast15
    from = row >= 1 ? row_base - 1 : -1;
  } else if (ctrl == 0x143) {  // row_bcast31
    from = row >= 2 ? 31 : -1;
  } else {
    __builtin_trap();  // not a gfx9 DPP control: the device compiler rejects it too
  }
  const int r = hipemu::permute<int>(src, from, bound_ctrl ? 0 : old, file, line);
  const bool enabled = ((row_mask >> row) & 1) && ((bank_mask >> (in_row >> 2)) & 1);
  return enabled ? r : old;
}
inline int hipemu_mov_dpp(int src, int ctrl, int row_mask, int bank_mask, bool bound_ctrl,
                          const char* file = __builtin_FILE(), unsigned line = __builtin_LINE()) {
  return hipemu_update_dpp(0, src, ctrl, row_mask, bank_mask, bound_ctrl, file, line);
}
#define __builtin_amdgcn_update_dpp hipemu_update_dpp
#define __builtin_amdgcn_mov_dpp hipemu_mov_dpp

/// v_readlane_b32: the value of lane `lane` (uniform) in every lane; a lane that does not
/// exist reads 0.
inline int hipemu_readlane(int v, int lane, const char* file = __builtin_FILE(),
                           unsigned line = __builtin_LINE()) {
  return hipemu::permute<int>(v, lane & 63, 0, file, line);
}
#define __builtin_amdgcn_readlane hipemu_readlane

/// ds_swizzle_b32 (gfx9): pattern bit 15 set: quad-permute mode (each group of 4 lanes, two
/// bits per lane); else bitmask mode within groups of 32 lanes: source = ((lane & and) | or) ^
/// xor with and = pattern[4:0], or = pattern[9:5], xor = pattern[14:10]. An inactive source
/// lane reads 0.
inline int hipemu_ds_swizzle(int v, int pattern, const char* file = __builtin_FILE(),
                             unsigned line = __builtin_LINE()) {
  const int lane = hipemu::lane_id();
  int from;
  if (pattern & 0x8000) {
    from = (lane & ~3) | ((pattern >> (2 * (lane & 3))) & 3);
  } else {
    const int and_mask = pattern & 0x1F, or_mask = (pattern >> 5) & 0x1F;
    const int xor_mask = (pattern >> 10) & 0x1F;
    from = (lane & ~31) | ((((lane & 31) & and_mask) | or_mask) ^ xor_mask);
  }
  return hipemu::permute<int>(v, from, 0, file, line);
}
#define __builtin_amdgcn_ds_swizzle hipemu_ds_swizzle

/// v_perm_b32: byte i of the result is selected by byte i of `sel` from the 8 bytes {a, b}
/// (b = bytes 0-3, a = bytes 4-7): 0-7 that byte, 8-11 the sign of byte 1/3/5/7 replicated,
/// 12 zero, 13 and above 0xFF.
inline unsigned hipemu_perm(unsigned a, unsigned b, unsigned sel) {
  const uint64_t bytes = (static_cast<uint64_t>(a) << 32) | b;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) {
    const unsigned s = (sel >> (8 * i)) & 0xFF;
    unsigned byte;
    if (s < 8) {
      byte = static_cast<unsigned>(bytes >> (8 * s)) & 0xFF;
    } else if (s < 12) {
      byte = ((bytes >> (16 * (s - 8) + 15)) & 1) ? 0xFF : 0x00;
    } else if (s == 12) {
      byte = 0;
    } else {
      byte = 0xFF;
    }
    r |= byte << (8 * i);
  }
  return r;
}
#define __builtin_amdgcn_perm hipemu_perm

/// Read-only cache load: an ordinary load here.
template <typename T> inline T __ldg(const T* p) { return *p; }

inline unsigned hipemu_mbcnt_lo(unsigned mask, unsigned acc) {
  const int lane = hipemu::lane_id();
  const unsigned below = lane >= 32 ? ~0u : ((1u << lane) - 1);
  return acc + static_cast<unsigned>(__builtin_popcount(mask & below));
}
inline unsigned hipemu_mbcnt_hi(unsigned mask, unsigned acc) {
  const int lane = hipemu::lane_id();
  const unsigned below = lane < 32 ? 0u : (lane >= 64 ? ~0u : ((1u << (lane - 32)) - 1));
  return acc + static_cast<unsigned>(__builtin_popcount(mask & below));
}
#define __builtin_amdgcn_mbcnt_lo hipemu_mbcnt_lo
#define __builtin_amdgcn_mbcnt_hi hipemu_mbcnt_hi

// ---------------------------------------------------------------------------------------------
// Vector types
// ---------------------------------------------------------------------------------------------

#include <hip/hipemu_vector_types.h>

/// v_dot2_f32_f16: a.x * b.x + a.y * b.y + c (products exact in f32; the sums round here in
/// f32 one at a time, the device may round once).
typedef _Float16 hipemu_half2 __attribute__((ext_vector_type(2)));
inline float hipemu_fdot2(hipemu_half2 a, hipemu_half2 b, float c, bool /*clamp*/) {
  return static_cast<float>(a.x) * static_cast<float>(b.x) +
         static_cast<float>(a.y) * static_cast<float>(b.y) + c;
}
#define __builtin_amdgcn_fdot2 hipemu_fdot2

// ---------------------------------------------------------------------------------------------
// Bit casts, integer intrinsics, math
// ---------------------------------------------------------------------------------------------

inline float __int_as_float(int x) { return __builtin_bit_cast(float, x); }
inline int __float_as_int(float x) { return __builtin_bit_cast(int, x); }
inline float __uint_as_float(uint32_t x) { return __builtin_bit_cast(float, x); }
inline uint32_t __float_as_uint(float x) { return __builtin_bit_cast(uint32_t, x); }
inline double __longlong_as_double(long long x) { return __builtin_bit_cast(double, x); }
inline long long __double_as_longlong(double x) { return __builtin_bit_cast(long long, x); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline int __clzll(long long x) {
  return x == 0 ? 64 : __builtin_clzll(static_cast<unsigned long long>(x));
}

inline float __log2f(float x) { return log2f(x); }
inline float __exp2f(float x) { return exp2f(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float __frsqrt_rn(float x) { return 1.0f / sqrtf(x); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }

#define HIPEMU_MINMAX(T)                          \
  inline T min(T a, T b) { return b < a ? b : a; } \
  inline T max(T a, T b) { return a < b ? b : a; }
HIPEMU_MINMAX(int)
HIPEMU_MINMAX(unsigned)
HIPEMU_MINMAX(long)
HIPEMU_MINMAX(unsigned long)
HIPEMU_MINMAX(long long)
HIPEMU_MINMAX(unsigned long long)
#undef HIPEMU_MINMAX
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }

// ---------------------------------------------------------------------------------------------
// Atomics: a fibre is never preempted between the read and the write, so plain
// read-modify-write is atomic with respect to every other GPU thread of the launch. Not
// instrumented for the race check (atomics do not race).
// ---------------------------------------------------------------------------------------------

#define HIPEMU_ATOMIC __attribute__((no_sanitize("thread"), noinline))

namespace hipemu {
/// The value operand takes the pointee's type (as HIP's overloads do: `atomicAdd(&u, 1)`).
template <typename T> struct same { using type = T; };
template <typename T> using same_t = typename same<T>::type;
}  // namespace hipemu

template <typename T> HIPEMU_ATOMIC T atomicAdd(T* p, hipemu::same_t<T> v) {
  const T old = *p;
  *p = old + v;
  return old;
}
template <typename T> HIPEMU_ATOMIC T atomicSub(T* p, hipemu::same_t<T> v) {
  const T old = *p;
  *p = old - v;
  return old;
}
template <typename T> HIPEMU_ATOMIC T atomicMax(T* p, hipemu::same_t<T> v) {
  const T old = *p;
  *p = old < v ? v : old;
  return old;
}
template <typename T> HIPEMU_ATOMIC T atomicMin(T* p, hipemu::same_t<T> v) {
  const T old = *p;
  *p = v < old ? v : old;
  return old;
}
template <typename T> HIPEMU_ATOMIC T atomicExch(T* p, hipemu::same_t<T> v) {
  const T old = *p;
  *p = v;
  return old;
}
template <typename T> HIPEMU_ATOMIC T atomicCAS(T* p, hipemu::same_t<T> compare, hipemu::same_t<T> v) {
  const T old = *p;
  if (old == compare) *p = v;
  return old;
}
template <typename T> HIPEMU_ATOMIC T atomicAnd(T* p, hipemu::same_t<T> v) {
  const T old = *p;
  *p = old & v;
  return old;
}
template <typename T> HIPEMU_ATOMIC T atomicOr(T* p, hipemu::same_t<T> v) {
  const T old = *p;
  *p = old | v;
  return old;
}
template <typename T> HIPEMU_ATOMIC T atomicXor(T* p, hipemu::same_t<T> v) {
  const T old = *p;
  *p = old ^ v;
  return old;
}
/// ((old >= val) ? 0 : old + 1), as the device's atomic_inc.
HIPEMU_ATOMIC inline unsigned int atomicInc(unsigned int* p, unsigned int val) {
  const unsigned int old = *p;
  *p = old >= val ? 0 : old + 1;
  return old;
}
/// ((old == 0 || old > val) ? val : old - 1), as the device's atomic_dec.
HIPEMU_ATOMIC inline unsigned int atomicDec(unsigned int* p, unsigned int val) {
  const unsigned int old = *p;
  *p = (old == 0 || old > val) ? val : old - 1;
  return old;
}
// The system- and block-scope forms are the same operations here.
#define atomicAdd_system atomicAdd
#define atomicCAS_system atomicCAS
#define atomicExch_system atomicExch

/// Every lane that exists in this thread's wave (lanes are never inactive at a call here).
inline unsigned long long __activemask(const char* file = __builtin_FILE(),
                                       unsigned line = __builtin_LINE()) {
  return __ballot(1, file, line);
}

// Inline assembly is GCN code that a CPU cannot run: an `asm` statement in a kernel fails the
// host build with this message (clang reports it first) rather than miscompiling.
#define asm static_assert(false, "hip-emu: inline GCN assembly (asm) cannot run on hip-emu's CPU host build; guard it with #ifdef __HIP_DEVICE_COMPILE__ and give hip-emu a C++ path"); (void)

// ---------------------------------------------------------------------------------------------
// Host side of a kernel file: only what makes a launch site compile (it instantiates the
// templates it launches, as on the device); host code never runs in the host build.
// ---------------------------------------------------------------------------------------------

typedef struct ihipStream_t* hipStream_t;
#define HIP_KERNEL_NAME(...) __VA_ARGS__
#define hipLaunchKernelGGL(kernel, ...) ((void)(&kernel))

// __constant__ and __device__ variables are ordinary globals of the host build, registered by
// hip-build (hipemu_registry.h's HIPEMU_GLOBAL); hip-emu mirrors each in device memory for
// hipModuleGetGlobal and copies it in before and out after every launch of the module.
#define __constant__
