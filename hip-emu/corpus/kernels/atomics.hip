// Every kind of atomic on one set of counters, from every thread.
#include <hip/hip_runtime.h>

__device__ double atomic_add_via_cas(double* address, double v) {
  unsigned long long* p = reinterpret_cast<unsigned long long*>(address);
  unsigned long long old = *p, assumed;
  do {
    assumed = old;
    old = atomicCAS(p, assumed, __double_as_longlong(__longlong_as_double(assumed) + v));
  } while (assumed != old);
  return __longlong_as_double(old);
}

// counters: [0] add, [1] max, [2] min, [3] and, [4] or, [5] xor, [6] inc (wraps at 100),
// [7] dec (wraps at 1000), [8] exch; f: float sum; d: double sum (native), d2: via CAS.
__global__ void atomics(unsigned* counters, float* f, double* d, double* d2) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  atomicAdd(&counters[0], i);
  atomicMax(&counters[1], i * 7 % 1000);
  atomicMin(&counters[2], i + 5);
  atomicAnd(&counters[3], ~(1u << (i % 32)) | 0x1u);
  atomicOr(&counters[4], 1u << (i % 32));
  atomicXor(&counters[5], i);
  atomicInc(&counters[6], 99u);
  atomicDec(&counters[7], 999u);
  atomicExch(&counters[8], 42u);
  atomicAdd(f, 0.5f);
  atomicAdd(d, 0.25);
  atomic_add_via_cas(d2, 1.0 / (i + 1));
}
