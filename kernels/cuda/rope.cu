// CUDA rotary position embedding, rotate-half convention, in place on the q and k heads.
//
// Legend: B batch, T sequence, D head size, D/2 rotation pairs (i, i + D/2).
// One thread per rotation pair of one head of one row. As on the CPU, the angle
// pos · base^(-2i/D) and its sine and cosine are evaluated in double (an f32 angle is off by
// ~4e-3 radians at ~1e5) and the rotation is rounded once to the storage type. Memory-bound:
// the double arithmetic hides behind the loads.
#include "kernels/cuda/rope.h"

#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/float_io.cuh"

namespace zt::cuda {
namespace {

struct RopeShape {
  int64_t rows;         // B·T
  int64_t seq;          // T
  int64_t row;          // (H + 2·Hkv)·D elements per row
  int rotated_heads;    // H + Hkv
  int half;             // D/2
  double log2_theta;
  double sign;          // +1 forward, −1 inverse
};

template <typename T>
__global__ void RopeKernel(T* qkv, const int32_t* positions, RopeShape s) {
  const int64_t pairs_per_row = static_cast<int64_t>(s.rotated_heads) * s.half;
  const int64_t total = s.rows * pairs_per_row;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < total;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = k / pairs_per_row;
    const int64_t p = k % pairs_per_row;
    const int64_t h = p / s.half;
    const int i = static_cast<int>(p % s.half);
    const double pos = positions != nullptr ? positions[r] : static_cast<double>(r % s.seq);
    // base^(-2i/D) = 2^(-(2i/D)·log2 base), D = 2·half.
    const double angle = pos * exp2(-static_cast<double>(i) / s.half * s.log2_theta);
    double sin_t, cos_t;
    sincos(angle, &sin_t, &cos_t);
    sin_t *= s.sign;
    T* x = qkv + r * s.row + h * 2 * s.half;
    const double x0 = ToFloat(x[i]);
    const double x1 = ToFloat(x[i + s.half]);
    x[i] = FromFloat<T>(static_cast<float>(x0 * cos_t - x1 * sin_t));
    x[i + s.half] = FromFloat<T>(static_cast<float>(x1 * cos_t + x0 * sin_t));
  }
}

}  // namespace

absl::Status RopeApply(const DeviceContext& ctx, const RopeArgs& args) {
  const Tensor& qkv = args.qkv;  // (B, T, (H + 2·Hkv)·D)
  const int64_t heads = args.n_head + 2 * static_cast<int64_t>(args.n_kv_head);
  const RopeShape shape{
      .rows = qkv.dim(0) * qkv.dim(1),
      .seq = qkv.dim(1),
      .row = qkv.dim(2),
      .rotated_heads = args.n_head + args.n_kv_head,
      .half = static_cast<int>(qkv.dim(2) / heads / 2),
      .log2_theta = std::log2(static_cast<double>(args.theta)),
      .sign = args.direction == RopeDirection::kForward ? 1.0 : -1.0,
  };
  const int64_t pairs = shape.rows * shape.rotated_heads * shape.half;
  if (pairs == 0) return absl::OkStatus();
  const int32_t* positions = args.positions.empty() ? nullptr : args.positions.data<int32_t>();
  constexpr int kThreads = 256;
  DispatchFloatType(qkv.dtype(), [&](auto tag) {
    using T = decltype(tag);
    RopeKernel<T><<<GridFor(pairs, kThreads), kThreads, 0, StreamOf(ctx)>>>(qkv.data<T>(),
                                                                             positions, shape);
  });
  return LaunchStatus("RopeApply");
}

}  // namespace zt::cuda
