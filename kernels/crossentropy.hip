// kernels/crossentropy.hip — fused softmax + cross-entropy over logits [rows, Vp] (llm.c's fused
// classifier), PyTorch's ignore_index = -100, mean reduction or an explicit divisor; dlogits
// written over the logits in place. The chunked linear_crossentropy (src/ops/crossentropy/
// linear_device.rs) runs the same three kernels on row chunks of h·Wᵀ.
//
// NEVER RUN ON A GPU: compiled and statically checked for gfx906 only; executed on the CPU by
// hip-emu (the emulated HIP device) in the device tests, against the CPU reference.
//
// Three kernels per step, no host sync:
//   crossentropy_count_i32(targets, rows, count): one block; *count = number of targets that
//     are not -100 (as f32: exact below 2^24 rows).
//   crossentropy_<T>(logits, targets, losses, count, rows, vocab, padded_vocab, dloss,
//                    write_grad, divisor, first_row, error): one block per row (grid-stride
//                    over rows); first_row is the index of row 0 in the caller's tensor (a
//                    chunk's offset), used only in the error flag.
//     Pass 1 reads the first `vocab` columns once and keeps a running (max, Σ exp(x − max)) per
//     thread, rescaled when the max grows (online softmax), so any finite logits (±1e4) are
//     stable; the per-thread pairs combine across the block in wave order (deterministic).
//     losses[row] = (max − x[target]) + log Σ (f32; lse = max + log Σ is never rounded as a
//     whole, which at |x| ~ 1e4 would cost 1e-3).
//     Pass 2 (write_grad != 0) overwrites the row: dlogits_j = (exp((x_j − max) − log Σ) − [j = target])·
//     dloss/n for j < vocab, n = divisor when > 0, else *count; the padding columns vocab..padded_vocab are set to 0 (they are
//     a gradient of nothing; zeroing them keeps garbage out of the classifier's backward matmul).
//     The row is read twice and written once: the [rows, V] probabilities are never stored.
//     Ignored rows: loss 0, and with write_grad the whole row (padding included) set to 0.
//     Targets outside 0..vocab that are not -100: atomicMin(error, first_row + row) if error is not null (the launcher sets
//     *error = 0xffffffff first; the caller reads the first bad row with its next read-back),
//     loss NaN and, with write_grad, a NaN row; the target is never used as an index.
//   crossentropy_mean_f32(losses, count, rows, divisor, mean, totals): one block; Σ losses
//     summed in f64 in a fixed order; if mean is not null, *mean = Σ / n (n as above; NaN when
//     every row is ignored and no divisor is given: PyTorch's 0/0); if totals is not null,
//     totals[0] += Σ and totals[1] += *count (accumulated over micro-batches by the caller).
// 16-byte vector accesses (4 f32 or 8 f16/bf16 per thread) where a pack is aligned and inside
// the row (rows of an aligned Vp, e.g. 50304), scalar accesses otherwise.
//
// Resource usage on gfx906 (hipcc 5.2 / clang 15, -O3), from the build's resource table
// (`cargo test --test kernels_static -- --nocapture` prints it):
//   kernel                    VGPRs  SGPRs  LDS B  waves/SIMD  scratch  spills
//   crossentropy_count_i32       13     22    128          10        0       0
//   crossentropy_mean_f32        12     22    256          10        0       0
//   crossentropy_f32             28     72    256           9        0       0
//   crossentropy_f16             39     75    256           6        0       0
//   crossentropy_bf16            43     77    256           5        0       0
#include "common.h"

