// CUDA Adafactor: the twin of kernels/cpu/adafactor.h (whole tensors, ZeRO shards and
// tensor-parallel parts), called by kernels/adafactor.cc after it has checked the arguments
// and the workspace.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/adafactor.h"
#include "kernels/device.h"

namespace zt::cuda {

// Blocks of the fixed-order sums (Σ param², Σ U²): each writes one double partial, added in
// block order. A constant, so the workspace and the bits depend on the shape only.
inline constexpr int64_t kAdafactorSumBlocks = 256;

// [param partials | U² partials] doubles, then the update's 2 f32 scalars (padded to 16
// bytes), then one f32 row factor per row of a matrix.
inline int64_t AdafactorCudaWorkspaceBytes(int64_t rows) {
  return 2 * kAdafactorSumBlocks * 8 + 16 + (rows > 0 ? rows : 0) * 4;
}

// The most Shard::uncounted_rows ranges the kernels take (by value, as kernel arguments): a
// part holds a replicated KV head's K rows and V rows, two ranges per head it shares.
inline constexpr int kAdafactorMaxUncountedRanges = 8;

absl::Status AdafactorUpdate(const DeviceContext& ctx, const AdafactorArgs& args);

}  // namespace zt::cuda
