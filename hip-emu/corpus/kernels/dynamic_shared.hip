// A templated reduction whose LDS is the launch's dynamic buffer: one untyped extern array cast
// to T (the usual idiom: a typed extern array per instantiation would clash).
#include <hip/hip_runtime.h>

template <typename T>
__global__ void block_max(const T* in, T* out) {
  extern __shared__ unsigned char lds[];
  T* s = reinterpret_cast<T*>(lds);
  const unsigned t = threadIdx.x;
  s[t] = in[blockIdx.x * blockDim.x + t];
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (t < half) s[t] = max(s[t], s[t + half]);
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = s[0];
}

template __global__ void block_max<float>(const float*, float*);
template __global__ void block_max<int>(const int*, int*);
