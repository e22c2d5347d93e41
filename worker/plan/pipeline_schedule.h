// The order in which one pipeline stage runs the forwards and backwards of a step's m
// micro-batches (Narayanan et al. 2021; GPipe, Huang et al. 2019). The memory plan's in-flight
// count of each of a stage's chunks (parallel_plan.h, PipelineChunk::in_flight) is the most
// micro-batches this order has between a forward and its backward in that chunk, so the chunk
// keeps micro-batch k's activations in slot k mod in_flight (a chunk's forwards and its
// backwards each run in micro-batch order, so the ones in flight are consecutive).
//
//   GPIPE        every forward, then every backward, in micro-batch order; the last stage
//                runs each backward right after its forward (the head's gradient scratch
//                holds one micro-batch; the arithmetic is the same).
//   ONE_F_ONE_B  warmup: min(p − rank − 1, m) forwards; steady state: a forward then a
//                backward until the forwards run out; cooldown: the remaining backwards.
//   INTERLEAVED  Megatron-LM's interleaved 1F1B (Narayanan et al. 2021, section 2.2): the
//                stage holds v chunks (rank r: model chunks r, r + p, …, local chunk c is model
//                chunk c·p + r) and runs m·v chunk-forwards and as many chunk-backwards. The
//                i-th forward is of local chunk (i mod p·v) / p and micro-batch
//                (i / (p·v))·p + i mod p (groups of p micro-batches go through every chunk in
//                turn); the i-th backward the same with the chunk reversed (v − 1 − that).
//                Warmup: min(2·(p − rank − 1) + (v − 1)·p, m·v) forwards; steady state: a
//                forward then a backward; cooldown: the remaining backwards. Needs m a
//                multiple of p (validation's rule): the last stage then runs each head-chunk
//                backward right after its forward, as the head's scratch needs.
//
// Pure functions; thread-safe.
#pragma once

#include <vector>

#include "proto/job.pb.h"

namespace zt {

struct PipelineOp {
  bool forward = true;
  int micro_batch = 0;
  int chunk = 0;  // the stage's local chunk (0 unless INTERLEAVED)
  bool operator==(const PipelineOp&) const = default;
};

// Stage `rank` of `stages` under `schedule`, m micro-batches, `virtual_stages` chunks per
// stage (INTERLEAVED only; 1 otherwise): every (chunk, micro-batch)'s forward once and then its
// backward once.
std::vector<PipelineOp> PipelineStageOps(zerotrain::ParallelConfig::PipelineSchedule schedule,
                                         int stages, int rank, int micro_batches,
                                         int virtual_stages = 1);

// The most micro-batches `ops` holds in chunk `chunk` between a forward and its backward.
int MaxInFlight(const std::vector<PipelineOp>& ops, int chunk = 0);

// The model chunk (0 … stages·v − 1, in model order) that local chunk `chunk` of stage `rank`
// is.
inline int ModelChunk(int stages, int rank, int chunk) { return chunk * stages + rank; }

}  // namespace zt
