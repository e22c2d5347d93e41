// CUDA AdamW and SGD updates: the twins of kernels/cpu/optimizer.h, called by
// kernels/optimizer.cc after it has checked the arguments.
#pragma once

#include "absl/status/status.h"
#include "kernels/device.h"
#include "kernels/optimizer.h"

namespace zt::cuda {

absl::Status AdamWUpdate(const DeviceContext& ctx, const AdamWArgs& args);
absl::Status SgdUpdate(const DeviceContext& ctx, const SgdArgs& args);

}  // namespace zt::cuda
