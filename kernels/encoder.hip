// kernels/encoder.hip — GPT-2's encoder (token + position embedding), forward and a
// deterministic backward.
//
// NEVER RUN ON A GPU: compiled and statically checked for gfx906 only; executed on the CPU by
// hip-emu (the emulated HIP device) in the device tests, against the CPU reference.
//
// Layout: tokens [rows = B·T] int32, wte [V, C], wpe [P, C], out/dout [rows, C], T = storage
// type; position of row r is r % seq.
//
// Out-of-range token ids (< 0 or >= vocab): never used as an index. Each kernel that reads
// tokens does atomicMin(error, r) for every bad row r (error may be null: no report), so *error ends as the first bad row
// (deterministic: min does not depend on order). The launcher sets *error = 0xffffffff (no
// error) with an asynchronous memset before the first kernel; the caller reads it with its next
// read-back and turns it into the CPU's typed error (row → b, t; the value is tokens[row]).
// The forward writes NaN into the rows of bad tokens so that nothing downstream trains on them
// silently; the backward leaves them out of dwte (dwpe, which does not depend on the token,
// still gets them).
//
//   encoder_fwd_<T>(tokens, wte, wpe, out, rows, seq, C, vocab, error)
//     out[r, :] = wte[tokens[r], :] + wpe[r % seq, :]; grid-stride over 16-byte packs of out
//     (4 f32 or 8 f16/bf16 per thread: one vector access per tensor when the pack is aligned).
//
// Backward, dwte[v] += Σ_{r: tokens[r] = v} dout[r] with no float atomics, in three kernels:
//   encoder_links_i32(tokens, rows, vocab, next, first, error)
//     for every row r: next[r] = the smallest r' > r with the same token (−1 if none) and
//     first[r] = 1 when no earlier row has it. Blocks compare their rows against tiles of the
//     token list staged in LDS and stop as soon as every row of the block has its answer:
//     O(rows²) comparisons at worst (distinct tokens) — 67M for rows = 8192, cheap next to the
//     model; a sort would win for rows ≫ 10⁵.
//   encoder_bwd_dwte_<T>(dout, tokens, next, first, dwte, rows, C)
//     block (r, y) with first[r] walks the chain r → next[r] → … in row order, summing its
//     channel slice of dout in f32, then dwte[token] = dwte[token] + sum (one rounding).
//     Every vocabulary row is written by one block at most: no atomics, and the sum order is
//     the row order, so the result is bit-identical run to run (and independent of the grid).
//   encoder_bwd_dwpe_<T>(dout, dwpe, batch, seq, C)
//     dwpe[t] = dwpe[t] + Σ_b dout[b, t] in batch order, per 16-byte pack.
// The backward always adds into dwte/dwpe; for `accumulate = false` the launcher zeroes them
// first (asynchronous memset), which gives the CPU reference's overwrite semantics.
//
// Resource usage on gfx906 (hipcc 5.2 / clang 15, -O3), from the build's resource table
// (`cargo test --test kernels_static -- --nocapture` prints it):
//   kernel                    VGPRs  SGPRs  LDS B  waves/SIMD  scratch  spills
//   encoder_links_i32            23     56   1152          10        0       0
//   encoder_fwd_f32              22     43      0          10        0       0
//   encoder_bwd_dwte_f32         14     34      0          10        0       0
//   encoder_bwd_dwpe_f32         19     51      0          10        0       0
//   encoder_fwd_f16              30     46      0           8        0       0
//   encoder_bwd_dwte_f16         22     46      0          10        0       0
//   encoder_bwd_dwpe_f16         28     59      0           9        0       0
//   encoder_fwd_bf16             30     47      0           8        0       0
//   encoder_bwd_dwte_bf16        24     46      0          10        0       0
//   encoder_bwd_dwpe_bf16        32     61      0           8        0       0
#include "common.h"

namespace {

constexpr int kEncoderBlock = 256;

__device__ __forceinline__ bool token_ok(int tok, int vocab) { return tok >= 0 && tok < vocab; }

template <typename T>
__device__ void encoder_fwd_impl(const int* __restrict__ tokens, const T* __restrict__ wte,
                                 const T* __restrict__ wpe, T* __restrict__ out, int64_t rows,
                                 int seq, int C, int vocab, unsigned* __restrict__ error) {
  constexpr int N = hipk::VecWidth<T>::value;
  const int64_t packs_per_row = (C + N - 1) / N;
  const int64_t total = rows * packs_per_row;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < total;
       p += stride) {
    const int64_t r = p / packs_per_row;
    const int c = static_cast<int>(p - r * packs_per_row) * N;
    const int tok = tokens[r];
    float v[N];
    if (token_ok(tok, vocab)) {
      float e[N];
      hipk::load_floats<N>(wte + static_cast<int64_t>(tok) * C, c, C, e);
      hipk::load_floats<N>(wpe + (r % seq) * C, c, C, v);
#pragma unroll
      for (int k = 0; k < N; ++k) v[k] += e[k];
    } else {
      if (c == 0 && error != nullptr) atomicMin(error, static_cast<unsigned>(r));
#pragma unroll
      for (int k = 0; k < N; ++k) v[k] = __int_as_float(0x7fc00000);
    }
    hipk::store_floats<N>(out + r * C, c, C, v);
  }
}

