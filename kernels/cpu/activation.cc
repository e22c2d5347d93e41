// GELU (tanh approximation) and SwiGLU on the CPU.
// Written through the sigmoid: 0.5·(1 + tanh(u)) = sigmoid(2u), so
//   gelu(x) = x·s,  s = sigmoid(2u),  u = k·(x + 0.044715·x³),  k = √(2/π),
//   gelu'(x) = s + x·s·(1 − s)·2k·(1 + 3·0.044715·x²),
// which keeps full relative accuracy on both tails, where 1 + tanh(u) would cancel.
// SwiGLU: out = silu(g)·u with silu(g) = g·sigmoid(g), silu'(g) = s·(1 + g·(1 − s)).
// The sigmoids use FastExp, so every loop here vectorizes. 16-bit tensors are converted to f32
// by chunks (GELU) or rows (SwiGLU) and each result is rounded once when stored.
#include "kernels/cpu/activation.h"

#include <algorithm>
#include <initializer_list>

#include "kernels/cpu/load_store.h"
#include "kernels/cpu/vec_math.h"

namespace zt::cpu {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

// Below this many elements a parallel region costs more than it saves.
constexpr int64_t kMinParallel = 1 << 14;
// Elements converted to f32 at a time on the 16-bit paths.
constexpr int64_t kChunk = 4096;

inline float Gelu(float x) {
  const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
  return x * Sigmoid(2.0f * u).s;
}

inline float GeluGrad(float x, float dy) {
  const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
  const SigmoidPair sp = Sigmoid(2.0f * u);
  const float du_dx = kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
  return (sp.s + x * sp.s * sp.one_minus_s * 2.0f * du_dx) * dy;
}

bool AllF32(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) {
    if (t->dtype() != DType::kF32) return false;
  }
  return true;
}

}  // namespace

void GeluForward(const DeviceContext& ctx, const Tensor& inp, const Tensor& out) {
  const int64_t n = inp.numel();
  if (AllF32({&inp, &out})) {
    const float* x = inp.data<float>();
    float* y = out.data<float>();
#pragma omp parallel for simd num_threads(ctx.num_threads) schedule(static) if (n >= kMinParallel)
    for (int64_t i = 0; i < n; ++i) y[i] = Gelu(x[i]);
    return;
  }
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static) if (n >= kMinParallel)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t off = c * kChunk, len = std::min(kChunk, n - off);
    const float* x = ReadRow(inp.raw(), inp.dtype(), off, len, 0);
    float* y = WriteRow(out.raw(), out.dtype(), off, len, 1, /*load=*/false);
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) y[i] = Gelu(x[i]);
    FinishRow(y, len, out.raw(), out.dtype(), off);
  }
}

void GeluBackward(const DeviceContext& ctx, const Tensor& inp, const Tensor& dout,
                  const Tensor& dinp) {
  const int64_t n = inp.numel();
  if (AllF32({&inp, &dout, &dinp})) {
    const float* x = inp.data<float>();
    const float* dy = dout.data<float>();
    float* dx = dinp.data<float>();
#pragma omp parallel for simd num_threads(ctx.num_threads) schedule(static) if (n >= kMinParallel)
    for (int64_t i = 0; i < n; ++i) dx[i] = GeluGrad(x[i], dy[i]);
    return;
  }
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static) if (n >= kMinParallel)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t off = c * kChunk, len = std::min(kChunk, n - off);
    // Both inputs are converted before the store, so dinp may alias dout.
    const float* x = ReadRow(inp.raw(), inp.dtype(), off, len, 0);
    const float* dy = ReadRow(dout.raw(), dout.dtype(), off, len, 1);
    float* dx = WriteRow(dinp.raw(), dinp.dtype(), off, len, 2, /*load=*/false);
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) dx[i] = GeluGrad(x[i], dy[i]);
    FinishRow(dx, len, dinp.raw(), dinp.dtype(), off);
  }
}

void SwigluForward(const DeviceContext& ctx, const Tensor& inp, const Tensor& out) {
  const int64_t rows = inp.dim(0), f = inp.dim(1) / 2;
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static) if (rows * f >= kMinParallel)
  for (int64_t r = 0; r < rows; ++r) {
    const float* gate = ReadRow(inp.raw(), inp.dtype(), r * 2 * f, 2 * f, 0);  // (2F)
    const float* up = gate + f;                                                // (F)
    float* y = WriteRow(out.raw(), out.dtype(), r * f, f, 1, /*load=*/false);  // (F)
#pragma omp simd
    for (int64_t i = 0; i < f; ++i) y[i] = gate[i] * Sigmoid(gate[i]).s * up[i];
    FinishRow(y, f, out.raw(), out.dtype(), r * f);
  }
}

void SwigluBackward(const DeviceContext& ctx, const Tensor& inp, const Tensor& dout,
                    const Tensor& dinp) {
  const int64_t rows = inp.dim(0), f = inp.dim(1) / 2;
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static) if (rows * f >= kMinParallel)
  for (int64_t r = 0; r < rows; ++r) {
    const float* gate = ReadRow(inp.raw(), inp.dtype(), r * 2 * f, 2 * f, 0);
    const float* up = gate + f;
    const float* dy = ReadRow(dout.raw(), dout.dtype(), r * f, f, 1);
    float* dgate = WriteRow(dinp.raw(), dinp.dtype(), r * 2 * f, 2 * f, 2, /*load=*/false);
    float* dup = dgate + f;
#pragma omp simd
    for (int64_t i = 0; i < f; ++i) {
      const float g = gate[i];
      const SigmoidPair sp = Sigmoid(g);
      dgate[i] = dy[i] * up[i] * sp.s * (1.0f + g * sp.one_minus_s);
      dup[i] = dy[i] * g * sp.s;
    }
    FinishRow(dgate, 2 * f, dinp.raw(), dinp.dtype(), r * 2 * f);
  }
}

}  // namespace zt::cpu
