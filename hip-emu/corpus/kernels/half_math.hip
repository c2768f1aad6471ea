// __half arithmetic: a*b + c in half precision, and its f32 view.
#include <hip/hip_fp16.h>
#include <hip/hip_runtime.h>

__global__ void half_fma(const __half* a, const __half* b, const __half* c, __half* out,
                         float* wide, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const __half r = __hfma(a[i], b[i], c[i]);
  out[i] = r - __float2half(1.0f);
  wide[i] = __half2float(a[i] * b[i] + c[i]);
}
