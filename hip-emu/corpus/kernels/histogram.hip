// 64-bin histogram: per-block bins in LDS with atomics, then merged into global bins.
#include <hip/hip_runtime.h>

#define BINS 64

__global__ void histogram(const unsigned char* data, unsigned* bins, int n) {
  __shared__ unsigned local[BINS];
  for (int b = threadIdx.x; b < BINS; b += blockDim.x) local[b] = 0;
  __syncthreads();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
    atomicAdd(&local[data[i] % BINS], 1);
  }
  __syncthreads();
  for (int b = threadIdx.x; b < BINS; b += blockDim.x) atomicAdd(&bins[b], local[b]);
}
