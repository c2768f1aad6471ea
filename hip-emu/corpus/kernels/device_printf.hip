// Device printf from one thread, next to an ordinary computation.
#include <hip/hip_runtime.h>

__global__ void square_and_report(const int* in, int* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] * in[i];
  if (i == 0) printf("square_and_report: %d elements, first %d\n", n, in[0] * in[0]);
}
