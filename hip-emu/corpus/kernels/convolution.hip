// 1-D convolution with a mask passed as an argument; the template takes the mask width.
#include <hip/hip_runtime.h>

template <int MASK>
__global__ void convolution_1d(const float* in, const float* mask, float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float s = 0.0f;
  for (int j = 0; j < MASK; ++j) {
    const int at = i + j - MASK / 2;
    if (at >= 0 && at < n) s += in[at] * mask[j];
  }
  out[i] = s;
}

template __global__ void convolution_1d<5>(const float*, const float*, float*, int);
template __global__ void convolution_1d<3>(const float*, const float*, float*, int);
