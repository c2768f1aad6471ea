// hip-emu/tests/kernels/checks.hip — TEST-ONLY kernels of hip-emu's executor tests.
//
// Compiled by hip-emu/build.rs into the same host registry as kernels/*.hip, under the
// `hipemu_test_` prefix. They are not in the gfx906 code object, so the runtime can never find
// them through hipModuleGetFunction: only hip-emu's own tests launch them (exec::execute).
#include <hip/hip_runtime.h>
#include <stdint.h>

// Every thread writes its linear id; one barrier; thread t reads the value of thread n-1-t.
extern "C" __global__ void hipemu_test_reverse(const int* in, int* out) {
  __shared__ int buf[1024];
  const int n = static_cast<int>(blockDim.x * blockDim.y * blockDim.z);
  const int t = static_cast<int>(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
  const int64_t base = static_cast<int64_t>(blockIdx.x) * n;
  buf[t] = in[base + t];
  __syncthreads();
  out[base + t] = buf[n - 1 - t];
}

// Odd threads take a barrier the even ones never reach.
extern "C" __global__ void hipemu_test_barrier_divergence(int* out) {
  if (threadIdx.x % 2 == 1) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1;
}

// Threads past 40 return before the barrier the others wait at.
extern "C" __global__ void hipemu_test_barrier_after_exit(int* out) {
  if (threadIdx.x >= 40) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}

// A shuffle under a branch only lanes < 16 take.
extern "C" __global__ void hipemu_test_wave_divergence(float* out) {
  float v = static_cast<float>(threadIdx.x);
  if (threadIdx.x % 64 < 16) v = __shfl_xor(v, 1);
  out[threadIdx.x] = v;
}

// Waves exchange values with every wave op the shim has; out is [threads][8].
extern "C" __global__ void hipemu_test_wave_ops(const float* in, float* out, unsigned long long* ballots) {
  const int t = static_cast<int>(threadIdx.x);
  const float v = in[t];
  float* o = out + 8 * t;
  o[0] = __shfl_xor(v, 1);
  o[1] = __shfl_xor(v, 32);
  o[2] = __shfl(v, 5);
  o[3] = __shfl_down(v, 3u, 16);
  o[4] = __int_as_float(__builtin_amdgcn_update_dpp(0, __float_as_int(v), 0x1B, 0xF, 0xF, false));
  o[5] = __int_as_float(__builtin_amdgcn_update_dpp(__float_as_int(-1.0f), __float_as_int(v), 0x111, 0xF, 0xF, false));
  o[6] = __int_as_float(__builtin_amdgcn_readfirstlane(__float_as_int(v)));
  double d = static_cast<double>(v);
  for (int off = 32; off > 0; off /= 2) d += __shfl_xor(d, off);
  o[7] = static_cast<float>(d);
  const unsigned long long b = __ballot(t % 3 == 0);
  if (t % 64 == 0) ballots[t / 64] = b;
  if (__any(t == 70) && t % 64 == 0) ballots[4 + t / 64] = 1;
  if (__all(t < 1000) && t % 64 == 0) ballots[8 + t / 64] = 1;
}

// Reads LDS before anything wrote it (the executor fills it with 0xFF bytes).
extern "C" __global__ void hipemu_test_lds_fill(uint32_t* out, float* fout) {
  __shared__ uint32_t words[64];
  __shared__ float floats[64];
  out[threadIdx.x] = words[threadIdx.x];
  fout[threadIdx.x] = floats[threadIdx.x];
  words[threadIdx.x] = 7;  // the next block must see the fill again, not 7
  floats[threadIdx.x] = 1.0f;
}

// Dynamic LDS: fill check, then a block-wide exchange through it.
extern "C" __global__ void hipemu_test_dynamic_lds(uint32_t* fill, int* out, int n) {
  extern __shared__ int dyn[];
  const int t = static_cast<int>(threadIdx.x);
  if (t < n) fill[t] = static_cast<uint32_t>(dyn[t]);
  __syncthreads();
  if (t < n) dyn[t] = t * 3;
  __syncthreads();
  if (t < n) out[t] = dyn[n - 1 - t];
}

// Reads p[i] for i < n: with n past the allocation, the read hits a guard page.
extern "C" __global__ void hipemu_test_read(const float* p, int64_t n, float* sum) {
  float s = 0.0f;
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    for (int64_t i = 0; i < n; ++i) s += p[i];
    *sum = s;
  }
}

