// Host emulation of __half (see hip_runtime.h in this directory).
#pragma once
#include <cstdint>
#include <cstring>
struct __half { _Float16 v; };
inline float __half2float(__half h) { return static_cast<float>(h.v); }
inline __half __float2half_rn(float f) { return __half{static_cast<_Float16>(f)}; }
inline __half __ushort_as_half(unsigned short b) { __half h; std::memcpy(&h, &b, 2); return h; }
inline unsigned short __half_as_ushort(__half h) { unsigned short b; std::memcpy(&b, &h, 2); return b; }
