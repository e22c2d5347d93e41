// CPU rotary position embedding, rotate-half convention, in place on the q and k heads.
//
// Legend: B batch, T sequence, D head size, D/2 rotation pairs (i, i + D/2).
// Angles, their cosines and sines, and the rotation itself are evaluated in double and rounded
// once to f32: pos · base^(-2i/D) reaches ~1e5 radians at long contexts, where an f32 angle
// would already be off by ~4e-3. A bf16/f16 qkv row's rotated heads are loaded into a
// per-thread f32 row, rotated as the f32 path does and rounded back once.
#include "kernels/cpu/rope.h"

#include <cmath>

#include "kernels/cpu/load_store.h"

namespace zt::cpu {

void RopeApply(const DeviceContext& ctx, const RopeDims& dims, const RopeArgs& args) {
  const int half = dims.head_dim / 2;
  // θ_i = pos · base^(-2i/D); the forward rotates by +θ, the inverse by −θ.
  double inv_freq[kRopeMaxHeadDim / 2];
  for (int i = 0; i < half; ++i) {
    inv_freq[i] = std::pow(static_cast<double>(args.theta), -2.0 * i / dims.head_dim);
  }
  const double sign = args.direction == RopeDirection::kForward ? 1.0 : -1.0;
  const Tensor& qkv = args.qkv;  // (B, T, (H + 2·Hkv)·D)
  const int64_t rotated = static_cast<int64_t>(dims.rotated_heads) * dims.head_dim;
  const int32_t* positions = args.positions.empty() ? nullptr : args.positions.data<int32_t>();
  const int64_t rows = dims.batch * dims.seq;

#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const double pos = positions != nullptr ? positions[r] : static_cast<double>(r % dims.seq);
    double cos_t[kRopeMaxHeadDim / 2];
    double sin_t[kRopeMaxHeadDim / 2];
    for (int i = 0; i < half; ++i) {
      const double angle = pos * inv_freq[i];
      cos_t[i] = std::cos(angle);
      sin_t[i] = sign * std::sin(angle);
    }
    float* row = WriteRow(qkv.raw(), qkv.dtype(), r * dims.row, rotated, 0, /*load=*/true);
    for (int h = 0; h < dims.rotated_heads; ++h) {
      float* x = row + static_cast<int64_t>(h) * dims.head_dim;
      for (int i = 0; i < half; ++i) {
        const double x0 = x[i];
        const double x1 = x[i + half];
        x[i] = static_cast<float>(x0 * cos_t[i] - x1 * sin_t[i]);
        x[i + half] = static_cast<float>(x1 * cos_t[i] + x0 * sin_t[i]);
      }
    }
    FinishRow(row, rotated, qkv.raw(), qkv.dtype(), r * dims.row);
  }
}

}  // namespace zt::cpu