// Recursion deep enough to overflow any fibre stack.
__device__ __noinline__ int hipemu_test_deep(volatile int* p, int d) {
  volatile char pad[4096];
  pad[0] = static_cast<char>(d);
  if (d == 0) return pad[0];
  return hipemu_test_deep(p, d - 1) + pad[0];
}
extern "C" __global__ void hipemu_test_stack_overflow(int* out, int depth) {
  out[threadIdx.x] = hipemu_test_deep(out, depth);
}

// Block indices and dimensions in 3-D: out[linear block][linear thread] = packed ids.
extern "C" __global__ void hipemu_test_ids(uint32_t* out) {
  const uint32_t nb = blockDim.x * blockDim.y * blockDim.z;
  const uint32_t b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const uint32_t t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  out[b * nb + t] = (blockIdx.x << 24) | (blockIdx.y << 16) | (blockIdx.z << 12) |
                    (threadIdx.x << 8) | (threadIdx.y << 4) | threadIdx.z;
}

// Records the order in which blocks start.
extern "C" __global__ void hipemu_test_block_order(uint32_t* order, uint32_t* counter) {
  if (threadIdx.x == 0) order[atomicAdd(counter, 1u)] = blockIdx.x;
}

extern "C" __global__ void hipemu_test_no_params() {}

// The reverse exchange of hipemu_test_reverse without its barrier: a data race on LDS that the
// race check reports at both lines.
extern "C" __global__ void hipemu_test_racy_reverse(const int* in, int* out) {
  __shared__ int buf[1024];
  const int n = static_cast<int>(blockDim.x);
  const int t = static_cast<int>(threadIdx.x);
  buf[t] = in[t];
  out[t] = buf[n - 1 - t];
}

// Lanes of one wave exchange through LDS around a wave barrier: ordered, no race; and the
// same exchange without it between two lanes of one wave: a race.
extern "C" __global__ void hipemu_test_wave_lds(int* out, int ordered) {
  __shared__ int buf[64];
  const int t = static_cast<int>(threadIdx.x);
  buf[t] = t;
  if (ordered) __builtin_amdgcn_wave_barrier();
  out[t] = buf[t ^ 1];
}

// Thread 0 spins until thread 1 sets a flag in LDS: on a device the other wave runs meanwhile;
// here fibres are not preempted, so the watchdog must end it.
extern "C" __global__ void hipemu_test_spin(int* out) {
  __shared__ volatile int flag;
  if (threadIdx.x == 64) flag = 1;
  if (threadIdx.x == 0) {
    while (flag != 1) {
    }
  }
  out[threadIdx.x] = 1;
}

// readlane, ds_swizzle (bitmask and quad-permute modes) and v_perm; out is [threads][4].
extern "C" __global__ void hipemu_test_lane_ops(const int* in, unsigned* out) {
  const int t = static_cast<int>(threadIdx.x);
  const int v = in[t];
  unsigned* o = out + 4 * t;
  o[0] = static_cast<unsigned>(__builtin_amdgcn_readlane(v, 37));
  o[1] = static_cast<unsigned>(__builtin_amdgcn_ds_swizzle(v, 0x1f | (4 << 10)));  // lane ^ 4
  o[2] = static_cast<unsigned>(__builtin_amdgcn_ds_swizzle(v, 0x8000 | 0x1B));     // quad [3,2,1,0]
  o[3] = __builtin_amdgcn_perm(0x8899AABBu, static_cast<unsigned>(v), 0x0C0D0407u + 0x08u);
}

// C++ linkage (no extern "C"), a template among them: the same checks apply. An out-of-bounds
// read when n exceeds the buffer, and the racy reverse exchange.
__global__ void cpp_read(const float* p, long long n, float* sum) {
  float s = 0.0f;
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    for (long long i = 0; i < n; ++i) s += p[i];
    *sum = s;
  }
}

template <int N>
__global__ void cpp_racy_reverse(const int* in, int* out) {
  __shared__ int buf[N];
  const int n = static_cast<int>(blockDim.x);
  const int t = static_cast<int>(threadIdx.x);
  buf[t] = in[t];
  out[t] = buf[n - 1 - t];
}

template __global__ void cpp_racy_reverse<1024>(const int*, int*);

// y[i] = a * x[i] + y[i] for i <= n: a read-modify-write one element past n (a deliberate
// overrun when y holds n floats).
extern "C" __global__ void hipemu_test_axpy_overrun(float a, const float* x, float* y, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i <= n) y[i] = a * x[i] + y[i];
}
