// clock64 and wall_clock64 around a loop: both counters go forward.
#include <hip/hip_runtime.h>

__global__ void timed_loop(const float* x, float* y, long long* ticks, int n) {
  const long long c0 = clock64();
  const long long w0 = wall_clock64();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  float v = x[i];
  for (int k = 0; k < n; ++k) v = v * 0.5f + 1.0f;
  y[i] = v;
  __threadfence();
  ticks[2 * i] = clock64() - c0;
  ticks[2 * i + 1] = wall_clock64() - w0;
}
