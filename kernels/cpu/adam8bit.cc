// CPU 8-bit AdamW. Each block is one unit of work for one thread (static schedule), in two
// passes over its elements: the first computes the new m and v to find their absmax values,
// the second computes them again (same expression, same bits), moves the parameter and
// requantizes. Recomputing costs a few flops per element and needs no scratch buffer, so any
// block size works without allocating inside the step. Any thread count gives the same bits.
// The gradient's dtype and the parameter copy's rounding are template arguments
// (kernels/cpu/param_copy.h), so each combination is one loop with no per-element switch.
#include "kernels/cpu/adam8bit.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/param_copy.h"
#include "kernels/cpu/quantization.h"

namespace zt::cpu {
namespace {

// Below this many elements a parallel region costs more than it saves.
constexpr int64_t kMinParallel = 1 << 15;

// β·old + (1 − β)·x: both passes call this on the same inputs, so they agree bit for bit.
inline float Ema(float beta, float old, float x) { return beta * old + (1.0f - beta) * x; }

// The update with the gradient stored as kG and the copy written as kC.
template <DType kG, CopyMode kC>
void Update(const DeviceContext& ctx, const AdamW8bitArgs& args) {
  const int64_t n = args.param.numel(), block = args.block;
  const int64_t num_blocks = NumQuantBlocks(n, block);
  const MasterParams<kC> master = MasterParamsOf<kC>(args.param, args.param_copy, args.seed);
  const void* grad = args.grad.raw();
  uint8_t* m_codes = args.m_codes.data<uint8_t>();
  float* m_absmax = args.m_absmax.data<float>();
  uint8_t* v_codes = args.v_codes.data<uint8_t>();
  float* v_absmax = args.v_absmax.data<float>();
  const float* m_map = DynamicMapSigned().data();
  const float* v_map = DynamicMapUnsigned().data();
  const CodeSearch& m_search = CodeSearchFor(DynamicMap::kSigned);
  const CodeSearch& v_search = CodeSearchFor(DynamicMap::kUnsigned);
  const float b1 = args.beta1, b2 = args.beta2;
  // Bias corrections in double, as AdamWUpdate computes them.
  const double t = static_cast<double>(args.step);
  const float inv_bc1 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(b1), t)));
  const float inv_bc2 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(b2), t)));
  const float lr = args.lr, eps = args.eps, wd = args.weight_decay, gs = args.grad_scale;

#pragma omp parallel for num_threads(ctx.num_threads) schedule(static) if (n >= kMinParallel)
  for (int64_t b = 0; b < num_blocks; ++b) {
    const int64_t begin = b * block, len = std::min(block, n - begin);
    const MasterParams<kC> p = master.At(begin);
    uint8_t* mc = m_codes + begin;
    uint8_t* vc = v_codes + begin;
    const float m_scale = m_absmax[b], v_scale = v_absmax[b];
    float m_max = 0.0f, v_max = 0.0f;
#pragma omp simd reduction(max : m_max, v_max)
    for (int64_t i = 0; i < len; ++i) {
      const float gi = LoadAs<kG>(grad, begin + i) * gs;
      const float mi = Ema(b1, m_map[mc[i]] * m_scale, gi);
      const float vi = Ema(b2, v_map[vc[i]] * v_scale, gi * gi);
      m_max = std::max(m_max, std::fabs(mi));
      v_max = std::max(v_max, vi);
    }

    // An absmax of 0 means every value of the block is 0; dividing by 1 instead quantizes
    // them to the code of 0.0 without a special case in the loop.
    const float m_div = m_max == 0.0f ? 1.0f : m_max;
    const float v_div = v_max == 0.0f ? 1.0f : v_max;
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) {
      const float gi = LoadAs<kG>(grad, begin + i) * gs;
      const float mi = Ema(b1, m_map[mc[i]] * m_scale, gi);
      const float vi = Ema(b2, v_map[vc[i]] * v_scale, gi * gi);
      const float update = (mi * inv_bc1) / (std::sqrt(vi * inv_bc2) + eps);
      const float old = p.Load(i);
      p.Store(i, old - lr * (update + wd * old), begin + i);
      mc[i] = NearestCode(m_search, mi / m_div);
      vc[i] = NearestCode(v_search, vi / v_div);
    }
    m_absmax[b] = m_max;
    v_absmax[b] = v_max;
  }
}

}  // namespace

void AdamW8bitUpdate(const DeviceContext& ctx, const AdamW8bitArgs& args) {
  DispatchGradCopy(args.grad.dtype(),
                   CopyModeFor(args.param, args.param_copy, args.stochastic_rounding),
                   [&](auto grad_dtype, auto copy_mode) {
                     Update<decltype(grad_dtype)::value, decltype(copy_mode)::value>(ctx, args);
                   });
}

}  // namespace zt::cpu
