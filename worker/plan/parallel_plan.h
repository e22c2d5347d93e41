// The memory plan's view of tensor, sequence and pipeline parallelism: which units a rank of a
// 3D layout holds, how large its share of each tensor is, and which activations it keeps for
// how many micro-batches. PlanMemory (memory_plan.h) builds its tables from these, so with
// tensor_parallel = pipeline_parallel = 1 they are exactly the whole model's tables.
//
// Tensor parallelism (Shoeybi et al. 2019, Megatron-LM), per tensor of a unit:
//   wte, lm_head.weight   vocabulary-parallel: ceil(V / tp) rows
//   attn.qkv.{weight,bias} column-parallel by heads: H/tp query heads, and the KV heads split
//                         when n_kv_head ≥ tp, else the one KV head its query heads read
//                         (replicated on tp / n_kv_head ranks)
//   attn.proj.weight      row-parallel: (C, H·D / tp); its bias is replicated
//   mlp.fc.{weight,bias}  column-parallel: rows / tp; mlp.proj.weight row-parallel (C, F / tp)
//   everything else       replicated (norms, wpe, row-parallel biases, any tensor this file
//                         does not name)
// Activations follow Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
// Transformer Models"), Table 2: the tensors inside attention and the MLP (qkv, the attention
// output and its log-sum-exp, the MLP pre-activation and activation) are divided by tp; the
// norms' inputs/outputs and the residual stream are divided by tp only with
// sequence_parallel (their section 4.2.2).
//
// Pipeline parallelism: the units (embedding, blocks, head) are split into pp · virtual_stages
// contiguous chunks balanced by their cost (the chunk's tensor-parallel parameter count,
// DeepSpeed's "parameters" partition: a block's FLOPs and its model states both grow with
// it); pipeline rank p holds chunks p, p + pp, …. A stage keeps its saved activations for the
// micro-batches its schedule has in flight (Narayanan et al. 2021):
//   GPIPE: every micro-batch, m;  ONE_F_ONE_B: min(pp − p, m);
//   INTERLEAVED: per chunk, the most micro-batches Megatron's interleaved order
//   (pipeline_schedule.h) holds between that chunk's forward and backward. Korthikanti's
//   equation 5 factor pp·(1 + (pp − 1)/(pp·v)) counts only the warmup window; the steady state
//   holds more in the early chunks (rank 0 at pp 2, v 2, m ≥ 4: 4 and 2 micro-batches, not 3
//   and 2), and a smaller plan would overwrite activations still awaiting their backward.
// With tied embeddings split across stages, the head's stage keeps its own copy of wte
// ("lm_head.weight", summed with the first stage's gradient as Megatron does).
//
// Pure functions of the job and the layout; thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/device.h"
#include "kernels/dtype.h"
#include "proto/job.pb.h"
#include "worker/model/param_layout.h"
#include "worker/parallel/parallel_layout.h"
#include "worker/plan/memory_plan.h"

namespace zt {

// A contiguous run of units [first, last) (indices into the whole model's units) that one
// pipeline rank holds, and how many of its micro-batches' activations are in flight at once.
struct PipelineChunk {
  int first = 0;
  int last = 0;
  int in_flight = 1;
};

// `costs` (one per unit) split into `chunks` contiguous non-empty runs whose largest sum is as
// small as it can be; returns each run's first unit and, last, the unit count. Requires
// 1 ≤ chunks ≤ costs.size().
std::vector<int> BalancedPartition(const std::vector<int64_t>& costs, int chunks);

// The whole model's layout with every tensor at its tensor-parallel share (above).
ModelLayout TensorParallelModelLayout(const zerotrain::ModelConfig& model, int tensor_parallel);

// The chunks pipeline rank layout.coordinates().pipeline holds, in model order.
std::vector<PipelineChunk> PipelineChunksOf(const zerotrain::JobSpec& job,
                                            const ParallelLayout& layout);

// The units the rank holds at their tensor-parallel shares (BuildModelLayout's when
// tp = pp = 1). tied_embeddings stays true only where the rank holds both the embedding and
// the head.
ModelLayout RankModelLayout(const zerotrain::JobSpec& job, const ParallelLayout& layout);

// ActivationTable (worker/model/activation_table.h) for the rank: its chunks' buffers only,
// divided as above, each saved buffer's shape led by its chunk's in-flight count when that is
// above 1 (the shared "recompute.*" set is not: the backward recomputes one block at a time).
std::vector<BufferSpec> RankActivationTable(const zerotrain::JobSpec& job,
                                            const ParallelLayout& layout, int64_t batch,
                                            int64_t seq_len, DType compute);

// WorkspaceTable for the rank: logits only on the head's stage (vocabulary-parallel width, and
// with tp > 1 the parallel cross-entropy's "tp.ce_maxes" (tp, rows) and "tp.ce_sums" (rows, 2)),
// the gradient scratch at its tensor-parallel width. "gemm_workspace" stays the whole model's
// (an upper bound: a GEMM of a tensor-parallel share needs no more). With sequence_parallel,
// "grad.residual" is the rank's B·T/tp token rows and "tp.sequence_full" (B·T, C) is the
// engine's one whole-sequence buffer (worker/model/transformer_sequence_parallel.cc).
std::vector<BufferSpec> RankWorkspaceTable(const zerotrain::JobSpec& job,
                                           const ParallelLayout& layout, int64_t batch,
                                           int64_t seq_len, const DeviceContext& ctx, DType compute,
                                           DType param, DType grad);

}  // namespace zt
