// Dot product in double: a block reduction in LDS, one double atomicAdd per block.
#include <hip/hip_runtime.h>

__global__ void dot_product(const double* a, const double* b, double* result, int n) {
  __shared__ double partial[256];
  double s = 0.0;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
    s += a[i] * b[i];
  }
  partial[threadIdx.x] = s;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(result, partial[0]);
}
