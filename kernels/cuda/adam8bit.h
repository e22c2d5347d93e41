// CUDA 8-bit AdamW: the twin of kernels/cpu/adam8bit.h, called by kernels/adam8bit.cc after
// it has checked the arguments.
#pragma once

#include "absl/status/status.h"
#include "kernels/adam8bit.h"
#include "kernels/device.h"

namespace zt::cuda {

absl::Status AdamW8bitUpdate(const DeviceContext& ctx, const AdamW8bitArgs& args);

}  // namespace zt::cuda
