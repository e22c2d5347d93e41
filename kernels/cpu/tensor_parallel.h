// CPU kernels of kernels/tensor_parallel.h. Arguments are validated by
// kernels/tensor_parallel.cc; token ids and targets are checked here, where they are readable.
#pragma once

#include "absl/status/status.h"
#include "kernels/tensor_parallel.h"

namespace zt::cpu {

absl::Status VocabShardEmbeddingForward(const DeviceContext& ctx,
                                        const VocabShardEmbeddingForwardArgs& args);
absl::Status VocabShardEmbeddingBackward(const DeviceContext& ctx,
                                         const VocabShardEmbeddingBackwardArgs& args);
absl::Status VocabShardRowMax(const DeviceContext& ctx, const VocabShardRowMaxArgs& args);
absl::Status VocabShardExpSum(const DeviceContext& ctx, const VocabShardExpSumArgs& args);
absl::Status VocabShardCrossEntropy(const DeviceContext& ctx,
                                    const VocabShardCrossEntropyArgs& args);
absl::Status AddRowBias(const DeviceContext& ctx, const AddRowBiasArgs& args);

}  // namespace zt::cpu