namespace {

constexpr int kCrossEntropyBlock = 512;
constexpr int kIgnore = -100;

/// (m, s) ⊕ (m2, s2) for the online softmax: s·e^(m−M) + s2·e^(m2−M) with M = max(m, m2). An
/// empty side (s = 0, m = −inf) contributes nothing (and never computes −inf − (−inf)).
__device__ __forceinline__ void combine(float& m, float& s, float m2, float s2) {
  const float mx = fmaxf(m, m2);
  const float a = s == 0.0f ? 0.0f : s * expf(m - mx);
  const float b = s2 == 0.0f ? 0.0f : s2 * expf(m2 - mx);
  m = mx;
  s = a + b;
}

/// Block-wide combine of every thread's (m, s); all threads return the result. `lds` holds
/// 2·kMaxWavesPerBlock floats. Partials are combined in wave order.
__device__ void block_combine(float& m, float& s, float* lds) {
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % warpSize;
  const int wave = tid / warpSize;
  const int waves = (static_cast<int>(blockDim.x) + warpSize - 1) / warpSize;
  for (int offset = warpSize / 2; offset > 0; offset /= 2) {
    const float m2 = __shfl_xor(m, offset, warpSize);
    const float s2 = __shfl_xor(s, offset, warpSize);
    combine(m, s, m2, s2);
  }
  if (lane == 0) {
    lds[2 * wave] = m;
    lds[2 * wave + 1] = s;
  }
  __syncthreads();
  m = lds[0];
  s = lds[1];
  for (int w = 1; w < waves; ++w) combine(m, s, lds[2 * w], lds[2 * w + 1]);
  __syncthreads();
}

template <typename T>
__device__ void crossentropy_impl(T* __restrict__ logits, const int* __restrict__ targets,
                                  float* __restrict__ losses, const float* __restrict__ count,
                                  int64_t rows, int vocab, int padded, float dloss,
                                  int write_grad, float divisor, int64_t first_row,
                                  unsigned* __restrict__ error) {
  constexpr int N = hipk::VecWidth<T>::value;
  __shared__ float lds[2 * hipk::kMaxWavesPerBlock];
  const float nan = __int_as_float(0x7fc00000);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    T* x = logits + row * padded;
    const int target = targets[row];
    const bool ignored = target == kIgnore;
    const bool bad = !ignored && (target < 0 || target >= vocab);
    if (ignored || bad) {  // block-uniform
      if (threadIdx.x == 0) {
        losses[row] = bad ? nan : 0.0f;
        if (bad && error != nullptr) atomicMin(error, static_cast<unsigned>(first_row + row));
      }
      if (write_grad != 0) {
        float v[N];
#pragma unroll
        for (int k = 0; k < N; ++k) v[k] = bad ? nan : 0.0f;
        for (int c = static_cast<int>(threadIdx.x) * N; c < padded; c += blockDim.x * N) {
          hipk::store_floats<N>(x, c, padded, v);
        }
      }
      continue;
    }
    // Read before any thread of the block overwrites the row (block_combine has barriers).
    const float x_target = threadIdx.x == 0 ? hipk::load_as_float(x, target) : 0.0f;
    float m = -INFINITY;
    float s = 0.0f;
    for (int c = static_cast<int>(threadIdx.x) * N; c < vocab; c += blockDim.x * N) {
      float v[N];
      hipk::load_floats<N>(x, c, vocab, v);
#pragma unroll
      for (int k = 0; k < N; ++k) {
        if (c + k < vocab) {
          if (v[k] > m) {
            s = s * expf(m - v[k]) + 1.0f;
            m = v[k];
          } else {
            s += expf(v[k] - m);
          }
        }
      }
    }
    block_combine(m, s, lds);
    // lse = m + log s is never formed: at |logits| ~ 1e4 its f32 rounding (ulp 1e-3) would
    // dominate the loss; (m − x) is exact or rounded once at the result's magnitude.
    const float log_s = logf(s);
    if (threadIdx.x == 0) losses[row] = (m - x_target) + log_s;
    if (write_grad == 0) continue;
    const float scale = dloss / (divisor > 0.0f ? divisor : *count);
    for (int c = static_cast<int>(threadIdx.x) * N; c < padded; c += blockDim.x * N) {
      float v[N];
      hipk::load_floats<N>(x, c, vocab, v);
#pragma unroll
      for (int k = 0; k < N; ++k) {
        const int j = c + k;
        const float p = expf((v[k] - m) - log_s) - (j == target ? 1.0f : 0.0f);
        v[k] = j < vocab ? p * scale : 0.0f;
      }
      hipk::store_floats<N>(x, c, padded, v);
    }
    // The next row's early exit and loads touch other memory; the row's writes are this
    // block's own. No barrier needed before the loop continues except for lds, which
    // block_combine leaves free.
  }
}

__device__ void count_impl(const int* __restrict__ targets, int64_t rows, float* __restrict__ count) {
  __shared__ float lds[hipk::kMaxWavesPerBlock];
  int n = 0;
  for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) n += targets[i] != kIgnore ? 1 : 0;
  const float total = hipk::block_sum(static_cast<float>(n), lds);
  if (threadIdx.x == 0) *count = total;
}

__device__ void mean_impl(const float* __restrict__ losses, const float* __restrict__ count,
                          int64_t rows, float divisor, float* __restrict__ mean,
                          float* __restrict__ totals) {
  __shared__ double lds[hipk::kMaxWavesPerBlock];
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) sum += losses[i];
  const int lane = static_cast<int>(threadIdx.x) % warpSize;
  const int wave = static_cast<int>(threadIdx.x) / warpSize;
  for (int offset = warpSize / 2; offset > 0; offset /= 2) sum += __shfl_xor(sum, offset, warpSize);
  if (lane == 0) lds[wave] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    const int waves = (static_cast<int>(blockDim.x) + warpSize - 1) / warpSize;
    double total = 0.0;
    for (int w = 0; w < waves; ++w) total += lds[w];
    const double n = divisor > 0.0f ? static_cast<double>(divisor) : static_cast<double>(*count);
    if (mean != nullptr) *mean = static_cast<float>(total / n);
    if (totals != nullptr) {
      totals[0] = static_cast<float>(static_cast<double>(totals[0]) + total);
      totals[1] += *count;
    }
  }
}

}  // namespace

HIPK_KERNEL(crossentropy_count_i32, kCrossEntropyBlock)(const int* targets, int64_t rows, float* count) {
  count_impl(targets, rows, count);
}

HIPK_KERNEL(crossentropy_mean_f32, kCrossEntropyBlock)
(const float* losses, const float* count, int64_t rows, float divisor, float* mean,
 float* totals) {
  mean_impl(losses, count, rows, divisor, mean, totals);
}

#define CROSSENTROPY_KERNELS(suffix, T)                                                       \
  HIPK_KERNEL(crossentropy_##suffix, kCrossEntropyBlock)                                                  \
  (T* logits, const int* targets, float* losses, const float* count, int64_t rows, int vocab, \
   int padded, float dloss, int write_grad, float divisor, int64_t first_row,                 \
   unsigned* error) {                                                                         \
    crossentropy_impl<T>(logits, targets, losses, count, rows, vocab, padded, dloss,          \
                         write_grad, divisor, first_row, error);                              \
  }

HIPK_DTYPES(CROSSENTROPY_KERNELS)