__device__ void links_impl(const int* __restrict__ tokens, int64_t rows, int vocab,
                           int* __restrict__ next, int* __restrict__ first,
                           unsigned* __restrict__ error) {
  __shared__ int tile[kEncoderBlock];
  __shared__ float lds[hipk::kMaxWavesPerBlock];
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * blockDim.x;
  const int64_t r = r0 + threadIdx.x;
  const bool mine = r < rows;
  const int tok = mine ? tokens[r] : -1;
  const bool ok = mine && token_ok(tok, vocab);
  if (mine && !ok && error != nullptr) atomicMin(error, static_cast<unsigned>(r));
  int64_t nxt = -1;
  bool seen_before = false;
  // Tiles before this block's rows only decide `first`; the block's own tile and later ones
  // decide `next`. A row is done once it has found its next occurrence (or is not valid).
  for (int64_t j0 = 0; j0 < rows; j0 += blockDim.x) {
    const bool need = ok && (j0 < r0 + static_cast<int64_t>(blockDim.x) ? true : nxt < 0);
    if (hipk::block_max(need ? 1.0f : 0.0f, lds) == 0.0f) break;
    const int64_t j = j0 + threadIdx.x;
    tile[threadIdx.x] = j < rows ? tokens[j] : -1;
    __syncthreads();
    const int64_t len = rows - j0 < static_cast<int64_t>(blockDim.x) ? rows - j0 : blockDim.x;
    if (ok) {
      for (int k = 0; k < len; ++k) {
        if (tile[k] != tok) continue;
        const int64_t jj = j0 + k;
        if (jj < r) {
          seen_before = true;
        } else if (jj > r && nxt < 0) {
          nxt = jj;
        }
      }
    }
    __syncthreads();
  }
  if (mine) {
    next[r] = static_cast<int>(nxt);
    first[r] = ok && !seen_before ? 1 : 0;
  }
}

template <typename T>
__device__ void dwte_impl(const T* __restrict__ dout, const int* __restrict__ tokens,
                          const int* __restrict__ next, const int* __restrict__ first,
                          T* __restrict__ dwte, int C) {
  constexpr int N = hipk::VecWidth<T>::value;
  const int64_t r = blockIdx.x;
  if (first[r] == 0) return;  // block-uniform: not the first occurrence, or a bad token
  const int c = (static_cast<int>(blockIdx.y) * static_cast<int>(blockDim.x) +
                 static_cast<int>(threadIdx.x)) * N;
  if (c >= C) return;
  float acc[N];
#pragma unroll
  for (int k = 0; k < N; ++k) acc[k] = 0.0f;
  for (int64_t j = r; j >= 0; j = next[j]) {
    float v[N];
    hipk::load_floats<N>(dout + j * C, c, C, v);
#pragma unroll
    for (int k = 0; k < N; ++k) acc[k] += v[k];
  }
  T* row = dwte + static_cast<int64_t>(tokens[r]) * C;
  float old[N];
  hipk::load_floats<N>(row, c, C, old);
#pragma unroll
  for (int k = 0; k < N; ++k) old[k] += acc[k];
  hipk::store_floats<N>(row, c, C, old);
}

template <typename T>
__device__ void dwpe_impl(const T* __restrict__ dout, T* __restrict__ dwpe, int64_t batch,
                          int seq, int C) {
  constexpr int N = hipk::VecWidth<T>::value;
  const int64_t packs_per_row = (C + N - 1) / N;
  const int64_t total = static_cast<int64_t>(seq) * packs_per_row;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < total;
       p += stride) {
    const int64_t t = p / packs_per_row;
    const int c = static_cast<int>(p - t * packs_per_row) * N;
    float acc[N];
#pragma unroll
    for (int k = 0; k < N; ++k) acc[k] = 0.0f;
    for (int64_t b = 0; b < batch; ++b) {
      float v[N];
      hipk::load_floats<N>(dout + (b * seq + t) * C, c, C, v);
#pragma unroll
      for (int k = 0; k < N; ++k) acc[k] += v[k];
    }
    float old[N];
    hipk::load_floats<N>(dwpe + t * C, c, C, old);
#pragma unroll
    for (int k = 0; k < N; ++k) old[k] += acc[k];
    hipk::store_floats<N>(dwpe + t * C, c, C, old);
  }
}

}  // namespace

HIPK_KERNEL(encoder_links_i32, kEncoderBlock)
(const int* tokens, int64_t rows, int vocab, int* next, int* first, unsigned* error) {
  links_impl(tokens, rows, vocab, next, first, error);
}

#define ENCODER_KERNELS(suffix, T)                                                            \
  HIPK_KERNEL(encoder_fwd_##suffix, kEncoderBlock)                                                   \
  (const int* tokens, const T* wte, const T* wpe, T* out, int64_t rows, int seq, int C,       \
   int vocab, unsigned* error) {                                                              \
    encoder_fwd_impl<T>(tokens, wte, wpe, out, rows, seq, C, vocab, error);                   \
  }                                                                                           \
  HIPK_KERNEL(encoder_bwd_dwte_##suffix, kEncoderBlock)                                              \
  (const T* dout, const int* tokens, const int* next, const int* first, T* dwte, int C) {     \
    dwte_impl<T>(dout, tokens, next, first, dwte, C);                                         \
  }                                                                                           \
  HIPK_KERNEL(encoder_bwd_dwpe_##suffix, kEncoderBlock)                                              \
  (const T* dout, T* dwpe, int64_t batch, int seq, int C) {                                   \
    dwpe_impl<T>(dout, dwpe, batch, seq, C);                                                  \
  }

HIPK_DTYPES(ENCODER_KERNELS)
