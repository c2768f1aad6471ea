// 2-D grid over a matrix with a pitch (row stride) larger than its width.
#include <hip/hip_runtime.h>

__global__ void matrix_add_2d(const float* a, const float* b, float* c, int width, int height,
                              int pitch) {
  const int x = blockIdx.x * blockDim.x + threadIdx.x;
  const int y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x < width && y < height) c[y * pitch + x] = a[y * pitch + x] + 2.0f * b[y * pitch + x];
}
