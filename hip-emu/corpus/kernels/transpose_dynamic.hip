// Transpose with the tile in dynamic LDS (the launch gives tile*(tile+1) floats).
#include <hip/hip_runtime.h>

__global__ void transpose_dynamic(const float* in, float* out, int rows, int cols) {
  extern __shared__ float tile[];
  const int t = blockDim.x, pitch = t + 1;
  int x = blockIdx.x * t + threadIdx.x;
  int y = blockIdx.y * t + threadIdx.y;
  if (x < cols && y < rows) tile[threadIdx.y * pitch + threadIdx.x] = in[y * cols + x];
  __syncthreads();
  x = blockIdx.y * t + threadIdx.x;
  y = blockIdx.x * t + threadIdx.y;
  if (x < rows && y < cols) out[y * rows + x] = tile[threadIdx.x * pitch + threadIdx.y];
}
