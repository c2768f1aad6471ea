// kernels/gelu.h — GELU with the tanh approximation (PyTorch's approximate='tanh', GPT-2's
// gelu_new) and its derivative, in f32: shared by gelu.hip and the bias epilogue of matmul.hip.
#pragma once

#include "common.h"

namespace hipk {

constexpr float kGeluSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

/// 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
__device__ __forceinline__ float gelu_tanh(float x) {
  const float u = kGeluSqrt2OverPi * (x + kGeluCubic * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}

/// d gelu_tanh / dx = 0.5·(1 + tanh u) + 0.5·x·(1 − tanh² u)·√(2/π)·(1 + 3·0.044715·x²).
__device__ __forceinline__ float gelu_tanh_grad(float x) {
  const float u = kGeluSqrt2OverPi * (x + kGeluCubic * x * x * x);
  const float th = tanhf(u);
  return 0.5f * (1.0f + th) +
         0.5f * x * (1.0f - th * th) * kGeluSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
}

}  // namespace hipk
