// The pipeline bubble of a schedule in the unit-time model (Narayanan et al. 2021, section
// 2.2): every chunk-forward and chunk-backward takes one time step, transfers take none, and
// each stage runs PipelineStageOps' order, an op starting at the first step where its inputs
// exist — a forward once the previous model chunk's forward of its micro-batch is done, a
// backward once its own forward and the next model chunk's backward are. The bubble is the
// share of stages × makespan in which a stage is idle. For GPipe and 1F1B it is
// (p − 1)/(m + p − 1), for the interleaved schedule (p − 1)/(v·m + p − 1) (a chunk-op takes
// 1/v of a stage-op, so its time is counted in chunk-ops); tests check both exactly.
//
// The trainer's measured bubble (StepRecord::pipeline_bubble) is the same fraction with the
// real forward and backward times.
//
// Pure function; thread-safe.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "proto/job.pb.h"

namespace zt {

struct PipelineSimulation {
  int64_t makespan = 0;  // time steps until the last stage's last op ends
  int64_t busy = 0;      // ops run, over all stages (2·m·v per stage)
  double bubble = 0;     // 1 − busy / (stages · makespan)
};

// Runs every stage's ops of `schedule` (p stages, m micro-batches, v chunks per stage for
// INTERLEAVED) in the unit-time model. An error names the stage and op that can never start
// (a schedule that would deadlock) or an op that runs twice or never.
absl::StatusOr<PipelineSimulation> SimulatePipeline(
    zerotrain::ParallelConfig::PipelineSchedule schedule, int stages, int micro_batches,
    int virtual_stages = 1);

}  // namespace zt
