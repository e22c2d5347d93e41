// CPU optimizer updates. Arguments are validated by kernels/optimizer.cc.
#pragma once

#include "kernels/optimizer.h"

namespace zt::cpu {

void AdamWUpdate(const DeviceContext& ctx, const AdamWArgs& args);
void SgdUpdate(const DeviceContext& ctx, const SgdArgs& args);

}  // namespace zt::cpu
