// The bit-manipulation builtins, one output word each.
#include <hip/hip_runtime.h>

__global__ void bit_ops(const unsigned* in, unsigned* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const unsigned x = in[i];
  unsigned* o = out + 10 * i;
  o[0] = __bitextract_u32(x, 4, 8);
  o[1] = __bitinsert_u32(x, 0xABu, 12, 8);
  o[2] = __popc(x);
  o[3] = __clz(static_cast<int>(x));
  o[4] = __ffs(static_cast<int>(x));
  o[5] = __brev(x);
  o[6] = __byte_perm(x, 0x11223344u, 0x5140u);
  o[7] = static_cast<unsigned>(__bitextract_u64(0x0123456789ABCDEFull * x, 20, 24));
  o[8] = __popcll(0xFFull * x);
  o[9] = __umulhi(x, 0x9E3779B9u);
}
