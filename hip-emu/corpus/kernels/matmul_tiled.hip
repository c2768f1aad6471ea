// C = A·B (row-major, M×K times K×N) with TILE×TILE tiles in static LDS; one explicit
// instantiation.
#include <hip/hip_runtime.h>

template <unsigned TILE>
__global__ void matrix_multiplication_kernel(const float* a, const float* b, float* c, int m,
                                             int n, int k) {
  __shared__ float ta[TILE][TILE];
  __shared__ float tb[TILE][TILE];
  const int row = blockIdx.y * TILE + threadIdx.y;
  const int col = blockIdx.x * TILE + threadIdx.x;
  float acc = 0.0f;
  for (int t = 0; t < (k + TILE - 1) / TILE; ++t) {
    const int ka = t * TILE + threadIdx.x, kb = t * TILE + threadIdx.y;
    ta[threadIdx.y][threadIdx.x] = (row < m && ka < k) ? a[row * k + ka] : 0.0f;
    tb[threadIdx.y][threadIdx.x] = (kb < k && col < n) ? b[kb * n + col] : 0.0f;
    __syncthreads();
    for (unsigned i = 0; i < TILE; ++i) acc += ta[threadIdx.y][i] * tb[i][threadIdx.x];
    __syncthreads();
  }
  if (row < m && col < n) c[row * n + col] = acc;
}

template __global__ void matrix_multiplication_kernel<16>(const float*, const float*, float*, int,
                                                          int, int);
