// The activation and workspace tables: every buffer the forward saves for the backward, and
// the scratch the step reuses, as named specs (see worker/plan/memory_plan.h for the naming).
// The plan sums them; the model looks its tensors up by the same names.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/device.h"
#include "kernels/linear.h"
#include "proto/job.pb.h"
#include "worker/plan/memory_plan.h"

namespace zt {

// Rows of logits a training step holds at once: the loss is computed chunk by chunk so that
// B·T·V logits (4 GB at B·T 8192 with a 128K vocabulary) never exist together.
inline constexpr int64_t kLossChunkRows = 256;
inline int64_t LossChunkRows(int64_t rows) { return rows < kLossChunkRows ? rows : kLossChunkRows; }
// A vocabulary-sharded head (worker/model/transformer_vocab_shard.cc) computes the loss of its
// shard group's `group_rows` = G·B·T rows over its own vocabulary columns: as many rows a
// pass as the planned logits chunk (`logits_numel` = LossChunkRows(B·T) · V elements) holds at
// the group's widest width (`widest` columns), the same on every rank, so that the passes'
// collectives pair up.
inline int64_t VocabShardChunkRows(int64_t logits_numel, int64_t group_rows, int64_t widest) {
  const int64_t rows = logits_numel / (widest > 0 ? widest : 1);
  return rows < 1 ? 1 : rows > group_rows ? group_rows : rows;
}

// Activations of a forward over `batch` sequences of `seq_len` tokens under the activation
// checkpointing policy of `memory`: NONE keeps every block's tensors ("block.i.*"); FULL keeps
// only the residual stream and gives every block one shared "recompute.*" set; EVERY_K does
// that for blocks 0, k, 2k, …; SELECTIVE keeps each block's GEMM and norm inputs but shares
// the attention output and MLP activation ("recompute.atty", "recompute.att_lse",
// "recompute.fch_act"). The model reads the policy back from these names (transformer.h).
// Tensors are stored in `compute` (the job's compute_dtype); per-row statistics (norm
// mean/rstd, attention log-sum-exp, losses) stay f32.
std::vector<BufferSpec> ActivationTable(const zerotrain::ModelConfig& m,
                                        const zerotrain::MemoryConfig& memory, int64_t batch,
                                        int64_t seq_len, DType compute = DType::kF32);

// Workspace of a micro-batch: token ids, targets, logits, and "gemm_workspace" (u8, the
// GEMM scratch of `ctx`, see GemmWorkspaceBytesFor). With `backward`, also the gradient
// scratch the backward reuses from unit to unit.
// Logits and gradient scratch are in `compute`; the GEMM scratch is sized for activations in
// `compute`, weights in `param` and weight gradients in `grad`.
std::vector<BufferSpec> WorkspaceTable(const zerotrain::ModelConfig& m, int64_t batch,
                                       int64_t seq_len, bool backward, const DeviceContext& ctx,
                                       DType compute = DType::kF32, DType param = DType::kF32,
                                       DType grad = DType::kF32);

// The most scratch (bytes) any GEMM of the model's linear layers — qkv, attn.proj, mlp.fc,
// mlp.proj, lm_head, forward and backward — needs on `ctx` (its GEMM backend and thread count)
// for `batch` sequences of `seq_len` tokens. 0 for OpenBLAS, which needs none, so a plan made
// for oneDNN also fits a context switched to OpenBLAS. If the backend cannot size a GEMM (it
// refuses to create it), that layer counts 0: the GEMM itself then fails with the backend's
// error at its first call, where the step loop reports it.
// The output projection runs on `logits_rows` rows at a time (0: all B·T).
int64_t GemmWorkspaceBytesFor(const zerotrain::ModelConfig& m, int64_t batch, int64_t seq_len,
                              const DeviceContext& ctx, const LinearDTypes& dtypes = {},
                              int64_t logits_rows = 0);

}  // namespace zt
