// CUDA fused softmax cross-entropy: the twin of kernels/cpu/cross_entropy.h, called by
// SoftmaxCrossEntropy (kernels/cross_entropy.cc) after it has checked the arguments.
//
// The targets live on the device, so a target ≥ V cannot be reported as an error without
// waiting for the stream: its row's loss (and, with write_grad, its gradient row) is NaN
// instead, which the step loop's loss check and the loss scaler see.
#pragma once

#include "absl/status/status.h"
#include "kernels/cross_entropy.h"
#include "kernels/device.h"

namespace zt::cuda {

absl::Status SoftmaxCrossEntropy(const DeviceContext& ctx, const CrossEntropyArgs& args);
// One block; the rows' shares summed in f64 in a fixed tree. Nothing waits.
absl::Status AccumulateMeanLoss(const DeviceContext& ctx, const MeanLossArgs& args);

}  // namespace zt::cuda
