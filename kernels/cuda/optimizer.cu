// CUDA AdamW and SGD over flat ranges: one thread per element (grid-stride), every element
// independent, so the result does not depend on the launch. Each element's arithmetic is the
// CPU twin's expression in f32 (kernels/cpu/optimizer.cc), with the bias corrections
// computed on the host in double as the CPU computes them; the master's storage and its
// 16-bit copy follow kernels/cuda/optimizer_master.cuh (bit-exact conversions). GPU and CPU
// can differ only where one compiler fuses a multiply-add the other does not, and where
// sqrtf/division round (both IEEE here: device code is built without fast math).
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/float_io.cuh"
#include "kernels/cuda/optimizer.h"
#include "kernels/cuda/optimizer_master.cuh"

namespace zt::cuda {
namespace {

constexpr int kThreads = 256;

template <typename G, CopyMode M>
__global__ void AdamWKernel(DeviceMaster<M> master, const G* grad, float* m, float* v, int64_t n,
                            AdamScalars s) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = ToFloat(grad[i]) * s.gs;
    const float mi = s.b1 * m[i] + (1.0f - s.b1) * g;
    const float vi = s.b2 * v[i] + (1.0f - s.b2) * g * g;
    m[i] = mi;
    v[i] = vi;
    master.Store(i, AdamStep(s, mi, vi, master.Load(i)), i);
  }
}

struct SgdScalars {
  float lr, mu, wd, gs;
};

// buf == nullptr: no momentum.
template <typename G, CopyMode M>
__global__ void SgdKernel(DeviceMaster<M> master, const G* grad, float* buf, int64_t n,
                          SgdScalars s) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float old = master.Load(i);
    float b = ToFloat(grad[i]) * s.gs;
    if (buf != nullptr) {
      b = s.mu * buf[i] + b;
      buf[i] = b;
    }
    master.Store(i, old - s.lr * (b + s.wd * old), i);
  }
}

}  // namespace

absl::Status AdamWUpdate(const DeviceContext& ctx, const AdamWArgs& args) {
  const int64_t n = args.param.numel();
  if (n == 0) return absl::OkStatus();
  const AdamScalars s = AdamScalarsOf(args);
  DispatchGradCopy(args.grad, args.param, args.param_copy, args.stochastic_rounding,
                   [&](auto grad_tag, auto mode_tag) {
                     using G = decltype(grad_tag);
                     constexpr CopyMode kM = decltype(mode_tag)::value;
                     AdamWKernel<G, kM><<<GridFor(n, kThreads), kThreads, 0, StreamOf(ctx)>>>(
                         DeviceMasterOf<kM>(args.param, args.param_copy, args.seed),
                         static_cast<const G*>(args.grad.raw()), args.m.data<float>(),
                         args.v.data<float>(), n, s);
                   });
  return LaunchStatus("AdamWUpdate");
}

absl::Status SgdUpdate(const DeviceContext& ctx, const SgdArgs& args) {
  const int64_t n = args.param.numel();
  if (n == 0) return absl::OkStatus();
  const SgdScalars s{
      .lr = args.lr, .mu = args.momentum_factor, .wd = args.weight_decay, .gs = args.grad_scale};
  float* buf = args.momentum.empty() ? nullptr : args.momentum.data<float>();
  DispatchGradCopy(args.grad, args.param, args.param_copy, args.stochastic_rounding,
                   [&](auto grad_tag, auto mode_tag) {
                     using G = decltype(grad_tag);
                     constexpr CopyMode kM = decltype(mode_tag)::value;
                     SgdKernel<G, kM><<<GridFor(n, kThreads), kThreads, 0, StreamOf(ctx)>>>(
                         DeviceMasterOf<kM>(args.param, args.param_copy, args.seed),
                         static_cast<const G*>(args.grad.raw()), buf, n, s);
                   });
  return LaunchStatus("SgdUpdate");
}

}  // namespace zt::cuda
