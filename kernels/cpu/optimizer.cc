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

// Each loop below runs in a function of its own, over `__restrict` pointers and scalars that
// each thread holds privately: written as a lambda over captured pointers, GCC could not
// prove that the stores to m and v leave the captures unchanged, reloaded them every element
// and vectorized with gathers and scatters or not at all (the host step ran at 0.27 G
// parameters/s a core, compute bound, about half of what torch.optim.AdamW reaches).

struct AdamWConstants {
  float b1, b2, inv_bc1, inv_bc2, lr, eps, wd, gs;
};

template <DType kG, CopyMode kC>
void AdamWLoop(const AdamWConstants& c, const void* __restrict grad, float* __restrict m,
               float* __restrict v, const MasterParams<kC> master, int64_t n, int threads) {
  // Scalars, not members, and every one firstprivate: the outlined parallel region would
  // otherwise read shared variables through its data pointer, which the vectorizer does not
  // trust across the stores.
  const float b1 = c.b1, b2 = c.b2, inv_bc1 = c.inv_bc1, inv_bc2 = c.inv_bc2, lr = c.lr;
  const float eps = c.eps, wd = c.wd, gs = c.gs;
#pragma omp parallel for simd num_threads(threads) schedule(static) if (n >= kMinParallel) \
    firstprivate(grad, m, v, master, b1, b2, inv_bc1, inv_bc2, lr, eps, wd, gs)
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
}

struct SgdConstants {
  float lr, mu, wd, gs;
};

template <DType kG, CopyMode kC>
void SgdLoop(const SgdConstants& c, const void* __restrict grad, float* __restrict buf,
             const MasterParams<kC> master, int64_t n, int threads) {
  const float lr = c.lr, mu = c.mu, wd = c.wd, gs = c.gs;  // scalars, as in AdamWLoop
  if (buf == nullptr) {
#pragma omp parallel for simd num_threads(threads) schedule(static) if (n >= kMinParallel) \
    firstprivate(grad, master, lr, wd, gs)
    for (int64_t i = 0; i < n; ++i) {
      const float old = master.Load(i);
      master.Store(i, old - lr * (LoadAs<kG>(grad, i) * gs + wd * old));
    }
    return;
  }
#pragma omp parallel for simd num_threads(threads) schedule(static) if (n >= kMinParallel) \
    firstprivate(grad, buf, master, lr, mu, wd, gs)
  for (int64_t i = 0; i < n; ++i) {
    const float b = mu * buf[i] + LoadAs<kG>(grad, i) * gs;
    buf[i] = b;
    const float old = master.Load(i);
    master.Store(i, old - lr * (b + wd * old));
  }
}

}  // namespace

void AdamWUpdate(const DeviceContext& ctx, const AdamWArgs& args) {
  const float b1 = args.beta1, b2 = args.beta2;
  // Bias corrections in double: β2^t for t in the thousands is where f32 pow loses digits.
  const double t = static_cast<double>(args.step);
  const AdamWConstants c{
      .b1 = b1,
      .b2 = b2,
      .inv_bc1 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(b1), t))),
      .inv_bc2 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(b2), t))),
      .lr = args.lr,
      .eps = args.eps,
      .wd = args.weight_decay,
      .gs = args.grad_scale};
  DispatchGradCopy(args.grad.dtype(),
                   CopyModeFor(args.param, args.param_copy, args.stochastic_rounding),
                   [&](auto grad_dtype, auto copy_mode) {
                     constexpr DType kG = decltype(grad_dtype)::value;
                     constexpr CopyMode kC = decltype(copy_mode)::value;
                     AdamWLoop<kG, kC>(c, args.grad.raw(), args.m.data<float>(),
                                       args.v.data<float>(),
                                       MasterParamsOf<kC>(args.param, args.param_copy, args.seed),
                                       args.param.numel(), ctx.num_threads);
                   });
}

void SgdUpdate(const DeviceContext& ctx, const SgdArgs& args) {
  const SgdConstants c{.lr = args.lr,
                       .mu = args.momentum_factor,
                       .wd = args.weight_decay,
                       .gs = args.grad_scale};
  float* buf = args.momentum.empty() ? nullptr : args.momentum.data<float>();
  DispatchGradCopy(args.grad.dtype(),
                   CopyModeFor(args.param, args.param_copy, args.stochastic_rounding),
                   [&](auto grad_dtype, auto copy_mode) {
                     constexpr DType kG = decltype(grad_dtype)::value;
                     constexpr CopyMode kC = decltype(copy_mode)::value;
                     SgdLoop<kG, kC>(c, args.grad.raw(), buf,
                                     MasterParamsOf<kC>(args.param, args.param_copy, args.seed),
                                     args.param.numel(), ctx.num_threads);
                   });
}

}  // namespace zt::cpu
