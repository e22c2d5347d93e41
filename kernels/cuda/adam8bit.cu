// CUDA 8-bit AdamW: one thread block per quantization block, in the CPU's two passes
// (kernels/cpu/adam8bit.cc). Pass 1 dequantizes m and v with the block's old absmax values,
// takes the new m and v and their block maxima (exact: max has no rounding); pass 2
// recomputes them (the same expression on the same inputs, so the same bits), moves the
// parameter and requantizes with the new maxima through the CPU's own thresholds
// (kernels/cuda/quant_map.cuh). The block's old absmax values are read by every thread before
// the barrier inside the max, and written after it, so the update is in place. The map
// values, thresholds, block layout and absmax rule are the CPU's, so the states a GPU writes
// are the states the CPU writes, up to the f32 rounding of m and v: the two compilers may
// fuse β·old + (1 − β)·x into an fma differently, and a last-bit difference in m or v can
// move a value across a threshold (one code).
#include "kernels/cuda/adam8bit.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/float_io.cuh"
#include "kernels/cuda/norm_reduce.cuh"
#include "kernels/cuda/optimizer_master.cuh"
#include "kernels/cuda/quant_map.cuh"
#include "kernels/quantization.h"

namespace zt::cuda {
namespace {

constexpr int kThreads = 256;

// The two maps travel as kernel parameters (4 KiB in all: CUDA 12.1 and later take up to
// 32 KiB of parameters on Volta and newer).
struct Maps {
  QuantMap m;  // DynamicMapSigned
  QuantMap v;  // DynamicMapUnsigned
};

__device__ __forceinline__ float Ema(float beta, float old, float x) {
  return beta * old + (1.0f - beta) * x;
}

template <typename G, CopyMode M>
__global__ void AdamW8bitKernel(DeviceMaster<M> master, const G* grad, uint8_t* m_codes,
                                float* m_absmax, uint8_t* v_codes, float* v_absmax, int64_t n,
                                int64_t block, AdamScalars s, Maps maps) {
  __shared__ QuantMap sm, sv;
  __shared__ float scratch[32];
  LoadQuantMap(maps.m, sm);
  LoadQuantMap(maps.v, sv);
  __syncthreads();
  const int64_t b = blockIdx.x;
  const int64_t begin = b * block;
  const int64_t len = n - begin < block ? n - begin : block;
  const float m_scale = m_absmax[b], v_scale = v_absmax[b];
  float m_max = 0.0f, v_max = 0.0f;
  for (int64_t i = threadIdx.x; i < len; i += blockDim.x) {
    const int64_t k = begin + i;
    const float gi = ToFloat(grad[k]) * s.gs;
    const float mi = Ema(s.b1, sm.values[m_codes[k]] * m_scale, gi);
    const float vi = Ema(s.b2, sv.values[v_codes[k]] * v_scale, gi * gi);
    m_max = fmaxf(m_max, fabsf(mi));
    v_max = fmaxf(v_max, vi);
  }
  m_max = BlockMax(m_max, scratch);
  v_max = BlockMax(v_max, scratch);
  const float m_div = m_max == 0.0f ? 1.0f : m_max;
  const float v_div = v_max == 0.0f ? 1.0f : v_max;
  for (int64_t i = threadIdx.x; i < len; i += blockDim.x) {
    const int64_t k = begin + i;
    const float gi = ToFloat(grad[k]) * s.gs;
    const float mi = Ema(s.b1, sm.values[m_codes[k]] * m_scale, gi);
    const float vi = Ema(s.b2, sv.values[v_codes[k]] * v_scale, gi * gi);
    master.Store(k, AdamStep(s, mi, vi, master.Load(k)), k);
    m_codes[k] = QuotientCode(sm, mi, m_div);
    v_codes[k] = QuotientCode(sv, vi, v_div);
  }
  if (threadIdx.x == 0) {
    m_absmax[b] = m_max;
    v_absmax[b] = v_max;
  }
}

}  // namespace

absl::Status AdamW8bitUpdate(const DeviceContext& ctx, const AdamW8bitArgs& args) {
  const int64_t n = args.param.numel();
  if (n == 0) return absl::OkStatus();
  const auto blocks = static_cast<unsigned int>(NumQuantBlocks(n, args.block));
  const AdamScalars s = AdamScalarsOf(args);
  const Maps maps{.m = QuantMapOf(DynamicMap::kSigned), .v = QuantMapOf(DynamicMap::kUnsigned)};
  DispatchGradCopy(args.grad, args.param, args.param_copy, args.stochastic_rounding,
                   [&](auto grad_tag, auto mode_tag) {
                     using G = decltype(grad_tag);
                     constexpr CopyMode kM = decltype(mode_tag)::value;
                     AdamW8bitKernel<G, kM><<<blocks, kThreads, 0, StreamOf(ctx)>>>(
                         DeviceMasterOf<kM>(args.param, args.param_copy, args.seed),
                         static_cast<const G*>(args.grad.raw()), args.m_codes.data<uint8_t>(),
                         args.m_absmax.data<float>(), args.v_codes.data<uint8_t>(),
                         args.v_absmax.data<float>(), n, args.block, s, maps);
                   });
  return LaunchStatus("AdamW8bitUpdate");
}

}  // namespace zt::cuda
