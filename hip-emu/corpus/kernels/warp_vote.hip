// Wave votes: ballot, any, all and lane ids, on a wave of 64.
#include <hip/hip_runtime.h>

__global__ void warp_vote(const int* in, unsigned long long* ballots, int* flags) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  const int v = in[t];
  const unsigned long long b = __ballot(v > 0);
  const int any = __any(v > 100);
  const int all = __all(v >= 0);
  const unsigned long long active = __ballot(1);
  if (__lane_id() == 0) {
    const int wave = t / warpSize;
    ballots[wave] = b;
    flags[3 * wave] = any;
    flags[3 * wave + 1] = all;
    flags[3 * wave + 2] = __popcll(active);
  }
}
