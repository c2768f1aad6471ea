// kernels/common.h — device helpers shared by every kernel file of hip-kernels.
//
// Never run on a GPU: compiled and statically checked (hipcc --genco, gfx906), and executed on
// the CPU by hip-emu (the emulated HIP device, hip-emu/shim) in the device tests.
//
// Contents (namespace hipk):
//   - storage types: float, __half, hipk::bf16 (a uint16_t wrapper; no dependency on the
//     vendor's hip_bfloat16, whose layout and conversions differ between HIP releases);
//   - conversions f16/bf16 <-> f32 with round-to-nearest-even (bf16 by bit manipulation,
//     NaN-preserving; f16 through the __half intrinsics): to_float(T), from_float<T>(float),
//     load_as_float(p, i), store_from_float(p, i, x);
//   - vector loads and stores of N consecutive elements as floats: checked, with scalar tails
//     and an alignment test per pack (load_floats<N>(p, i, n, out), store_floats<N>(p, i, n, in)),
//     or unchecked on a pack the caller knows is aligned and in range (load_vec<N>, store_vec<N>;
//     cheaper in registers: test alignment once per tensor, not per pack);
//   - wave and block reductions (sum, max, pairs of sums), wave-size agnostic: they use
//     warpSize and __shfl_xor(width = warpSize), never a hard-coded 32 or 64. Block
//     reductions go through LDS and visit the per-wave partials in a fixed order, so the
//     result is bit-reproducible run to run;
//   - HIPK_DTYPES(X) / HIPK_KERNEL(...) to instantiate `extern "C" __global__` kernels named
//     `<op>_<dtype>` for f32, f16 and bf16.
//
// All math is f32. Index type I of the load/store helpers is a template parameter: use int64_t
// for offsets into whole tensors (over 2^31 elements index correctly) and int for offsets
// inside a row the launcher has checked fits (fewer registers).
#pragma once

#include <hip/hip_fp16.h>
#include <hip/hip_runtime.h>
#include <stdint.h>

namespace hipk {

// ---------------------------------------------------------------------------------------------
// Storage types and conversions
// ---------------------------------------------------------------------------------------------

/// bfloat16 as stored in memory: the high 16 bits of an IEEE f32.
struct alignas(2) bf16 {
  uint16_t bits;
};

/// f32 -> bf16, round to nearest, ties to even. NaN stays NaN (quiet bit forced, sign kept);
/// values that round past the largest finite bf16 become infinity, as IEEE rounding requires.
__device__ __forceinline__ bf16 f32_to_bf16(float x) {
  const uint32_t u = __float_as_uint(x);
  bf16 r;
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    r.bits = static_cast<uint16_t>((u >> 16) | 0x0040u);
  } else {
    const uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
    r.bits = static_cast<uint16_t>((u + rounding_bias) >> 16);
  }
  return r;
}

/// bf16 -> f32, exact.
__device__ __forceinline__ float bf16_to_f32(bf16 x) {
  return __uint_as_float(static_cast<uint32_t>(x.bits) << 16);
}

/// Widen any storage type to f32 (exact for all three).
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(bf16 x) { return bf16_to_f32(x); }

/// Narrow f32 to a storage type with round-to-nearest-even.
template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <> __device__ __forceinline__ bf16 from_float<bf16>(float x) { return f32_to_bf16(x); }

/// Read p[i] as f32.
template <typename T, typename I> __device__ __forceinline__ float load_as_float(const T* p, I i) {
  return to_float(p[i]);
}

/// Write x to p[i], rounded to T's precision (round-to-nearest-even).
template <typename T, typename I>
__device__ __forceinline__ void store_from_float(T* p, I i, float x) {
  p[i] = from_float<T>(x);
}

// ---------------------------------------------------------------------------------------------
// Vector loads and stores with scalar tails
// ---------------------------------------------------------------------------------------------

/// Raw bit patterns of the storage types (for vector accesses that move integer words).
__device__ __forceinline__ float from_bits(float*, uint32_t b) { return __uint_as_float(b); }
__device__ __forceinline__ float from_bits(__half*, uint32_t b) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(b)));
}
__device__ __forceinline__ float from_bits(bf16*, uint32_t b) { return __uint_as_float(b << 16); }
__device__ __forceinline__ uint32_t to_bits(float x) { return __float_as_uint(x); }
__device__ __forceinline__ uint32_t to_bits(__half x) { return __half_as_ushort(x); }
__device__ __forceinline__ uint32_t to_bits(bf16 x) { return x.bits; }

