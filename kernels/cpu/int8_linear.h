// CPU LLM.int8() linear layer (kernels/int8_linear.h). Internal to kernels/: the entry points
// in kernels/int8_linear.cc have checked the arguments and the workspace.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/int8_linear.h"

namespace zt::cpu {

struct Int8LinearDims {
  int64_t m = 0;
  int64_t k = 0;
  int64_t n = 0;
};

absl::Status Int8QuantizeWeight(const DeviceContext& ctx, const Int8QuantizeWeightArgs& args);
void Int8DequantizeWeight(const DeviceContext& ctx, const Int8DequantizeWeightArgs& args);
void Int8LinearForward(const DeviceContext& ctx, const Int8LinearDims& dims,
                       const Int8LinearForwardArgs& args);
void Int8LinearBackward(const DeviceContext& ctx, const Int8LinearDims& dims,
                        const Int8LinearBackwardArgs& args);

}  // namespace zt::cpu
