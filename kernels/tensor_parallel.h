// The local ops of a tensor-parallel rank (Megatron-LM, Shoeybi et al. 2019) that run between
// its collectives: the vocabulary-parallel embedding, the three passes of the
// vocabulary-parallel cross-entropy, and the bias of a row-parallel linear, added once after
// its all-reduce. The collectives themselves are the caller's (worker/model/transformer.cc).
// Legend: B batch, T sequence, C channels, N rows (B·T), P tensor-parallel ranks, Vl the rows
// of the vocabulary this rank holds (⌈V/P⌉), v0 the first of them, valid ≤ Vl the ones that
// are real (the last rank's shard may end in padding rows).
// Accumulation rule: dwte and dwpe are added to (+=); everything else is written (=).
// Storage: the data (wte, wpe, out, dout, dwte, dwpe, logits, AddRowBias's out and bias) may
// each be f32, bf16 or f16, loaded to f32, computed in f32 and rounded once when stored (as
// the whole-model embedding and cross-entropy); the row statistics (max, maxes, sums, losses)
// are f32, so the collectives between the passes reduce them in f32.
// CPU and CUDA (kernels/cuda/tensor_parallel.h: token ids, positions and targets are device
// data there, not read back; a negative token poisons its output row instead of failing).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/device.h"
#include "kernels/tensor.h"

namespace zt {

struct VocabShardEmbeddingForwardArgs {
  Tensor tokens;            // (B, T) i32 in [0, V)
  Tensor wte;               // (Vl, C): vocabulary rows [v0, v0 + Vl); Vl may be 0
  Tensor wpe;               // (Pl, C): position rows [p0, p0 + Pl), or empty
  int64_t vocab_begin = 0;  // v0
  // p0. Tensor parallelism gives one rank the whole table (p0 = 0, Pl ≥ T); a ZeRO-3 shard
  // group split by vocabulary rows (worker/model/transformer_vocab_shard.cc) gives each rank
  // the position rows it owns, perhaps none.
  int64_t position_begin = 0;
  Tensor positions;  // (B, T) i32, each token's position (packed documents); empty: t
  Tensor out;        // (B, T, C) = [token owned] · wte[token − v0] + [position owned] · wpe[..]
};
// The all-reduce over the tensor-parallel group that follows sums the ranks' rows: each token
// and each position is owned by exactly one rank, so the sum is the whole table's lookup,
// exactly (a row owned nowhere here adds 0).
absl::Status VocabShardEmbeddingForward(const DeviceContext& ctx,
                                        const VocabShardEmbeddingForwardArgs& args);

struct VocabShardEmbeddingBackwardArgs {
  Tensor tokens;  // (B, T) i32
  Tensor dout;    // (B, T, C), the same on every rank of the group
  Tensor dwte;    // (Vl, C) +=, rows of the tokens this rank owns only
  Tensor dwpe;    // (Pl, C) += position rows [position_begin, position_begin + Pl), or empty
  int64_t vocab_begin = 0;
  int64_t position_begin = 0;
  Tensor positions;  // (B, T) i32 or empty (t), as the forward's
};
// Deterministic: each row of dwte and dwpe sums its (token, position) rows in row order.
// Scratch comes from ctx.workspace: FailedPrecondition (naming both sizes) when it holds fewer
// bytes than VocabShardEmbeddingWorkspaceBytes says.
absl::Status VocabShardEmbeddingBackward(const DeviceContext& ctx,
                                         const VocabShardEmbeddingBackwardArgs& args);

// Scratch bytes VocabShardEmbeddingBackward needs on a device of this kind for `positions` =
// B·T tokens and a shard of `vocab_rows` = Vl rows: 0 on the CPU; on CUDA the counting sort of
// the whole-table backward (EmbeddingWorkspaceBytes(kind, B·T, Vl), kernels/embedding.h), no
// more than the whole table's.
int64_t VocabShardEmbeddingWorkspaceBytes(DeviceKind kind, int64_t positions, int64_t vocab_rows);

// Pass 1 of the parallel cross-entropy: each row's maximum over this rank's `valid` columns.
// The caller all-gathers the P maxima of every row.
struct VocabShardRowMaxArgs {
  Tensor logits;  // (N, Vl)
  int64_t valid = 0;
  Tensor max;  // (N) written
};
absl::Status VocabShardRowMax(const DeviceContext& ctx, const VocabShardRowMaxArgs& args);

// Pass 2: with M the row's maximum over all P ranks (`maxes`, the gathered pass 1),
// sums[r] = (Σ_{valid columns} exp(logit − M), the target's logit when this rank owns the
// target, else 0). The caller all-reduces (sums) over the group: then every rank holds the
// whole row's Σexp and target logit. Ignored targets (< 0) give (0, 0).
struct VocabShardExpSumArgs {
  Tensor logits;  // (N, Vl)
  int64_t valid = 0;
  Tensor maxes;    // (P, N): each rank's row maxima
  Tensor targets;  // (N) i32, global vocabulary ids in [0, V) or negative (ignored)
  int64_t vocab_begin = 0;
  Tensor sums;  // (N, 2) written
};
absl::Status VocabShardExpSum(const DeviceContext& ctx, const VocabShardExpSumArgs& args);

// Pass 3: losses[r] = M + log Σexp − logit[target] (0 for ignored targets), the same on every
// rank; with write_grad the logits become grad_scale · (softmax − onehot) on this rank's
// columns (0 on padding columns and ignored rows), in place.
struct VocabShardCrossEntropyArgs {
  Tensor logits;  // (N, Vl)
  int64_t valid = 0;
  Tensor maxes;    // (P, N)
  Tensor sums;     // (N, 2), all-reduced
  Tensor targets;  // (N) i32
  int64_t vocab_begin = 0;
  Tensor losses;  // (N) f32 written
  float grad_scale = 1.0f;
  bool write_grad = false;
};
absl::Status VocabShardCrossEntropy(const DeviceContext& ctx,
                                    const VocabShardCrossEntropyArgs& args);

// out[r, :] += bias: a row-parallel linear's bias, added once to the all-reduced output.
struct AddRowBiasArgs {
  Tensor out;   // (N, C)
  Tensor bias;  // (C)
};
absl::Status AddRowBias(const DeviceContext& ctx, const AddRowBiasArgs& args);

}  // namespace zt
