// Resuming the optimizer states that are not one value per element — 8-bit AdamW's block-wise
// quantized moments and Adafactor's factored second moments — at another tensor- or
// pipeline-parallel layout (issue 18). The checkpoint reader's element-by-element resharding
// (worker/checkpoint/tensor_parallel_reshard.h) places f32 states; these need each tensor's
// logical (one-rank) state first:
//
//   8-bit AdamW: a TP share's tensor is another tensor than the whole one (its rows or its
//     columns), and blocks start at each rank's range's first element of it, so no saved block
//     lines up with a new one. Every saved block is dequantized (BlockDequantize) into the
//     whole tensor's f32 m and v, and the resuming rank's share quantized again on its own
//     blocks (BlockQuantize; m on the signed map, v on the unsigned). A tensor under
//     min_quantized_numel (decided on the share's size) keeps f32 moments on that side: both
//     kinds cross. Lossy by one quantization step per value, as the ZeRO resharding's
//     Requantize (worker/checkpoint/optimizer_state_reshard.h) is for a block that does not line up.
//   Adafactor: a TP share's factored statistics are the logical matrix's already
//     (AdafactorArgs::Shard::logical_rows/logical_cols, worker/optim/adafactor_splits.h): in the
//     kernel's layout (rows = outputs) a share split by rows holds its rows' R and the whole
//     matrix's C (summed over the TP group), a share split by columns the whole R and its
//     columns' C, a replicated tensor both whole. So the logical R and C are joined exactly
//     (each row's R from a share that holds the row, each column's C from one that holds the
//     column) and the new share's sliced from them, bit for bit; the first moment and a
//     vector's full second moment are one value per element. A vocabulary-padding row (a
//     share's rows past V) has no logical row: it starts at eps1, the statistic of a row whose
//     gradient is zero from the first step (β2 is 0 at step 1).
//
// Both for a whole-model unit's own parameters (a full model's states) and for a LoRA block's
// adapters (LoraAdapterLayout's unit, each site's A then B split by LoraSliceOf). A pipeline
// head stage's copy of a tied wte ("lm_head.weight" where the whole head has none) gets the
// embedding's wte state, as its f32 state does. Set-up only: one unit's logical state at a
// time is held on the host.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "proto/job.pb.h"
#include "worker/checkpoint/safetensors.h"
#include "worker/model/param_layout.h"
#include "worker/plan/arena.h"

namespace zt {

// Whether `role` (a unit's buffer name after "<unit>." or "<block>.lora.") is a state buffer
// LogicalOptimizerState fills when `saved` and `job` train with the same optimizer, 8-bit AdamW
// (its codes, absmax and small tensors' f32 moments) or Adafactor (row, column, full, m).
bool IsLogicalOptimizerStateRole(const zerotrain::JobSpec& saved, const zerotrain::JobSpec& job,
                                 const std::string& role);

// The saved ranks' files of one checkpoint (`saved`'s layout: world_size, tensor_parallel,
// pipeline_parallel and its schedule, zero_stage, shard_group_size), read for one resuming rank.
// Not thread-safe: one per loading rank.
class LogicalOptimizerState {
 public:
  LogicalOptimizerState(const zerotrain::JobSpec& saved,
                        const std::vector<std::unique_ptr<SafetensorsFile>>& files,
                        const std::function<std::string(int)>& rank_file)
      : saved_(saved), files_(files), rank_file_(rank_file) {}

  // Fills rank `rank` of `job`'s optimizer state buffers of the whole model's unit `unit` (its
  // adapters' "<block>.lora.<state>" when `adapters`, else "<unit>.<state>"), each one whose
  // name `wanted` accepts, in `into`. FailedPrecondition naming the file when a saved buffer is
  // missing or not what the saved layout says; DataLoss when the saved ranks do not hold the
  // state of every element (or row and column statistic) of the unit; Internal when `into`'s
  // buffer is not the layout's.
  absl::Status Fill(const zerotrain::JobSpec& job, int rank, const UnitLayout& unit, bool adapters,
                    const std::function<bool(const std::string&)>& wanted, const Arenas& into);

 private:
  struct Logical;
  // The logical state of every tensor of `unit` (or its adapters) from every saved rank's share.
  absl::Status Join(const UnitLayout& unit, bool adapters, std::vector<Logical>* out) const;

  const zerotrain::JobSpec& saved_;
  const std::vector<std::unique_ptr<SafetensorsFile>>& files_;
  const std::function<std::string(int)>& rank_file_;
};

}  // namespace zt
