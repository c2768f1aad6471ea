// kernels/adamw.hip — fused multi-tensor AdamW, and the multi-tensor non-finite check and
// global L2 norm a trainer needs for gradient clipping and loss scaling.
//
// NEVER RUN ON A GPU: compiled and statically checked for gfx906 only; executed on the CPU by
// hip-emu (the emulated HIP device) in the device tests, against the CPU reference.
//
// Multi-tensor launch (like PyTorch's multi_tensor_apply): the table of tensor descriptors is
// passed by value in the kernel arguments (AdamwTable: 24 rows, 1728 bytes; RefTable: 48 rows,
// 1536 bytes; the launcher splits longer lists over several launches), so a launch needs no
// host-side copy and no host sync. Tensor i is cut into chunks of `chunk` elements and owns chunks
// [first_chunk_i, first_chunk_i + ceil(numel_i / chunk)). Blocks walk the chunks grid-stride and
// find their tensor by binary search on first_chunk (reads of the kernel-argument segment).
//
// Device-side tables (adamw_tab_<T>, multi_l2norm_tab_<T>, multi_nonfinite_tab_<T>): the same
// kernels reading their tensor table from a device buffer instead of the kernel arguments, so a
// launch takes any number of tensors (no kernel-argument limit): GPT-2 124M's 148 tensors or a 7B
// model's ~290 are one launch. The launcher uploads the table with one asynchronous host-to-
// device copy from a pinned staging buffer (AdamW: a 48-byte AdamwHeader with the step's scalars,
// then the 72-byte rows; the norm and non-finite check: the 32-byte rows). Blocks search the
// table in global memory (log2(count) uniform loads per 64 Ki-element chunk).
// multi_l2norm_finalize_clip_f32 is multi_l2norm_finalize_f32 followed by clip_grad_scale_f32
// (kernels/clip.hip) in the same block: norm → grad_scale without another launch, so a clipped
// step is 3 launches in all (norm partials, finalize + clip, AdamW).
//
// AdamW (adamw_<T>, T = storage type of the model parameters and gradients), exactly
// torch.optim.AdamW / torch._fused_adamw_ in f32:
//   g = grad / grad_scale (grad_scale read from device memory, may be null = 1), negated if
//   maximize; p ← p·(1 − lr·wd); m ← β1·m + (1 − β1)·g; v ← β2·v + (1 − β2)·g²;
//   amsgrad: v̂ ← max(v̂, v) and v̂ replaces v below; the max is NaN if either is NaN, as
//   torch.maximum in AdamW's default single-tensor and foreach paths (torch 2.15's fused CPU
//   path keeps v̂ when only v is NaN); denom = √v / √(1 − β2^t) + eps;
//   p ← p − (lr / (1 − β1^t))·m / denom.
// State (m, v, v̂) is f32. With f32 master weights the master copy is read and written and the
// model copy (T) is overwritten with the master rounded to nearest-even (and not read).
// found_inf (device memory, may be null) != 0 → the kernel returns before touching anything.
// The host precomputes 1 − lr·wd, 1 − β1, 1 − β2, lr / (1 − β1^t) and √(1 − β2^t) in f64 and
// passes them rounded to f32; 1 − lr·wd and lr / (1 − β1^t) are per tensor (table row: each
// tensor's own weight decay and lr scale, torch's param groups), so a whole model of one dtype
// is one launch per 24 tensors.
//
// multi_nonfinite_<T>: sets *found_inf = 1 if any element of any tensor is NaN or ±inf (it never
// clears it: the launcher zeroes it first). Every writer stores the same value, so the result is
// exact and needs no atomics.
// multi_l2norm_<T> writes one f32 sum of squares per chunk; multi_l2norm_finalize_f32 adds them
// in f64, in chunk order, and writes √Σ: deterministic.
//
// Elements move 4 at a time: one vector access per tensor when aligned and inside the tensor,
// scalar accesses otherwise (tails, odd offsets).
//
// Static ISA figures (gfx906, hipcc 5.2), not measurements: `cargo xtask isa-report --only
// adamw` (docs/ISA-REPORT.md); waves/SIMD per the report's formula at the 256-thread blocks
// every kernel here is launched with:
//   kernel                    VGPRs  SGPRs  LDS B  waves/SIMD  scratch  spills
//   adamw_f32                    42     67      0           5        0       0
//   multi_nonfinite_f32          18     42      0          10        0       0
//   multi_l2norm_f32             25     47    128           9        0       0
//   adamw_f16                    43     70      0           5        0       0
//   multi_nonfinite_f16          18     42      0          10        0       0
//   multi_l2norm_f16             25     47    128           9        0       0
//   adamw_bf16                   44     72      0           5        0       0
//   multi_nonfinite_bf16         18     42      0          10        0       0
//   multi_l2norm_bf16            25     47    128           9        0       0
//   multi_l2norm_finalize_f32    12     20    256          10        0       0
// The device-table kernels (hipcc 5.2 -O3 -Rpass-analysis=kernel-resource-usage, gfx906; the
// compiler's occupancy figure):
//   adamw_tab_f32 / f16 / bf16          42 / 43 / 44  65 / 68 / 70    0    5    0    0
//   multi_nonfinite_tab_<T>             18            42              0   10    0    0
//   multi_l2norm_tab_<T>                29            47            128    8    0    0
//   multi_l2norm_finalize_clip_f32      12            26            256   10    0    0
#include "common.h"

