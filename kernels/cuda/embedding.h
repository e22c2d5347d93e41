// CUDA token and position embedding: the twin of kernels/cpu/embedding.h, called by
// EmbeddingForward and EmbeddingBackward (kernels/embedding.cc) after they have checked the
// arguments and the workspace.
//
// The tokens live on the device, so a token outside [0, V) cannot be reported as an error
// without waiting for the stream: the forward writes a NaN output row for it (the loss turns
// NaN, which the step loop and the loss scaler see) and the backward adds nothing for it. A
// packed position outside [0, T) is treated the same way.
#pragma once

#include "absl/status/status.h"
#include "kernels/device.h"
#include "kernels/embedding.h"

namespace zt::cuda {

absl::Status EmbeddingForward(const DeviceContext& ctx, const EmbeddingForwardArgs& args);
absl::Status EmbeddingBackward(const DeviceContext& ctx, const EmbeddingBackwardArgs& args);

}  // namespace zt::cuda
