// A kernel in a namespace taking a struct by value.
#include <hip/hip_runtime.h>

namespace physics {

struct Params {
  float dt;
  float gravity;
  int n;
};

__global__ void integrate(Params p, float* pos, float* vel) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= p.n) return;
  vel[i] += p.gravity * p.dt;
  pos[i] += vel[i] * p.dt;
}

}  // namespace physics
