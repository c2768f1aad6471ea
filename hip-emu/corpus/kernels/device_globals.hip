// Device variables: a counter every thread bumps, a scale with an initial value, and a table in
// a namespace that the kernel rewrites.
#include <hip/hip_runtime.h>

__device__ unsigned int counter;
__device__ float scale = 2.5f;

namespace lut {
__device__ int table[8] = {1, 2, 3, 4, 5, 6, 7, 8};
}

__global__ void use_globals(float* x, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  atomicAdd(&counter, 1u);
  if (i < n) x[i] *= scale;
  if (i < 8) lut::table[i] *= 10;
}
