// Shuffles within sub-groups of the wave: xor butterfly over 16 lanes, an up-scan over 8, a
// broadcast of lane 3 of each group of 32.
#include <hip/hip_runtime.h>

__global__ void shfl_width(const int* in, int* sum16, int* scan8, int* bcast32) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  const int v = in[t];
  int s = v;
  for (int m = 8; m > 0; m >>= 1) s += __shfl_xor(s, m, 16);
  sum16[t] = s;
  int x = v;
  for (int d = 1; d < 8; d <<= 1) {
    const int up = __shfl_up(x, d, 8);
    if ((__lane_id() & 7) >= d) x += up;
  }
  scan8[t] = x;
  bcast32[t] = __shfl(v, 3, 32);
}
