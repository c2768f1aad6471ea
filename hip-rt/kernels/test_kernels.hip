// hip-rt's test kernels: built with hipcc by hip-rt's device tests and example 03_launch
// (tests/common/mod.rs embeds this file), and compiled for the host by hip-emu's build, so the
// same tests and example run on hip-emu.
#include <hip/hip_runtime.h>

extern "C" __global__ void hipk_test_add(float* x, float v, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += v;
}

extern "C" __global__ void hipk_test_scale(float* x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= a;
}
