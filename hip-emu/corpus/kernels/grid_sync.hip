// A two-phase sum with a grid-wide barrier (cooperative groups): each block reduces its share
// into partial[], the grid syncs, then block 0 sums the partials. Launched with
// hipLaunchCooperativeKernel. `kept` checks that a block's LDS outlives the grid sync.
#include <hip/hip_runtime.h>
#include <hip/hip_cooperative_groups.h>

namespace cg = cooperative_groups;

#define BLOCK 128

__global__ void grid_sum(const float* x, float* partial, float* kept, float* out, int n) {
  cg::grid_group grid = cg::this_grid();
  cg::thread_block block = cg::this_thread_block();
  __shared__ float lds[BLOCK];
  __shared__ float block_total;
  float s = 0.0f;
  for (unsigned long long i = grid.thread_rank(); i < (unsigned long long)n; i += grid.size())
    s += x[i];
  lds[threadIdx.x] = s;
  block.sync();
  for (int stride = BLOCK / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) lds[threadIdx.x] += lds[threadIdx.x + stride];
    block.sync();
  }
  if (threadIdx.x == 0) {
    partial[blockIdx.x] = lds[0];
    block_total = lds[0];
  }
  grid.sync();
  if (threadIdx.x == 0) kept[blockIdx.x] = block_total;
  if (blockIdx.x == 0) {
    float t = 0.0f;
    for (unsigned b = threadIdx.x; b < gridDim.x; b += BLOCK) t += partial[b];
    lds[threadIdx.x] = t;
    block.sync();
    for (int stride = BLOCK / 2; stride > 0; stride >>= 1) {
      if (threadIdx.x < stride) lds[threadIdx.x] += lds[threadIdx.x + stride];
      block.sync();
    }
    if (threadIdx.x == 0) *out = lds[0];
  }
}

// Block 0 returns before the grid sync the others wait at: a launch error on hip-emu.
__global__ void grid_sync_after_exit(float* out) {
  if (blockIdx.x == 0) return;
  cg::this_grid().sync();
  out[blockIdx.x] = 1.0f;
}
