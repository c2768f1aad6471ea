// hip-emu host shim: HIP's vector types (`float4`, `uint2`, ...), included by hip/hip_runtime.h
// here. Each is HIP_vector_type<T, N>, as in HIP's headers, so a kernel taking one has the same
// mangled symbol on the device and in the host build; sizes and alignments are HIP's (N = 3:
// three packed elements; 1, 2 and 4: a vector of N aligned to its size). Element-wise
// arithmetic and bitwise operators, with a scalar on either side; == and != compare all.
#pragma once

#include <stddef.h>

template <typename T, unsigned int N> struct HIP_vector_type;

#define HIPEMU_VEC_COMMON(N)                                                 \
  HIP_vector_type() = default;                                              \
  explicit constexpr HIP_vector_type(T v) : HIP_vector_type(fill(v)) {}     \
  T* hipemu_data() { return &x; }                                           \
  const T* hipemu_data() const { return &x; }                               \
  T& operator[](size_t i) { return hipemu_data()[i]; }                      \
  const T& operator[](size_t i) const { return hipemu_data()[i]; }

template <typename T> struct alignas(sizeof(T)) HIP_vector_type<T, 1> {
  T x;
  static constexpr HIP_vector_type fill(T v) { return HIP_vector_type(v, 0); }
  constexpr HIP_vector_type(T a, int) : x(a) {}
  HIP_vector_type() = default;
  constexpr HIP_vector_type(T a) : x(a) {}
  T* hipemu_data() { return &x; }
  const T* hipemu_data() const { return &x; }
};
template <typename T> struct alignas(2 * sizeof(T)) HIP_vector_type<T, 2> {
  T x, y;
  static constexpr HIP_vector_type fill(T v) { return HIP_vector_type(v, v); }
  constexpr HIP_vector_type(T a, T b) : x(a), y(b) {}
  HIPEMU_VEC_COMMON(2)
};
template <typename T> struct HIP_vector_type<T, 3> {
  T x, y, z;
  static constexpr HIP_vector_type fill(T v) { return HIP_vector_type(v, v, v); }
  constexpr HIP_vector_type(T a, T b, T c) : x(a), y(b), z(c) {}
  HIPEMU_VEC_COMMON(3)
};
template <typename T> struct alignas(4 * sizeof(T)) HIP_vector_type<T, 4> {
  T x, y, z, w;
  static constexpr HIP_vector_type fill(T v) { return HIP_vector_type(v, v, v, v); }
  constexpr HIP_vector_type(T a, T b, T c, T d) : x(a), y(b), z(c), w(d) {}
  HIPEMU_VEC_COMMON(4)
};
#undef HIPEMU_VEC_COMMON

#define HIPEMU_VEC_BINARY(OP)                                                                 \
  template <typename T, unsigned int N>                                                       \
  inline HIP_vector_type<T, N>& operator OP##=(HIP_vector_type<T, N>& a,                      \
                                               const HIP_vector_type<T, N>& b) {              \
    for (unsigned i = 0; i < N; ++i) a.hipemu_data()[i] = a.hipemu_data()[i] OP b.hipemu_data()[i]; \
    return a;                                                                                 \
  }                                                                                           \
  template <typename T, unsigned int N>                                                       \
  inline HIP_vector_type<T, N>& operator OP##=(HIP_vector_type<T, N>& a, T b) {               \
    for (unsigned i = 0; i < N; ++i) a.hipemu_data()[i] = a.hipemu_data()[i] OP b;            \
    return a;                                                                                 \
  }                                                                                           \
  template <typename T, unsigned int N>                                                       \
  inline HIP_vector_type<T, N> operator OP(HIP_vector_type<T, N> a,                           \
                                           const HIP_vector_type<T, N>& b) {                  \
    return a OP##= b;                                                                         \
  }                                                                                           \
  template <typename T, unsigned int N>                                                       \
  inline HIP_vector_type<T, N> operator OP(HIP_vector_type<T, N> a, T b) {                    \
    return a OP##= b;                                                                         \
  }                                                                                           \
  template <typename T, unsigned int N>                                                       \
  inline HIP_vector_type<T, N> operator OP(T a, const HIP_vector_type<T, N>& b) {             \
    HIP_vector_type<T, N> r = b;                                                              \
    for (unsigned i = 0; i < N; ++i) r.hipemu_data()[i] = a OP b.hipemu_data()[i];            \
    return r;                                                                                 \
  }
