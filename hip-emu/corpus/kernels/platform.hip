// Which code path the build took: the AMD platform's, with a 64-lane wavefront.
#include <hip/hip_runtime.h>

__global__ void platform_probe(int* out) {
#if defined(__HIP_PLATFORM_AMD__) && defined(__HIP__) && defined(__gfx906__)
  out[0] = 1;
#else
  out[0] = 2;
#endif
  out[1] = warpSize;
  out[2] = __AMDGCN_WAVEFRONT_SIZE;
}
