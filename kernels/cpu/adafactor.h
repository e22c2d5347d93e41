// CPU Adafactor. Arguments are validated by kernels/adafactor.cc.
#pragma once

#include "kernels/adafactor.h"

namespace zt::cpu {

void AdafactorUpdate(const DeviceContext& ctx, const AdafactorArgs& args);

}  // namespace zt::cpu