/// A naturally aligned integer vector of exactly B bytes: the memory transaction of a vector
/// access (16 bytes -> one global_load_dwordx4).
template <int B> struct RawWords;
template <> struct RawWords<4> { using type = uint32_t; };
template <> struct RawWords<8> { using type = uint2; };
template <> struct RawWords<16> { using type = uint4; };

/// Elements of T in one 16-byte vector access: 4 for f32, 8 for f16/bf16.
template <typename T> struct VecWidth {
  static constexpr int value = 16 / static_cast<int>(sizeof(T));
};

/// True when p is aligned to `bytes` (a power of two).
__device__ __forceinline__ bool is_aligned(const void* p, uintptr_t bytes) {
  return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0;
}

/// out[k] = p[k] as f32 for k < N, as one vector access of N * sizeof(T) bytes (4, 8 or 16).
/// p must be aligned to that size. Unchecked: the caller guarantees the whole pack is valid.
template <int N, typename T>
__device__ __forceinline__ void load_vec(const T* p, float* out) {
  constexpr int kBytes = N * static_cast<int>(sizeof(T));
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "vector access of 4, 8 or 16 bytes");
  using Raw = typename RawWords<kBytes>::type;
  const Raw raw = *reinterpret_cast<const Raw*>(p);
  uint32_t w[kBytes / 4];
  __builtin_memcpy(w, &raw, kBytes);
#pragma unroll
  for (int k = 0; k < N; ++k) {
    const uint32_t bits = sizeof(T) == 4 ? w[k] : (w[k / 2] >> (16 * (k % 2))) & 0xffffu;
    out[k] = from_bits(static_cast<T*>(nullptr), bits);
  }
}

/// p[k] = in[k] rounded to T for k < N, as one aligned vector access (see load_vec).
template <int N, typename T>
__device__ __forceinline__ void store_vec(T* p, const float* in) {
  constexpr int kBytes = N * static_cast<int>(sizeof(T));
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "vector access of 4, 8 or 16 bytes");
  using Raw = typename RawWords<kBytes>::type;
  uint32_t w[kBytes / 4];
#pragma unroll
  for (int k = 0; k < kBytes / 4; ++k) w[k] = 0;
#pragma unroll
  for (int k = 0; k < N; ++k) {
    const uint32_t bits = to_bits(from_float<T>(in[k]));
    if (sizeof(T) == 4) {
      w[k] = bits;
    } else {
      w[k / 2] |= bits << (16 * (k % 2));
    }
  }
  Raw raw;
  __builtin_memcpy(&raw, w, kBytes);
  *reinterpret_cast<Raw*>(p) = raw;
}

namespace detail {

/// load_floats on a raw output pointer, for packs of up to 16 bytes.
template <int N, typename T, typename I>
__device__ __forceinline__ void load_pack(const T* p, I i, I n, float* out, float fill) {
  constexpr int kBytes = N * static_cast<int>(sizeof(T));
  if constexpr (kBytes == 4 || kBytes == 8 || kBytes == 16) {
    if (i + N <= n && is_aligned(p + i, kBytes)) {
      load_vec<N>(p + i, out);
      return;
    }
  }
#pragma unroll
  for (int k = 0; k < N; ++k) out[k] = (i + k < n) ? load_as_float(p, i + k) : fill;
}

/// store_floats on a raw input pointer, for packs of up to 16 bytes.
template <int N, typename T, typename I>
__device__ __forceinline__ void store_pack(T* p, I i, I n, const float* in) {
  constexpr int kBytes = N * static_cast<int>(sizeof(T));
  if constexpr (kBytes == 4 || kBytes == 8 || kBytes == 16) {
    if (i + N <= n && is_aligned(p + i, kBytes)) {
      store_vec<N>(p + i, in);
      return;
    }
  }
#pragma unroll
  for (int k = 0; k < N; ++k) {
    if (i + k < n) store_from_float(p, i + k, in[k]);
  }
}

}  // namespace detail

