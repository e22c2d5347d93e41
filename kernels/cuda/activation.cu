// CUDA GELU (tanh approximation) and SwiGLU, one thread per element (grid-stride).
// The formulas are kernels/cpu/activation.cc's, written through the sigmoid so that both
// tails keep full relative accuracy:
//   gelu(x) = x·s,  s = sigmoid(2u),  u = k·(x + 0.044715·x³),  k = √(2/π),
//   gelu'(x) = s + x·s·(1 − s)·2k·(1 + 3·0.044715·x²),
//   swiglu: out = g·sigmoid(g)·up,  d gate = dy·up·s·(1 + g·(1 − s)),  d up = dy·g·s.
// The sigmoid clamps its argument to [−80, 80] and computes 1 − s as e·s, as the CPU's does;
// its exp is CUDA's expf (≤ 2 ulp) where the CPU uses its FastExp polynomial, so the two
// differ by a few f32 ulps, not by summation order alone. Each result is rounded once to its
// tensor's dtype. Every element is read before it is written by the same thread, so GELU's
// dinp may alias dout.
#include "kernels/cuda/activation.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/float_io.cuh"

namespace zt::cuda {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;
constexpr int kThreads = 256;

struct Sig {
  float s;
  float one_minus_s;
};

__device__ __forceinline__ Sig Sigmoid(float x) {
  x = x < -80.0f ? -80.0f : x;
  x = x > 80.0f ? 80.0f : x;
  const float e = expf(-x);
  const float s = 1.0f / (1.0f + e);
  return {s, e * s};
}

__global__ void GeluForwardKernel(FloatPtr inp, FloatPtr out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float x = inp.Load(i);
    const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
    out.Store(i, x * Sigmoid(2.0f * u).s);
  }
}

__global__ void GeluBackwardKernel(FloatPtr inp, FloatPtr dout, FloatPtr dinp, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float x = inp.Load(i);
    const float dy = dout.Load(i);
    const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
    const Sig sp = Sigmoid(2.0f * u);
    const float du_dx = kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
    dinp.Store(i, (sp.s + x * sp.s * sp.one_minus_s * 2.0f * du_dx) * dy);
  }
}

// Output element k of an (N, F) SwiGLU output is gate element GateIndex(k, F) of the packed
// (N, 2F) input; its up element is F further.
__device__ __forceinline__ int64_t GateIndex(int64_t k, int64_t f) { return k / f * 2 * f + k % f; }

// inp (N, 2F) = [gate | up], out (N, F); one thread per output element.
__global__ void SwigluForwardKernel(FloatPtr inp, FloatPtr out, int64_t n, int64_t f) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t at = GateIndex(k, f);
    const float g = inp.Load(at);
    out.Store(k, g * Sigmoid(g).s * inp.Load(at + f));
  }
}

__global__ void SwigluBackwardKernel(FloatPtr inp, FloatPtr dout, FloatPtr dinp, int64_t n,
                                     int64_t f) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t at = GateIndex(k, f);
    const float g = inp.Load(at);
    const float up = inp.Load(at + f);
    const float dy = dout.Load(k);
    const Sig sp = Sigmoid(g);
    dinp.Store(at, dy * up * sp.s * (1.0f + g * sp.one_minus_s));
    dinp.Store(at + f, dy * g * sp.s);
  }
}

}  // namespace

absl::Status GeluForward(const DeviceContext& ctx, const Tensor& inp, const Tensor& out) {
  const int64_t n = inp.numel();
  if (n == 0) return absl::OkStatus();
  GeluForwardKernel<<<GridFor(n, kThreads), kThreads, 0, StreamOf(ctx)>>>(AsFloatPtr(inp),
                                                                          AsFloatPtr(out), n);
  return LaunchStatus("GeluForward");
}

absl::Status GeluBackward(const DeviceContext& ctx, const Tensor& inp, const Tensor& dout,
                          const Tensor& dinp) {
  const int64_t n = inp.numel();
  if (n == 0) return absl::OkStatus();
  GeluBackwardKernel<<<GridFor(n, kThreads), kThreads, 0, StreamOf(ctx)>>>(
      AsFloatPtr(inp), AsFloatPtr(dout), AsFloatPtr(dinp), n);
  return LaunchStatus("GeluBackward");
}

absl::Status SwigluForward(const DeviceContext& ctx, const Tensor& inp, const Tensor& out) {
  const int64_t rows = inp.dim(0), f = inp.dim(1) / 2;
  if (rows * f == 0) return absl::OkStatus();
  SwigluForwardKernel<<<GridFor(rows * f, kThreads), kThreads, 0, StreamOf(ctx)>>>(
      AsFloatPtr(inp), AsFloatPtr(out), rows * f, f);
  return LaunchStatus("SwigluForward");
}

absl::Status SwigluBackward(const DeviceContext& ctx, const Tensor& inp, const Tensor& dout,
                            const Tensor& dinp) {
  const int64_t rows = inp.dim(0), f = inp.dim(1) / 2;
  if (rows * f == 0) return absl::OkStatus();
  SwigluBackwardKernel<<<GridFor(rows * f, kThreads), kThreads, 0, StreamOf(ctx)>>>(
      AsFloatPtr(inp), AsFloatPtr(dout), AsFloatPtr(dinp), rows * f, f);
  return LaunchStatus("SwigluBackward");
}

}  // namespace zt::cuda
