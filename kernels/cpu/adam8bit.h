// CPU 8-bit AdamW. Arguments are validated by kernels/adam8bit.cc.
#pragma once

#include "kernels/adam8bit.h"

namespace zt::cpu {

void AdamW8bitUpdate(const DeviceContext& ctx, const AdamW8bitArgs& args);

}  // namespace zt::cpu