HIPEMU_VEC_BINARY(+)
HIPEMU_VEC_BINARY(-)
HIPEMU_VEC_BINARY(*)
HIPEMU_VEC_BINARY(/)
HIPEMU_VEC_BINARY(%)
HIPEMU_VEC_BINARY(&)
HIPEMU_VEC_BINARY(|)
HIPEMU_VEC_BINARY(^)
HIPEMU_VEC_BINARY(<<)
HIPEMU_VEC_BINARY(>>)
#undef HIPEMU_VEC_BINARY

template <typename T, unsigned int N>
inline HIP_vector_type<T, N> operator-(HIP_vector_type<T, N> a) {
  for (unsigned i = 0; i < N; ++i) a.hipemu_data()[i] = -a.hipemu_data()[i];
  return a;
}
template <typename T, unsigned int N>
inline bool operator==(const HIP_vector_type<T, N>& a, const HIP_vector_type<T, N>& b) {
  for (unsigned i = 0; i < N; ++i) {
    if (!(a.hipemu_data()[i] == b.hipemu_data()[i])) return false;
  }
  return true;
}
template <typename T, unsigned int N>
inline bool operator!=(const HIP_vector_type<T, N>& a, const HIP_vector_type<T, N>& b) {
  return !(a == b);
}

typedef HIP_vector_type<char, 1> char1;
typedef HIP_vector_type<char, 2> char2;
typedef HIP_vector_type<char, 3> char3;
typedef HIP_vector_type<char, 4> char4;
inline char1 make_char1(char x) { return char1(x); }
inline char2 make_char2(char x, char y) { return char2(x, y); }
inline char3 make_char3(char x, char y, char z) { return char3(x, y, z); }
inline char4 make_char4(char x, char y, char z, char w) { return char4(x, y, z, w); }
typedef HIP_vector_type<unsigned char, 1> uchar1;
typedef HIP_vector_type<unsigned char, 2> uchar2;
typedef HIP_vector_type<unsigned char, 3> uchar3;
typedef HIP_vector_type<unsigned char, 4> uchar4;
inline uchar1 make_uchar1(unsigned char x) { return uchar1(x); }
inline uchar2 make_uchar2(unsigned char x, unsigned char y) { return uchar2(x, y); }
inline uchar3 make_uchar3(unsigned char x, unsigned char y, unsigned char z) { return uchar3(x, y, z); }
inline uchar4 make_uchar4(unsigned char x, unsigned char y, unsigned char z, unsigned char w) { return uchar4(x, y, z, w); }
typedef HIP_vector_type<short, 1> short1;
typedef HIP_vector_type<short, 2> short2;
typedef HIP_vector_type<short, 3> short3;
typedef HIP_vector_type<short, 4> short4;
inline short1 make_short1(short x) { return short1(x); }
inline short2 make_short2(short x, short y) { return short2(x, y); }
inline short3 make_short3(short x, short y, short z) { return short3(x, y, z); }
inline short4 make_short4(short x, short y, short z, short w) { return short4(x, y, z, w); }
typedef HIP_vector_type<unsigned short, 1> ushort1;
typedef HIP_vector_type<unsigned short, 2> ushort2;
typedef HIP_vector_type<unsigned short, 3> ushort3;
typedef HIP_vector_type<unsigned short, 4> ushort4;
inline ushort1 make_ushort1(unsigned short x) { return ushort1(x); }
inline ushort2 make_ushort2(unsigned short x, unsigned short y) { return ushort2(x, y); }
inline ushort3 make_ushort3(unsigned short x, unsigned short y, unsigned short z) { return ushort3(x, y, z); }
inline ushort4 make_ushort4(unsigned short x, unsigned short y, unsigned short z, unsigned short w) { return ushort4(x, y, z, w); }
typedef HIP_vector_type<int, 1> int1;
typedef HIP_vector_type<int, 2> int2;
typedef HIP_vector_type<int, 3> int3;
typedef HIP_vector_type<int, 4> int4;
inline int1 make_int1(int x) { return int1(x); }
inline int2 make_int2(int x, int y) { return int2(x, y); }
inline int3 make_int3(int x, int y, int z) { return int3(x, y, z); }
inline int4 make_int4(int x, int y, int z, int w) { return int4(x, y, z, w); }
typedef HIP_vector_type<unsigned int, 1> uint1;
typedef HIP_vector_type<unsigned int, 2> uint2;
typedef HIP_vector_type<unsigned int, 3> uint3;
typedef HIP_vector_type<unsigned int, 4> uint4;
inline uint1 make_uint1(unsigned int x) { return uint1(x); }
inline uint2 make_uint2(unsigned int x, unsigned int y) { return uint2(x, y); }
inline uint3 make_uint3(unsigned int x, unsigned int y, unsigned int z) { return uint3(x, y, z); }
inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) { return uint4(x, y, z, w); }
typedef HIP_vector_type<long, 1> long1;
typedef HIP_vector_type<long, 2> long2;
typedef HIP_vector_type<long, 3> long3;
typedef HIP_vector_type<long, 4> long4;
inline long1 make_long1(long x) { return long1(x); }
inline long2 make_long2(long x, long y) { return long2(x, y); }
inline long3 make_long3(long x, long y, long z) { return long3(x, y, z); }
inline long4 make_long4(long x, long y, long z, long w) { return long4(x, y, z, w); }
typedef HIP_vector_type<unsigned long, 1> ulong1;
typedef HIP_vector_type<unsigned long, 2> ulong2;
typedef HIP_vector_type<unsigned long, 3> ulong3;
typedef HIP_vector_type<unsigned long, 4> ulong4;
inline ulong1 make_ulong1(unsigned long x) { return ulong1(x); }
inline ulong2 make_ulong2(unsigned long x, unsigned long y) { return ulong2(x, y); }
inline ulong3 make_ulong3(unsigned long x, unsigned long y, unsigned long z) { return ulong3(x, y, z); }
inline ulong4 make_ulong4(unsigned long x, unsigned long y, unsigned long z, unsigned long w) { return ulong4(x, y, z, w); }
typedef HIP_vector_type<long long, 1> longlong1;
typedef HIP_vector_type<long long, 2> longlong2;
typedef HIP_vector_type<long long, 3> longlong3;
typedef HIP_vector_type<long long, 4> longlong4;
inline longlong1 make_longlong1(long long x) { return longlong1(x); }
inline longlong2 make_longlong2(long long x, long long y) { return longlong2(x, y); }
inline longlong3 make_longlong3(long long x, long long y, long long z) { return longlong3(x, y, z); }
inline longlong4 make_longlong4(long long x, long long y, long long z, long long w) { return longlong4(x, y, z, w); }
typedef HIP_vector_type<unsigned long long, 1> ulonglong1;
typedef HIP_vector_type<unsigned long long, 2> ulonglong2;
typedef HIP_vector_type<unsigned long long, 3> ulonglong3;
typedef HIP_vector_type<unsigned long long, 4> ulonglong4;
inline ulonglong1 make_ulonglong1(unsigned long long x) { return ulonglong1(x); }
inline ulonglong2 make_ulonglong2(unsigned long long x, unsigned long long y) { return ulonglong2(x, y); }
inline ulonglong3 make_ulonglong3(unsigned long long x, unsigned long long y, unsigned long long z) { return ulonglong3(x, y, z); }
inline ulonglong4 make_ulonglong4(unsigned long long x, unsigned long long y, unsigned long long z, unsigned long long w) { return ulonglong4(x, y, z, w); }
typedef HIP_vector_type<float, 1> float1;
typedef HIP_vector_type<float, 2> float2;
typedef HIP_vector_type<float, 3> float3;
typedef HIP_vector_type<float, 4> float4;
inline float1 make_float1(float x) { return float1(x); }
inline float2 make_float2(float x, float y) { return float2(x, y); }
inline float3 make_float3(float x, float y, float z) { return float3(x, y, z); }
inline float4 make_float4(float x, float y, float z, float w) { return float4(x, y, z, w); }
typedef HIP_vector_type<double, 1> double1;
typedef HIP_vector_type<double, 2> double2;
typedef HIP_vector_type<double, 3> double3;
typedef HIP_vector_type<double, 4> double4;
inline double1 make_double1(double x) { return double1(x); }
inline double2 make_double2(double x, double y) { return double2(x, y); }
inline double3 make_double3(double x, double y, double z) { return double3(x, y, z); }
inline double4 make_double4(double x, double y, double z, double w) { return double4(x, y, z, w); }
static_assert(sizeof(float3) == 12 && alignof(float3) == 4, "HIP's float3 layout");
static_assert(sizeof(float4) == 16 && alignof(float4) == 16, "HIP's float4 layout");
static_assert(sizeof(double2) == 16 && alignof(double2) == 16, "HIP's double2 layout");