/// out[k] = p[i + k] as f32 for k < N. Elements at or past n read as `fill`. Each 16-byte
/// piece (or the whole pack when it is 4 or 8 bytes) is one vector access when it lies fully
/// inside [0, n) and is aligned to its size; otherwise scalar accesses (tails, unaligned rows),
/// never reading at or past n. Packs move as 32-bit words (no private array of T, which the
/// compiler could otherwise promote to LDS).
template <int N, typename T, typename I>
__device__ __forceinline__ void load_floats(const T* p, I i, I n, float (&out)[N],
                                            float fill = 0.0f) {
  constexpr int kPiece = (N * sizeof(T) > 16) ? VecWidth<T>::value : N;
  static_assert(N % kPiece == 0, "packs over 16 bytes must be whole 16-byte pieces");
#pragma unroll
  for (int k = 0; k < N; k += kPiece) detail::load_pack<kPiece>(p, i + k, n, out + k, fill);
}

/// p[i + k] = in[k] (rounded to T) for k < N and i + k < n; the same vector/scalar split as
/// load_floats.
template <int N, typename T, typename I>
__device__ __forceinline__ void store_floats(T* p, I i, I n, const float (&in)[N]) {
  constexpr int kPiece = (N * sizeof(T) > 16) ? VecWidth<T>::value : N;
  static_assert(N % kPiece == 0, "packs over 16 bytes must be whole 16-byte pieces");
#pragma unroll
  for (int k = 0; k < N; k += kPiece) detail::store_pack<kPiece>(p, i + k, n, in + k);
}

// ---------------------------------------------------------------------------------------------
// Reductions (wave-size agnostic)
// ---------------------------------------------------------------------------------------------

/// Upper bound on waves per block for LDS scratch sizing: 1024 threads / the smallest AMD
/// wave (32). Over-sized on wave64 DCUs on purpose, so nothing here assumes a wave size.
constexpr int kMaxWavesPerBlock = 1024 / 32;

struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

/// Butterfly reduction across the wave; every lane returns the full result.
template <typename Op> __device__ __forceinline__ float wave_reduce(float v, Op op) {
#pragma unroll
  for (int offset = warpSize / 2; offset > 0; offset /= 2) {
    v = op(v, __shfl_xor(v, offset, warpSize));
  }
  return v;
}

__device__ __forceinline__ float wave_sum(float v) { return wave_reduce(v, SumOp{}); }
__device__ __forceinline__ float wave_max(float v) { return wave_reduce(v, MaxOp{}); }

/// Sums two values at once (e.g. sum and sum of squares) with interleaved shuffles.
__device__ __forceinline__ void wave_sum2(float& a, float& b) {
#pragma unroll
  for (int offset = warpSize / 2; offset > 0; offset /= 2) {
    a += __shfl_xor(a, offset, warpSize);
    b += __shfl_xor(b, offset, warpSize);
  }
}

