// CUDA tensor-parallel local ops: the twins of kernels/cpu/tensor_parallel.h, called by
// kernels/tensor_parallel.cc after it has checked the arguments (and the backward's
// workspace).
//
// Token ids, positions and targets live on the device, so they cannot be reported as errors
// without waiting for the stream. A negative token (the CPU op's InvalidArgument) gives a NaN
// output row on every rank, so the group's sum is NaN (the loss turns NaN, which the step loop
// and the loss scaler see); the backward adds nothing for it. A token or position that no rank
// owns adds 0 as on the CPU; the backward's packed positions must lie in [0, T) (the embedding's
// contract): one outside adds nothing.
#pragma once

#include "absl/status/status.h"
#include "kernels/device.h"
#include "kernels/tensor_parallel.h"

namespace zt::cuda {

absl::Status VocabShardEmbeddingForward(const DeviceContext& ctx,
                                        const VocabShardEmbeddingForwardArgs& args);
absl::Status VocabShardEmbeddingBackward(const DeviceContext& ctx,
                                         const VocabShardEmbeddingBackwardArgs& args);
absl::Status VocabShardRowMax(const DeviceContext& ctx, const VocabShardRowMaxArgs& args);
absl::Status VocabShardExpSum(const DeviceContext& ctx, const VocabShardExpSumArgs& args);
absl::Status VocabShardCrossEntropy(const DeviceContext& ctx,
                                    const VocabShardCrossEntropyArgs& args);
absl::Status AddRowBias(const DeviceContext& ctx, const AddRowBiasArgs& args);

}  // namespace zt::cuda