namespace {

/// Threads per block every kernel here is compiled for.
constexpr int kBlock = 256;
/// Elements per thread per step.
constexpr int kVec = 4;

/// One tensor of an AdamW launch (72 bytes; `AdamwDesc` on the Rust side).
struct AdamwTensor {
  void* param;            // T: model copy, updated in place (or rewritten from master)
  const void* grad;       // T
  float* exp_avg;         // f32
  float* exp_avg_sq;      // f32
  float* max_exp_avg_sq;  // f32, amsgrad only (else null)
  float* master;          // f32 master weights, or null
  int64_t numel;
  int64_t first_chunk;
  float decay;      // 1 − lr·weight_decay of this tensor
  float step_size;  // lr / (1 − β1^t) of this tensor
};

/// One tensor of a non-finite check or L2 norm launch (32 bytes; `TensorRef` on the Rust side).
struct TensorRef {
  const void* data;
  int64_t numel;
  int64_t first_chunk;
  int64_t reserved;
};

/// Rows of the by-value tables (`ADAMW_TABLE_ROWS` / `REF_TABLE_ROWS` on the Rust side).
constexpr int kAdamwTableRows = 24;
constexpr int kRefTableRows = 48;

/// The tensors of one AdamW launch, by value (1728 bytes of kernel arguments).
struct AdamwTable {
  AdamwTensor rows[kAdamwTableRows];
};

/// The tensors of one non-finite or L2 norm launch, by value (1536 bytes of kernel arguments).
struct RefTable {
  TensorRef rows[kRefTableRows];
};

/// The step's scalars at the head of a device-side AdamW table (48 bytes; `AdamwHeader` on the
/// Rust side), followed by `count` AdamwTensor rows.
struct AdamwHeader {
  int64_t count;
  int64_t total_chunks;
  float beta1, one_minus_beta1, beta2, one_minus_beta2, eps, bias2_sqrt;
  int32_t maximize, amsgrad;
};

/// Index of the table entry whose chunk range holds `chunk` (entries sorted by first_chunk,
/// ranges contiguous from 0). Block-uniform: every thread reads the same entries.
template <typename Desc>
__device__ __forceinline__ int find_tensor(const Desc* table, int count, int64_t chunk) {
  int lo = 0;
  int hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (table[mid].first_chunk <= chunk) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

struct AdamwScalars {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, eps, bias2_sqrt;
  bool maximize, amsgrad;
};

template <typename T>
__device__ void adamw_impl(const AdamwTensor* __restrict__ table, int count, int64_t total_chunks,
                           int64_t chunk, const AdamwScalars s,
                           const float* __restrict__ grad_scale,
                           const float* __restrict__ found_inf) {
  if (found_inf != nullptr && *found_inf != 0.0f) return;
  const float scale = grad_scale != nullptr ? *grad_scale : 1.0f;
  for (int64_t c = blockIdx.x; c < total_chunks; c += gridDim.x) {
    const AdamwTensor d = table[find_tensor(table, count, c)];
    const int64_t begin = (c - d.first_chunk) * chunk;
    const int64_t end = begin + chunk < d.numel ? begin + chunk : d.numel;
    T* param = static_cast<T*>(d.param);
    const T* grad = static_cast<const T*>(d.grad);
    // No HIPK_HOT_LOOP marker: since the tensor table is passed by value, the marker changes
    // this loop's code (xtask isa-report --verify-markers), so the report picks the loop itself.
    for (int64_t i = begin + static_cast<int64_t>(threadIdx.x) * kVec; i < end;
         i += static_cast<int64_t>(blockDim.x) * kVec) {
      float g[kVec], p[kVec], m[kVec], v[kVec], vmax[kVec];
      hipk::load_floats<kVec>(grad, i, end, g);
      if (d.master != nullptr) {
        hipk::load_floats<kVec>(d.master, i, end, p);
      } else {
        hipk::load_floats<kVec>(param, i, end, p);
      }
      hipk::load_floats<kVec>(d.exp_avg, i, end, m);
      hipk::load_floats<kVec>(d.exp_avg_sq, i, end, v);
      if (s.amsgrad) hipk::load_floats<kVec>(d.max_exp_avg_sq, i, end, vmax);
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        float ge = g[e] / scale;
        if (s.maximize) ge = -ge;
        const float pe = p[e] * d.decay;
        m[e] = s.beta1 * m[e] + s.one_minus_beta1 * ge;
        v[e] = s.beta2 * v[e] + s.one_minus_beta2 * ge * ge;
        float vu = v[e];
        if (s.amsgrad) {
          // torch.maximum: NaN when either operand is NaN (fmaxf would return the other one).
          vu = (isnan(vmax[e]) || isnan(v[e])) ? vmax[e] + v[e] : fmaxf(vmax[e], v[e]);
          vmax[e] = vu;
        }
        const float denom = sqrtf(vu) / s.bias2_sqrt + s.eps;
        p[e] = pe - (d.step_size * m[e]) / denom;
      }
      hipk::store_floats<kVec>(d.exp_avg, i, end, m);
      hipk::store_floats<kVec>(d.exp_avg_sq, i, end, v);
      if (s.amsgrad) hipk::store_floats<kVec>(d.max_exp_avg_sq, i, end, vmax);
      if (d.master != nullptr) hipk::store_floats<kVec>(d.master, i, end, p);
      hipk::store_floats<kVec>(param, i, end, p);
    }
  }
}

template <typename T>
__device__ void nonfinite_impl(const TensorRef* __restrict__ table, int count,
                               int64_t total_chunks, int64_t chunk, float* found_inf) {
  bool bad = false;
  for (int64_t c = blockIdx.x; c < total_chunks; c += gridDim.x) {
    const TensorRef d = table[find_tensor(table, count, c)];
    const int64_t begin = (c - d.first_chunk) * chunk;
    const int64_t end = begin + chunk < d.numel ? begin + chunk : d.numel;
    const T* data = static_cast<const T*>(d.data);
    for (int64_t i = begin + static_cast<int64_t>(threadIdx.x) * kVec; i < end;
         i += static_cast<int64_t>(blockDim.x) * kVec) {
      float x[kVec];
      hipk::load_floats<kVec>(data, i, end, x);  // past the end reads 0: finite
#pragma unroll
      for (int e = 0; e < kVec; ++e) bad |= !isfinite(x[e]);
    }
  }
  if (__any(bad) && threadIdx.x % warpSize == 0) *found_inf = 1.0f;
}

template <typename T>
__device__ void l2norm_impl(const TensorRef* __restrict__ table, int count, int64_t total_chunks,
                            int64_t chunk, float* __restrict__ partials) {
  __shared__ float lds[hipk::kMaxWavesPerBlock];
  for (int64_t c = blockIdx.x; c < total_chunks; c += gridDim.x) {
    const TensorRef d = table[find_tensor(table, count, c)];
    const int64_t begin = (c - d.first_chunk) * chunk;
    const int64_t end = begin + chunk < d.numel ? begin + chunk : d.numel;
    const T* data = static_cast<const T*>(d.data);
    float sum = 0.0f;
    for (int64_t i = begin + static_cast<int64_t>(threadIdx.x) * kVec; i < end;
         i += static_cast<int64_t>(blockDim.x) * kVec) {
      float x[kVec];
      hipk::load_floats<kVec>(data, i, end, x);
#pragma unroll
      for (int e = 0; e < kVec; ++e) sum += x[e] * x[e];
    }
    sum = hipk::block_sum(sum, lds);
    if (threadIdx.x == 0) partials[c] = sum;
  }
}

/// out[0] = √(Σ partials), summed in f64: per thread over a fixed stride, then across the block
/// in wave order (one block launched).
__device__ void l2norm_finalize_impl(const float* __restrict__ partials, int64_t count,
                                     float* __restrict__ out) {
  __shared__ double lds[hipk::kMaxWavesPerBlock];
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) sum += partials[i];
  const int lane = static_cast<int>(threadIdx.x) % warpSize;
  const int wave = static_cast<int>(threadIdx.x) / warpSize;
  for (int offset = warpSize / 2; offset > 0; offset /= 2) sum += __shfl_xor(sum, offset, warpSize);
  if (lane == 0) lds[wave] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    const int waves = (static_cast<int>(blockDim.x) + warpSize - 1) / warpSize;
    double total = 0.0;
    for (int w = 0; w < waves; ++w) total += lds[w];
    out[0] = static_cast<float>(sqrt(total));
  }
}

