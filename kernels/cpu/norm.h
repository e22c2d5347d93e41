// CPU LayerNorm and RMSNorm. Arguments are validated by kernels/norm.cc.
#pragma once

#include "kernels/norm.h"

namespace zt::cpu {

void LayerNormForward(const DeviceContext& ctx, const LayerNormForwardArgs& args);
void LayerNormBackward(const DeviceContext& ctx, const LayerNormBackwardArgs& args);
void RmsNormForward(const DeviceContext& ctx, const RmsNormForwardArgs& args);
void RmsNormBackward(const DeviceContext& ctx, const RmsNormBackwardArgs& args);

}  // namespace zt::cpu
