// 1-D convolution with its mask in constant memory, written by the host before the launch.
#include <hip/hip_runtime.h>

#define MASK_WIDTH 5

__constant__ float mask[MASK_WIDTH];

__global__ void convolution_constant(const float* in, float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float s = 0.0f;
  for (int j = 0; j < MASK_WIDTH; ++j) {
    const int at = i + j - MASK_WIDTH / 2;
    if (at >= 0 && at < n) s += in[at] * mask[j];
  }
  out[i] = s;
}
