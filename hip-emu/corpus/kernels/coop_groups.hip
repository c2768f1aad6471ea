// Cooperative groups: a block, static tiles of 16 and 8 reducing with their shuffles, and a
// dynamic tile of 8.
#include <hip/hip_runtime.h>
#include <hip/hip_cooperative_groups.h>

namespace cg = cooperative_groups;

__global__ void tile_sums(const int* in, int* sum16, int* sum8, int* ranks) {
  cg::thread_block block = cg::this_thread_block();
  const int t = blockIdx.x * blockDim.x + block.thread_rank();
  cg::thread_block_tile<16> tile16 = cg::tiled_partition<16>(block);
  int v = in[t];
  for (int o = tile16.size() / 2; o > 0; o /= 2) v += tile16.shfl_down(v, o);
  if (tile16.thread_rank() == 0) sum16[t / 16] = v;
  cg::thread_block_tile<8> tile8 = cg::tiled_partition<8>(block);
  int w = in[t];
  for (int m = 4; m > 0; m /= 2) w += tile8.shfl_xor(w, m);
  sum8[t] = w;
  block.sync();
  cg::thread_group dynamic8 = cg::tiled_partition(block, 8);
  ranks[t] = dynamic8.thread_rank() + 100 * (block.thread_rank() / 16) + 1000 * (dynamic8.size() - 8);
}
