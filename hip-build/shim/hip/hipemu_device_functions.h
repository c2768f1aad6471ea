// hip-emu host shim: the device functions of HIP's headers that a CPU can do exactly (bit
// operations, integer intrinsics, fast math, timers, vector types with their operators),
// included by hip/hip_runtime.h here. Each follows the definition in HIP's own headers
// (amd_device_functions.h, amd_hip_vector_types.h) so that the same source gives the same
// result on the device. A builtin missing here is a compile error of the host build that names
// it (never a silent fallback).
#pragma once

#include <math.h>
#include <stdint.h>
#include <time.h>

// ---------------------------------------------------------------------------------------------
// Bit operations and integer intrinsics
// ---------------------------------------------------------------------------------------------

inline unsigned int __bitextract_u32(unsigned int src0, unsigned int src1, unsigned int src2) {
  const uint32_t offset = src1 & 31, width = src2 & 31;
  return width == 0 ? 0 : (src0 << (32 - offset - width)) >> (32 - width);
}
inline uint64_t __bitextract_u64(uint64_t src0, unsigned int src1, unsigned int src2) {
  const uint64_t offset = src1 & 63, width = src2 & 63;
  return width == 0 ? 0 : (src0 << (64 - offset - width)) >> (64 - width);
}
inline unsigned int __bitinsert_u32(unsigned int src0, unsigned int src1, unsigned int src2,
                                    unsigned int src3) {
  const uint32_t offset = src2 & 31, width = src3 & 31;
  const uint32_t mask = (1u << width) - 1;
  return (src0 & ~(mask << offset)) | ((src1 & mask) << offset);
}
inline uint64_t __bitinsert_u64(uint64_t src0, uint64_t src1, unsigned int src2,
                                unsigned int src3) {
  const uint64_t offset = src2 & 63, width = src3 & 63;
  const uint64_t mask = (1ull << width) - 1;
  return (src0 & ~(mask << offset)) | ((src1 & mask) << offset);
}
inline unsigned int __brev(unsigned int x) { return __builtin_bitreverse32(x); }
inline unsigned long long __brevll(unsigned long long x) { return __builtin_bitreverse64(x); }
/// Byte i of the result is byte (s >> 4i) & 7 of the 8 bytes {x (bytes 0-3), y (bytes 4-7)}.
inline unsigned int __byte_perm(unsigned int x, unsigned int y, unsigned int s) {
  const uint64_t bytes = (static_cast<uint64_t>(y) << 32) | x;
  unsigned int r = 0;
  for (int i = 0; i < 4; ++i) {
    const unsigned sel = (s >> (4 * i)) & 7;
    r |= static_cast<unsigned>((bytes >> (8 * sel)) & 0xFF) << (8 * i);
  }
  return r;
}
inline unsigned int __lastbit_u32_u32(unsigned int x) { return x == 0 ? ~0u : __builtin_ctz(x); }
inline unsigned int __lastbit_u32_u64(uint64_t x) { return x == 0 ? ~0u : __builtin_ctzll(x); }
inline int __mul24(int x, int y) {
  return static_cast<int>(static_cast<int64_t>((x << 8) >> 8) * ((y << 8) >> 8));
}
inline unsigned int __umul24(unsigned int x, unsigned int y) {
  return (x & 0xFFFFFF) * (y & 0xFFFFFF);
}
inline int __mulhi(int x, int y) {
  return static_cast<int>((static_cast<int64_t>(x) * y) >> 32);
}
inline unsigned int __umulhi(unsigned int x, unsigned int y) {
  return static_cast<unsigned>((static_cast<uint64_t>(x) * y) >> 32);
}
inline long long __mul64hi(long long x, long long y) {
  return static_cast<long long>((static_cast<__int128>(x) * y) >> 64);
}
inline unsigned long long __umul64hi(unsigned long long x, unsigned long long y) {
  return static_cast<unsigned long long>((static_cast<unsigned __int128>(x) * y) >> 64);
}
inline unsigned int __sad(int x, int y, unsigned int z) {
  return x > y ? static_cast<unsigned>(x - y) + z : static_cast<unsigned>(y - x) + z;
}
inline unsigned int __usad(unsigned int x, unsigned int y, unsigned int z) {
  return (x > y ? x - y : y - x) + z;
}
inline unsigned int __funnelshift_l(unsigned int lo, unsigned int hi, unsigned int shift) {
  const uint64_t v = (static_cast<uint64_t>(hi) << 32) | lo;
  return static_cast<unsigned>((v << (shift & 31)) >> 32);
}
inline unsigned int __funnelshift_r(unsigned int lo, unsigned int hi, unsigned int shift) {
  const uint64_t v = (static_cast<uint64_t>(hi) << 32) | lo;
  return static_cast<unsigned>(v >> (shift & 31));
}

// ---------------------------------------------------------------------------------------------
// Fast math (correctly rounded here; the device's fast versions may differ in the last bits)
// ---------------------------------------------------------------------------------------------

inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanf(float x) { return tanf(x); }
inline float __log10f(float x) { return log10f(x); }
inline float __exp10f(float x) { return exp10f(x); }
inline void __sincosf(float x, float* s, float* c) {
  *s = sinf(x);
  *c = cosf(x);
}

// ---------------------------------------------------------------------------------------------
// Timers: a monotonic nanosecond count (hip-emu's clock is not the device's)
// ---------------------------------------------------------------------------------------------

inline long long hipemu_now_ns() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<long long>(t.tv_sec) * 1000000000ll + t.tv_nsec;
}
inline long long clock64() { return hipemu_now_ns(); }
inline long long wall_clock64() { return hipemu_now_ns(); }
