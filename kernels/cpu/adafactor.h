// CPU Adafactor. Arguments are validated by kernels/adafactor.cc.
#pragma once

#include "absl/status/status.h"
#include "kernels/adafactor.h"

namespace zt::cpu {

// Fails only with an error of args.shard->sum_across_shards (sharded updates).
absl::Status AdafactorUpdate(const DeviceContext& ctx, const AdafactorArgs& args);

}  // namespace zt::cpu
