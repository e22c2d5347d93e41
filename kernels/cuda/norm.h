// CUDA LayerNorm and RMSNorm: the twins of kernels/cpu/norm.h, called by kernels/norm.cc after
// it has checked the arguments (and that ctx.workspace holds the *WorkspaceBytes it needs).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/device.h"
#include "kernels/norm.h"

namespace zt::cuda {

// Blocks of the backward kernels' first pass, at most: each sums dweight (and dbias) over its
// rows into its own workspace row, and a second pass adds the rows up in block order. A
// constant, not the device's SM count, so the workspace and the bits depend on the shape only.
inline constexpr int64_t kNormBackwardBlocks = 256;

inline int64_t NormBackwardBlocks(int64_t rows) {
  return rows < kNormBackwardBlocks ? rows : kNormBackwardBlocks;
}

absl::Status LayerNormForward(const DeviceContext& ctx, const LayerNormForwardArgs& args);
absl::Status LayerNormBackward(const DeviceContext& ctx, const LayerNormBackwardArgs& args);
absl::Status RmsNormForward(const DeviceContext& ctx, const RmsNormForwardArgs& args);
absl::Status RmsNormBackward(const DeviceContext& ctx, const RmsNormBackwardArgs& args);

}  // namespace zt::cuda