/// out[0] = √(Σ partials) as l2norm_finalize_impl, then the clip grad_scale of kernels/clip.hip:
/// s = loss_scale ? *loss_scale : 1; c = min(1, max_norm / (norm / s + 1e-6)) (NaN stays NaN);
/// grad_scale = s / c.
__device__ void l2norm_finalize_clip_impl(const float* __restrict__ partials, int64_t count,
                                          float* __restrict__ norm,
                                          const float* __restrict__ loss_scale, float max_norm,
                                          float* __restrict__ grad_scale) {
  l2norm_finalize_impl(partials, count, norm);
  if (threadIdx.x == 0) {
    const float s = loss_scale != nullptr ? *loss_scale : 1.0f;
    float c = max_norm / (*norm / s + 1e-6f);
    if (!(c != c)) c = fminf(c, 1.0f);
    *grad_scale = s / c;
  }
}

}  // namespace

#define ADAMW_TABLE_KERNELS(suffix, T)                                                         \
  HIPK_KERNEL(adamw_tab_##suffix, kBlock)                                                      \
  (const AdamwHeader* head, const AdamwTensor* rows, int64_t chunk, const float* grad_scale,  \
   const float* found_inf) {                                                                   \
    const AdamwHeader h = *head;                                                               \
    const AdamwScalars s{h.beta1, h.one_minus_beta1, h.beta2,         h.one_minus_beta2,      \
                         h.eps,   h.bias2_sqrt,      h.maximize != 0, h.amsgrad != 0};         \
    adamw_impl<T>(rows, static_cast<int>(h.count), h.total_chunks, chunk, s, grad_scale,       \
                  found_inf);                                                                  \
  }                                                                                            \
  HIPK_KERNEL(multi_nonfinite_tab_##suffix, kBlock)                                            \
  (const TensorRef* rows, int count, int64_t total_chunks, int64_t chunk, float* found_inf) { \
    nonfinite_impl<T>(rows, count, total_chunks, chunk, found_inf);                            \
  }                                                                                            \
  HIPK_KERNEL(multi_l2norm_tab_##suffix, kBlock)                                               \
  (const TensorRef* rows, int count, int64_t total_chunks, int64_t chunk, float* partials) {  \
    l2norm_impl<T>(rows, count, total_chunks, chunk, partials);                                \
  }

HIPK_DTYPES(ADAMW_TABLE_KERNELS)

HIPK_KERNEL(multi_l2norm_finalize_clip_f32, kBlock)
(const float* partials, int64_t count, float* norm, const float* loss_scale, float max_norm,
 float* grad_scale) {
  l2norm_finalize_clip_impl(partials, count, norm, loss_scale, max_norm, grad_scale);
}

#define ADAMW_KERNELS(suffix, T)                                                               \
  HIPK_KERNEL(adamw_##suffix, kBlock)                                                          \
  (const AdamwTable table, int count, int64_t total_chunks, int64_t chunk, float beta1,     \
   float one_minus_beta1, float beta2, float one_minus_beta2, float eps, float bias2_sqrt,    \
   int maximize, int amsgrad, const float* grad_scale, const float* found_inf) {               \
    const AdamwScalars s{beta1, one_minus_beta1, beta2,         one_minus_beta2,              \
                         eps,   bias2_sqrt,      maximize != 0, amsgrad != 0};                 \
    adamw_impl<T>(table.rows, count, total_chunks, chunk, s, grad_scale, found_inf);           \
  }                                                                                            \
  HIPK_KERNEL(multi_nonfinite_##suffix, kBlock)                                                \
  (const RefTable table, int count, int64_t total_chunks, int64_t chunk, float* found_inf) {  \
    nonfinite_impl<T>(table.rows, count, total_chunks, chunk, found_inf);                      \
  }                                                                                            \
  HIPK_KERNEL(multi_l2norm_##suffix, kBlock)                                                   \
  (const RefTable table, int count, int64_t total_chunks, int64_t chunk, float* partials) {   \
    l2norm_impl<T>(table.rows, count, total_chunks, chunk, partials);                          \
  }

HIPK_DTYPES(ADAMW_KERNELS)

HIPK_KERNEL(multi_l2norm_finalize_f32, kBlock)(const float* partials, int64_t count, float* out) {
  l2norm_finalize_impl(partials, count, out);
}
