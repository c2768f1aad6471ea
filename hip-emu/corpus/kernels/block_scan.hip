// Inclusive prefix sum of one block (Hillis-Steele in LDS, double buffered).
#include <hip/hip_runtime.h>

__global__ void block_scan(const int* in, int* out, int n) {
  __shared__ int buf[2][256];
  const int t = threadIdx.x;
  int cur = 0;
  buf[cur][t] = t < n ? in[t] : 0;
  __syncthreads();
  for (int offset = 1; offset < blockDim.x; offset *= 2) {
    const int next = 1 - cur;
    buf[next][t] = buf[cur][t] + (t >= offset ? buf[cur][t - offset] : 0);
    cur = next;
    __syncthreads();
  }
  if (t < n) out[t] = buf[cur][t];
}
