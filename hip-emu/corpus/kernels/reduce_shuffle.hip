// Sum: each wave reduces with __shfl_down over warpSize (64) lanes, lane 0 adds to the total.
#include <hip/hip_runtime.h>

__device__ float wave_sum(float v) {
  for (int offset = warpSize / 2; offset > 0; offset /= 2) v += __shfl_down(v, offset);
  return v;
}

__global__ void reduce_sum(const float* in, float* total, int n) {
  float v = 0.0f;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) v += in[i];
  v = wave_sum(v);
  if (__lane_id() == 0) atomicAdd(total, v);
}
