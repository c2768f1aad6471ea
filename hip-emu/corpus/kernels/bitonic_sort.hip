// Bitonic sort of blockDim.x keys (a power of two) in one block's LDS.
#include <hip/hip_runtime.h>

__global__ void bitonic_sort(int* keys) {
  extern __shared__ int s[];
  const unsigned t = threadIdx.x, n = blockDim.x;
  s[t] = keys[t];
  __syncthreads();
  for (unsigned size = 2; size <= n; size <<= 1) {
    for (unsigned stride = size / 2; stride > 0; stride >>= 1) {
      const unsigned partner = t ^ stride;
      if (partner > t) {
        const bool ascending = (t & size) == 0;
        const int a = s[t], b = s[partner];
        if ((a > b) == ascending) {
          s[t] = b;
          s[partner] = a;
        }
      }
      __syncthreads();
    }
  }
  keys[t] = s[t];
}
