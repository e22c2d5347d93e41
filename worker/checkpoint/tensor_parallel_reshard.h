// Resuming a checkpoint at another tensor-parallel layout (issue 18): the saved ranks' files
// hold tensor-parallel shares (worker/model/tensor_parallel_slice.h) of each unit, each share
// split by ZeRO inside its data-parallel group. Each buffer of the resuming rank is rebuilt
// element by element: every saved rank's range is placed into the whole unit, and the rank's
// own share and range taken out of it. One role at a time per unit is held whole on the host
// (set-up, not the step loop).
#pragma once

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "proto/job.pb.h"
#include "worker/plan/arena.h"
#include "worker/plan/memory_plan.h"

namespace zt {

// Fills rank `rank` of `job`'s checkpointed buffers (those of its `plan`, in `into`) from the
// checkpoint `saved` wrote (its world_size, tensor_parallel, zero_stage, shard_group_size
// set; pipeline_parallel 1), whose rank r's file is rank_file(r). Elementwise state only:
// parameters, master weights, AdamW's moments and SGD's momentum, all f32. Unimplemented naming the
// buffer for any other (8-bit Adam's blocks, Adafactor's factored statistics, 16-bit weights);
// FailedPrecondition naming the file when a saved buffer is missing or shorter than its
// layout says.
absl::Status ReshardTensorParallelState(const zerotrain::JobSpec& saved,
                                        const std::function<std::string(int)>& rank_file,
                                        const zerotrain::JobSpec& job, int rank,
                                        const MemoryPlan& plan, const Arenas& into,
                                        bool weights_only);

// The whole unit `unit`'s `role` values ("params" or "master": the f32 weights) as the
// checkpoint `saved` wrote them at its tensor- and pipeline-parallel layout (its
// tensor_parallel, pipeline_parallel, pipeline_schedule and virtual_stages set), joined from
// every saved rank's range of its share (the ranks of the unit's stage) into out[0, the whole
// unit's numel): what `zt export` and model.init_from read from such a checkpoint, a unit at a
// time. Unimplemented for a saved buffer that is not f32; FailedPrecondition naming the file
// when a saved buffer is missing or shorter than its layout says; DataLoss when no saved rank
// holds the unit.
absl::Status ReadWholeUnitFromShares(
    const zerotrain::JobSpec& saved, const std::function<std::string(int)>& rank_file, int unit,
    const std::string& role, float* out);

// The whole block `unit`'s adapters ("<block>.lora", its lora_numel values in the one-rank
// order) as the LoRA checkpoint `saved` wrote them at its tensor- and pipeline-parallel layout:
// each saved rank's share (LoraSliceOf) placed where one rank holds it, into out. What `zt
// export` reads from such a checkpoint. FailedPrecondition naming the file when a saved share
// is missing or not f32; DataLoss when no saved rank holds the block.
absl::Status ReadWholeAdaptersFromShares(const zerotrain::JobSpec& saved,
                                         const std::function<std::string(int)>& rank_file, int unit,
                                         float* out);

}  // namespace zt
