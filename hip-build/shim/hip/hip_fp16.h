// hip-emu host shim: __half for kernels/*.hip compiled as host C++ (see hip_runtime.h here).
//
// __half is IEEE binary16 stored in 2 bytes; conversions round to nearest even (clang's
// _Float16 on x86 goes through the compiler runtime's correctly rounded conversions).
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

struct __half {
  _Float16 v;
  __half() = default;
  constexpr __half(_Float16 x) : v(x) {}
  explicit __half(float x) : v(static_cast<_Float16>(x)) {}
  operator float() const { return static_cast<float>(v); }
};
static_assert(sizeof(__half) == 2, "__half is 2 bytes");

struct __half2 {
  __half x, y;
};

inline float __half2float(__half h) { return static_cast<float>(h.v); }
inline __half __float2half(float f) { return __half(static_cast<_Float16>(f)); }
inline __half __float2half_rn(float f) { return __half(static_cast<_Float16>(f)); }
inline __half __ushort_as_half(unsigned short b) {
  __half h;
  memcpy(&h, &b, 2);
  return h;
}
inline unsigned short __half_as_ushort(__half h) {
  unsigned short b;
  memcpy(&b, &h, 2);
  return b;
}
inline __half __short_as_half(short b) {
  __half h;
  memcpy(&h, &b, 2);
  return h;
}
inline short __half_as_short(__half h) {
  short b;
  memcpy(&b, &h, 2);
  return b;
}
inline __half2 __floats2half2_rn(float a, float b) { return {__float2half_rn(a), __float2half_rn(b)}; }
inline float __low2float(__half2 h) { return __half2float(h.x); }
inline float __high2float(__half2 h) { return __half2float(h.y); }

// Arithmetic and comparisons of __half, correctly rounded as the device's f16 instructions:
// +, -, *, / in f32 then to f16 (f32 has 24 >= 2*11+2 bits, so that double rounding is
// innocuous); fma exactly in f64 (a 22-bit product plus an f16), rounded once to f16.
inline __half __hadd(__half a, __half b) { return __half(static_cast<float>(a) + static_cast<float>(b)); }
inline __half __hsub(__half a, __half b) { return __half(static_cast<float>(a) - static_cast<float>(b)); }
inline __half __hmul(__half a, __half b) { return __half(static_cast<float>(a) * static_cast<float>(b)); }
inline __half __hdiv(__half a, __half b) { return __half(static_cast<float>(a) / static_cast<float>(b)); }
inline __half __hneg(__half a) { return __half(static_cast<_Float16>(-a.v)); }
inline __half __hfma(__half a, __half b, __half c) {
  const double exact = static_cast<double>(a.v) * static_cast<double>(b.v) + static_cast<double>(c.v);
  return __half(static_cast<_Float16>(exact));
}
inline __half operator+(__half a, __half b) { return __hadd(a, b); }
inline __half operator-(__half a, __half b) { return __hsub(a, b); }
inline __half operator*(__half a, __half b) { return __hmul(a, b); }
inline __half operator/(__half a, __half b) { return __hdiv(a, b); }
inline __half operator-(__half a) { return __hneg(a); }
inline __half& operator+=(__half& a, __half b) { return a = a + b; }
inline __half& operator-=(__half& a, __half b) { return a = a - b; }
inline __half& operator*=(__half& a, __half b) { return a = a * b; }
inline __half& operator/=(__half& a, __half b) { return a = a / b; }
inline bool __heq(__half a, __half b) { return static_cast<float>(a) == static_cast<float>(b); }
inline bool __hlt(__half a, __half b) { return static_cast<float>(a) < static_cast<float>(b); }
inline bool __hgt(__half a, __half b) { return static_cast<float>(a) > static_cast<float>(b); }
inline bool __hle(__half a, __half b) { return static_cast<float>(a) <= static_cast<float>(b); }
inline bool __hge(__half a, __half b) { return static_cast<float>(a) >= static_cast<float>(b); }
inline __half __hmax(__half a, __half b) { return __hlt(a, b) ? b : a; }
inline __half __hmin(__half a, __half b) { return __hlt(b, a) ? b : a; }
inline __half __float2half_rz(float f) {
  const __half n = __float2half_rn(f);
  // Toward zero: step back one ulp when rounding to nearest moved away from zero.
  if (fabsf(static_cast<float>(n)) > fabsf(f)) {
    return __ushort_as_half(static_cast<unsigned short>(__half_as_ushort(n) - 1));
  }
  return n;
}
inline __half2 __hadd2(__half2 a, __half2 b) { return {a.x + b.x, a.y + b.y}; }
inline __half2 __hmul2(__half2 a, __half2 b) { return {a.x * b.x, a.y * b.y}; }
inline __half2 __hfma2(__half2 a, __half2 b, __half2 c) {
  return {__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y)};
}
inline __half2 __halves2half2(__half a, __half b) { return {a, b}; }
inline __half2 __float2half2_rn(float f) { return {__float2half_rn(f), __float2half_rn(f)}; }
inline __half __low2half(__half2 h) { return h.x; }
inline __half __high2half(__half2 h) { return h.y; }
