// CPU rotary position embedding (kernels/rope.h). Internal to kernels/: kernels/rope.cc checks
// the arguments and derives the dimensions, so this cannot fail.
#pragma once

#include <cstdint>

#include "kernels/device.h"
#include "kernels/rope.h"

namespace zt::cpu {

// The per-token cos/sin tables live on the stack and are sized for this head size.
constexpr int kRopeMaxHeadDim = 1024;

struct RopeDims {
  int64_t batch = 0;      // B
  int64_t seq = 0;        // T
  int rotated_heads = 0;  // H + Hkv: the q and k heads at the start of each packed row
  int64_t row = 0;        // (H + 2·Hkv)·D
  int head_dim = 0;       // D, even, ≤ kRopeMaxHeadDim
};

void RopeApply(const DeviceContext& ctx, const RopeDims& dims, const RopeArgs& args);

}  // namespace zt::cpu
