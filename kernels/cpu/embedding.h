// CPU embedding kernels. Arguments are validated by kernels/embedding.cc; token ids are
// checked here, where the data is readable.
#pragma once

#include "absl/status/status.h"
#include "kernels/embedding.h"

namespace zt::cpu {

absl::Status EmbeddingForward(const DeviceContext& ctx, const EmbeddingForwardArgs& args);
absl::Status EmbeddingBackward(const DeviceContext& ctx, const EmbeddingBackwardArgs& args);

}  // namespace zt::cpu
