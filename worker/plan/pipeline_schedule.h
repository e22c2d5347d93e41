// The order in which one pipeline stage runs the forwards and backwards of a step's m
// micro-batches (Narayanan et al. 2021; GPipe, Huang et al. 2019). The memory plan's in-flight
// count of each stage (parallel_plan.h, PipelineChunk::in_flight) is the most micro-batches
// this order has between a forward and its backward, so the stage keeps micro-batch k's
// activations in slot k mod in_flight.
//
//   GPIPE        every forward, then every backward, in micro-batch order; the last stage
//                runs each backward right after its forward (the head's gradient scratch
//                holds one micro-batch; the arithmetic is the same).
//   ONE_F_ONE_B  warmup: min(p − rank − 1, m) forwards; steady state: a forward then a
//                backward until the forwards run out; cooldown: the remaining backwards.
//
// Pure functions; thread-safe.
#pragma once

#include <vector>

#include "proto/job.pb.h"

namespace zt {

struct PipelineOp {
  bool forward = true;
  int micro_batch = 0;
  bool operator==(const PipelineOp&) const = default;
};

// Stage `rank` of `stages` under `schedule` (GPIPE or ONE_F_ONE_B), m micro-batches: every
// micro-batch's forward once and then its backward once.
std::vector<PipelineOp> PipelineStageOps(zerotrain::ParallelConfig::PipelineSchedule schedule,
                                         int stages, int rank, int micro_batches);

// The most micro-batches `ops` holds between a forward and its backward.
int MaxInFlight(const std::vector<PipelineOp>& ops);

}  // namespace zt
