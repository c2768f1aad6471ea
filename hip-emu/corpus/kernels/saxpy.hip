// y = a*x + y over a grid-stride loop.
#include <hip/hip_runtime.h>

__global__ void saxpy_kernel(float a, const float* x, float* y, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
    y[i] = a * x[i] + y[i];
  }
}
