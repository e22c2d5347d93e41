// The whole model's weights on every stage of a pipeline (`zt train --export` of a pipelined
// job, Trainer::FullWeights): each stage holds its own units only (the plan's partition,
// PipelineChunksOf), so each unit is broadcast over the pipeline group from the stage holding
// it. A head stage's copy of a tied wte is not the model's: the embedding's wte is.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "proto/job.pb.h"
#include "worker/comm/communicator.h"
#include "worker/model/param_layout.h"
#include "worker/train/rank_device.h"

namespace zt {

// Which pipeline stage holds each of the whole model's units (BuildModelLayout's), for a job
// with pipeline_parallel > 1: the plan's chunks of every stage.
std::vector<int> StageOfEachUnit(const zerotrain::JobSpec& job);

// What of each unit JoinPipelineStages joins: its parameters (UnitLayout::numel values) or its
// LoRA adapters (lora_numel; units without adapters are skipped and come back empty).
enum class UnitValues { kParams, kAdapters };

// `units` holds, on entry, the rank's stage's units at the whole model's layout (unit k is the
// whole model's unit held[k], each tensor whole and in its place); on return every unit of
// `whole`, the same on every stage. `pipeline` is the rank's pipeline group (member s is stage
// s), `stage` the rank's place in it. A collective over the pipeline group. `device`: the
// rank's device when the host cannot address its memory (a GPU, whose communicators take
// device buffers): each unit then crosses through device scratch outside the plan (export is
// not the step loop); null, the units are broadcast from where they are.
absl::Status JoinPipelineStages(Communicator& pipeline, int stage, const ModelLayout& whole,
                                const std::vector<int>& stage_of_unit, const std::vector<int>& held,
                                std::vector<std::vector<float>>& units,
                                RankDevice* device = nullptr,
                                UnitValues values = UnitValues::kParams);

}  // namespace zt
