// float4 and uint2 arithmetic with HIP's vector types and operators.
#include <hip/hip_runtime.h>

__global__ void axpy4(float a, const float4* x, float4* y, uint2* sums, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float4 v = a * x[i] + y[i];
  v += make_float4(1.0f, 2.0f, 3.0f, 4.0f);
  y[i] = v - float4(0.5f);
  uint2 s = make_uint2(i, 2 * i);
  s = (s << 1u) + make_uint2(1, 1);
  sums[i] = s;
}
