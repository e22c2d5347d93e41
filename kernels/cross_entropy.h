// Fused softmax + cross-entropy over the vocabulary, llm.c-style: one pass computes each
// row's loss and, when asked, overwrites the logits with their gradient in place, so the
// (N, V) probabilities never need a buffer of their own.
// Legend: N rows (B·T), V vocabulary.
#pragma once

#include "absl/status/status.h"
#include "kernels/device.h"
#include "kernels/tensor.h"

namespace zt {

// Targets below 0 are ignored: their loss is 0 and their gradient row is all zeros.
inline constexpr int32_t kIgnoreTarget = -1;

struct CrossEntropyArgs {
  Tensor logits;   // (N, V) f32, bf16 or f16; with write_grad, overwritten by dlogits (in the
                   // logits' dtype, computed in f32 and rounded once)
  Tensor targets;  // (N) i32 in [0, V) or kIgnoreTarget
  Tensor losses;   // (N) f32, written: −log softmax(logits)[target]
  // dlogits = grad_scale · (softmax(logits) − onehot(target)): the caller passes
  // 1 / (valid targets in the global batch) to average the loss over it.
  float grad_scale = 1.0f;
  bool write_grad = false;
};
// Returns InvalidArgument naming the first target ≥ V. On CUDA the targets are on the device
// and are not read back (that would wait for the stream): such a row's loss and gradient are
// NaN instead (kernels/cuda/cross_entropy.h).
absl::Status SoftmaxCrossEntropy(const DeviceContext& ctx, const CrossEntropyArgs& args);

// The mean loss of a batch of rows, added to an accumulator on the device, so a step reads
// its loss back once instead of once per micro-batch:
//   sum += (Σ losses[i] over targets[i] ≥ 0) / (that count) / divisor
// (0 is added when no target is valid). The Σ is in f64, in index order on the CPU (so the
// CPU's value is the one a host loop over the rows gives) and in a fixed tree on CUDA.
struct MeanLossArgs {
  Tensor losses;   // (N) f32, as SoftmaxCrossEntropy wrote them
  Tensor targets;  // (N) i32
  double divisor = 1.0;
  // The f64 accumulator: an 8-byte-aligned f32 tensor of 2 elements holding a double's bits.
  Tensor sum;
};
absl::Status AccumulateMeanLoss(const DeviceContext& ctx, const MeanLossArgs& args);

}  // namespace zt