/// Linear thread index in the block and block size (1-, 2- or 3-D blocks).
__device__ __forceinline__ int block_thread_id() {
  return static_cast<int>(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
}
__device__ __forceinline__ int block_threads() {
  return static_cast<int>(blockDim.x * blockDim.y * blockDim.z);
}

/// Reduce over the whole block; every thread returns the result. `lds` holds at least
/// kMaxWavesPerBlock floats. All threads of the block must call it (it has barriers); on
/// return `lds` may be reused at once. Partials are combined in wave order: deterministic.
template <typename Op>
__device__ __forceinline__ float block_reduce(float v, Op op, float* lds) {
  const int tid = block_thread_id();
  const int lane = tid % warpSize;
  const int wave = tid / warpSize;
  const int waves = (block_threads() + warpSize - 1) / warpSize;
  v = wave_reduce(v, op);
  if (lane == 0) lds[wave] = v;
  __syncthreads();
  float r = lds[0];
  for (int w = 1; w < waves; ++w) r = op(r, lds[w]);
  __syncthreads();
  return r;
}

__device__ __forceinline__ float block_sum(float v, float* lds) {
  return block_reduce(v, SumOp{}, lds);
}
__device__ __forceinline__ float block_max(float v, float* lds) {
  return block_reduce(v, MaxOp{}, lds);
}

/// Block sum of two values at once; `lds` holds at least 2 * kMaxWavesPerBlock floats.
__device__ __forceinline__ void block_sum2(float& a, float& b, float* lds) {
  const int tid = block_thread_id();
  const int lane = tid % warpSize;
  const int wave = tid / warpSize;
  const int waves = (block_threads() + warpSize - 1) / warpSize;
  wave_sum2(a, b);
  if (lane == 0) {
    lds[2 * wave] = a;
    lds[2 * wave + 1] = b;
  }
  __syncthreads();
  a = lds[0];
  b = lds[1];
  for (int w = 1; w < waves; ++w) {
    a += lds[2 * w];
    b += lds[2 * w + 1];
  }
  __syncthreads();
}

/// p[i] for an i that is the same in every lane of the wave, from memory no thread writes
/// during the kernel: read through the constant address space, so the compiler may use one
/// scalar load (SMEM, into an SGPR) instead of a vector load per lane.
__device__ __forceinline__ float load_uniform(const float* p, int64_t i) {
#if defined(__HIP_DEVICE_COMPILE__)
  using ConstFloat = const __attribute__((address_space(4))) float;
  return ((ConstFloat*)p)[i];
#else
  return p[i];
#endif
}

/// p, which must be the same in every lane and point to global memory, declared uniform: the
/// compiler then keeps the base of `p + lane_offset` in SGPRs (`global_load v_off, s[base]`)
/// instead of one 64-bit VGPR address per access.
template <typename T> __device__ __forceinline__ T* uniform_global_ptr(T* p) {
#if defined(__HIP_DEVICE_COMPILE__)
  using Global = __attribute__((address_space(1))) T;
  const uint64_t a = reinterpret_cast<uintptr_t>(p);
  const uint32_t lo = __builtin_amdgcn_readfirstlane(static_cast<uint32_t>(a));
  const uint32_t hi = __builtin_amdgcn_readfirstlane(static_cast<uint32_t>(a >> 32));
  // An integer -> global pointer -> generic pointer: loads through it are global loads.
  return (T*)((Global*)((static_cast<uint64_t>(hi) << 32) | lo));
#else
  return p;
#endif
}

/// ceil(a / b) for positive b.
__device__ __forceinline__ int64_t div_ceil(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace hipk

// ---------------------------------------------------------------------------------------------
// Kernel instantiation
// ---------------------------------------------------------------------------------------------

/// Hot-loop markers for the static ISA report (`cargo xtask isa-report`, docs/ISA-REPORT.md).
/// Put HIPK_HOT_LOOP_BEGIN("name keys") right before a loop statement and
/// HIPK_HOT_LOOP_END("name") right after it; the report analyses that loop per iteration.
/// Keys (optional, space separated): elems=N (elements of the op a lane handles per iteration:
/// enables global bytes per element), group=G (loops whose bytes per element add up, e.g. the
/// passes over one row), min_t=A min_f32=B (the op's minimum bytes per element:
/// A·sizeof(T) + 4·B), kind=memory (no FMA-peak estimate), inner_trip=N (iterations of loops
/// nested inside), block=N (threads per block the launcher uses, for the LDS occupancy).
/// BEGIN expands to an `asm volatile` assembly comment: no instruction. Being volatile asm, it
/// stays where it is written, so keep it outside the loop body; END expands to nothing (it
/// marks the extent for the reader: an asm statement after the loop can change how the
/// compiler lays out the loop's exit). `cargo xtask isa-report --verify-markers` checks that
/// every marked loop's ISA is the same as in a build with -DHIPK_NO_HOT_MARKERS.
#if defined(HIPK_NO_HOT_MARKERS) || !defined(__HIP_DEVICE_COMPILE__)
#define HIPK_HOT_LOOP_BEGIN(text)
#define HIPK_HOT_LOOP_END(text)
#else
#define HIPK_HOT_LOOP_BEGIN(text) asm volatile(";hipk-hot-begin " text)
#define HIPK_HOT_LOOP_END(text)
#endif

/// Calls X(suffix, T) for each storage dtype. A kernel file writes its body once as a
/// __device__ template and instantiates the exported entry points with:
///
///   template <typename T> __device__ void scale_impl(T* x, int64_t n, float a) { ... }
///   #define SCALE_KERNEL(suffix, T)                                  \
///     HIPK_KERNEL(scale_##suffix, 256)(T* x, int64_t n, float a) {   \
///       scale_impl<T>(x, n, a);                                      \
///     }
///   HIPK_DTYPES(SCALE_KERNEL)
///
/// which exports scale_f32, scale_f16 and scale_bf16 with C linkage (no mangling), the names
/// the Rust side looks up.
#define HIPK_DTYPES(X) X(f32, float) X(f16, __half) X(bf16, ::hipk::bf16)

/// Declares an exported kernel with a launch bound of MAX_THREADS threads per block (the
/// register allocator uses it; launching more threads than this fails).
#define HIPK_KERNEL(NAME, MAX_THREADS) \
  extern "C" __global__ void __launch_bounds__(MAX_THREADS) NAME
