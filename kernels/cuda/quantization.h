// CUDA block-wise quantization: the twins of kernels/cpu/quantization.h, called by
// kernels/quantization.cc after it has checked the arguments.
#pragma once

#include "absl/status/status.h"
#include "kernels/device.h"
#include "kernels/quantization.h"

namespace zt::cuda {

absl::Status BlockQuantize(const DeviceContext& ctx, const BlockQuantizeArgs& args);
absl::Status BlockDequantize(const DeviceContext& ctx, const BlockDequantizeArgs& args);

}  // namespace zt::cuda
