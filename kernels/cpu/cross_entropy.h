// CPU fused softmax cross-entropy. Arguments are validated by kernels/cross_entropy.cc;
// targets are checked here, where the data is readable.
#pragma once

#include "absl/status/status.h"
#include "kernels/cross_entropy.h"

namespace zt::cpu {

absl::Status SoftmaxCrossEntropy(const DeviceContext& ctx, const CrossEntropyArgs& args);
void AccumulateMeanLoss(const MeanLossArgs& args);

}  // namespace zt::cpu
