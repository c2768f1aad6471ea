// Moving average over a window fixed at compile time; the template is instantiated by the launch
// site below (as a program's host code does).
#include <hip/hip_runtime.h>

template <int WINDOW>
__global__ void moving_average(const float* in, float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i + WINDOW > n) return;
  float s = 0.0f;
  for (int j = 0; j < WINDOW; ++j) s += in[i + j];
  out[i] = s / WINDOW;
}

void launch_moving_average(const float* in, float* out, int n, hipStream_t stream) {
  hipLaunchKernelGGL(HIP_KERNEL_NAME(moving_average<5>), dim3((n + 63) / 64), dim3(64), 0, stream,
                     in, out, n);
}
