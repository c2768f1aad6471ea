// All-pairs shortest paths: one launch per intermediate vertex k.
#include <hip/hip_runtime.h>

__global__ void floyd_warshall_step(unsigned* dist, unsigned n, unsigned k) {
  const unsigned x = blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x >= n || y >= n) return;
  const unsigned via = dist[y * n + k] + dist[k * n + x];
  if (via < dist[y * n + x]) dist[y * n + x] = via;
}
