// GELU (tanh approximation) and SwiGLU on the CPU.
// Written through the sigmoid: 0.5·(1 + tanh(u)) = sigmoid(2u), so
//   gelu(x) = x·s,  s = sigmoid(2u),  u = k·(x + 0.044715·x³),  k = √(2/π),
//   gelu'(x) = s + x·s·(1 − s)·2k·(1 + 3·0.044715·x²),
// which keeps full relative accuracy on both tails, where 1 + tanh(u) would cancel.
// SwiGLU: out = silu(g)·u with silu(g) = g·sigmoid(g), silu'(g) = s·(1 + g·(1 − s)).
// The sigmoids use FastExp, so every loop here vectorizes.
#include "kernels/cpu/activation.h"

#include "kernels/cpu/vec_math.h"

namespace zt::cpu {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

// Below this many elements a parallel region costs more than it saves.
constexpr int64_t kMinParallel = 1 << 14;

}  // namespace

void GeluForward(const DeviceContext& ctx, const float* inp, float* out, int64_t n) {
#pragma omp parallel for simd num_threads(ctx.num_threads) schedule(static) if (n >= kMinParallel)
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
    out[i] = x * Sigmoid(2.0f * u).s;
  }
}

void GeluBackward(const DeviceContext& ctx, const float* inp, const float* dout, float* dinp,
                  int64_t n) {
#pragma omp parallel for simd num_threads(ctx.num_threads) schedule(static) if (n >= kMinParallel)
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
    const SigmoidPair sp = Sigmoid(2.0f * u);
    const float du_dx = kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
    dinp[i] = (sp.s + x * sp.s * sp.one_minus_s * 2.0f * du_dx) * dout[i];
  }
}

void SwigluForward(const DeviceContext& ctx, const float* inp, float* out, int64_t rows,
                   int64_t f) {
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static) if (rows * f >= kMinParallel)
  for (int64_t r = 0; r < rows; ++r) {
    const float* gate = inp + r * 2 * f;  // (F)
    const float* up = gate + f;           // (F)
    float* y = out + r * f;               // (F)
#pragma omp simd
    for (int64_t i = 0; i < f; ++i) y[i] = gate[i] * Sigmoid(gate[i]).s * up[i];
  }
}

void SwigluBackward(const DeviceContext& ctx, const float* inp, const float* dout, float* dinp,
                    int64_t rows, int64_t f) {
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static) if (rows * f >= kMinParallel)
  for (int64_t r = 0; r < rows; ++r) {
    const float* gate = inp + r * 2 * f;
    const float* up = gate + f;
    const float* dy = dout + r * f;
    float* dgate = dinp + r * 2 * f;
    float* dup = dgate + f;
#pragma omp simd
    for (int64_t i = 0; i < f; ++i) {
      const float g = gate[i];
      const SigmoidPair sp = Sigmoid(g);
      dgate[i] = dy[i] * up[i] * sp.s * (1.0f + g * sp.one_minus_s);
      dup[i] = dy[i] * g * sp.s;
    }
  }
}

}  // namespace zt::cpu
