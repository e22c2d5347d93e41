// CUDA rotary position embedding: the twin of kernels/cpu/rope.h, called by RopeApply
// (kernels/rope.cc) after it has checked the arguments.
#pragma once

#include "absl/status/status.h"
#include "kernels/device.h"
#include "kernels/rope.h"

namespace zt::cuda {

absl::Status RopeApply(const DeviceContext& ctx, const RopeArgs& args);

}  // namespace zt::cuda
