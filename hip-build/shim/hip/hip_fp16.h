// hip-emu host shim: __half for kernels/*.hip compiled as host C++ (see hip_runtime.h here).
//
// __half is IEEE binary16 stored in 2 bytes; conversions round to nearest even (clang's
// _Float16 on x86 goes through the compiler runtime's correctly rounded conversions).
#pragma once

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
