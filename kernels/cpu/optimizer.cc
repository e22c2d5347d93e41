// Optimizer updates on the CPU: one streaming pass over the flat buffers, `parallel for simd`
// with every element independent, so any thread count gives the same bits. Memory bound:
// AdamW moves 28 bytes per parameter (4 buffers read, 3 written), 2 fewer with a 16-bit
// gradient and 2 more with a 16-bit parameter copy (4 fewer again with a split master, whose
// two halves are read and written instead of an f32 master and its copy).
#include "kernels/cpu/optimizer.h"

#include <cmath>
#include <cstdint>

#include "kernels/cpu/param_copy.h"

namespace zt::cpu {
namespace {

// Below this many elements a parallel region costs more than it saves.
constexpr int64_t kMinParallel = 1 << 15;

}  // namespace

void AdamWUpdate(const DeviceContext& ctx, const AdamWArgs& args) {
  const int64_t n = args.param.numel();
  const void* grad = args.grad.raw();
  float* m = args.m.data<float>();
  float* v = args.v.data<float>();
  const float b1 = args.beta1, b2 = args.beta2;
  // Bias corrections in double: β2^t for t in the thousands is where f32 pow loses digits.
  const double t = static_cast<double>(args.step);
  const float inv_bc1 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(b1), t)));
  const float inv_bc2 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(b2), t)));
  const float lr = args.lr, eps = args.eps, wd = args.weight_decay, gs = args.grad_scale;

  DispatchGradCopy(args.grad.dtype(),
                   CopyModeFor(args.param, args.param_copy, args.stochastic_rounding),
                   [=](auto grad_dtype, auto copy_mode) {
                     constexpr DType kG = decltype(grad_dtype)::value;
                     constexpr CopyMode kC = decltype(copy_mode)::value;
                     const MasterParams<kC> master =
                         MasterParamsOf<kC>(args.param, args.param_copy, args.seed);
#pragma omp parallel for simd num_threads(ctx.num_threads) schedule(static) if (n >= kMinParallel)
                     for (int64_t i = 0; i < n; ++i) {
                       const float g = LoadAs<kG>(grad, i) * gs;
                       const float mi = b1 * m[i] + (1.0f - b1) * g;
                       const float vi = b2 * v[i] + (1.0f - b2) * g * g;
                       m[i] = mi;
                       v[i] = vi;
                       const float update = (mi * inv_bc1) / (std::sqrt(vi * inv_bc2) + eps);
                       const float old = master.Load(i);
                       master.Store(i, old - lr * (update + wd * old));
                     }
                   });
}

void SgdUpdate(const DeviceContext& ctx, const SgdArgs& args) {
  const int64_t n = args.param.numel();
  const void* grad = args.grad.raw();
  float* buf = args.momentum.empty() ? nullptr : args.momentum.data<float>();
  const float lr = args.lr, mu = args.momentum_factor, wd = args.weight_decay;
  const float gs = args.grad_scale;
  DispatchGradCopy(args.grad.dtype(),
                   CopyModeFor(args.param, args.param_copy, args.stochastic_rounding),
                   [=](auto grad_dtype, auto copy_mode) {
                     constexpr DType kG = decltype(grad_dtype)::value;
                     constexpr CopyMode kC = decltype(copy_mode)::value;
                     const MasterParams<kC> master =
                         MasterParamsOf<kC>(args.param, args.param_copy, args.seed);
                     if (buf == nullptr) {
#pragma omp parallel for simd num_threads(ctx.num_threads) schedule(static) if (n >= kMinParallel)
                       for (int64_t i = 0; i < n; ++i) {
                         const float old = master.Load(i);
                         master.Store(i, old - lr * (LoadAs<kG>(grad, i) * gs + wd * old));
                       }
                       return;
                     }
#pragma omp parallel for simd num_threads(ctx.num_threads) schedule(static) if (n >= kMinParallel)
                     for (int64_t i = 0; i < n; ++i) {
                       const float b = mu * buf[i] + LoadAs<kG>(grad, i) * gs;
                       buf[i] = b;
                       const float old = master.Load(i);
                       master.Store(i, old - lr * (b + wd * old));
                     }
                   });
}

}  // namespace zt::cpu
