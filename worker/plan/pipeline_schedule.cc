#include "worker/plan/pipeline_schedule.h"

#include <algorithm>

namespace zt {
namespace {

// Megatron's interleaved order: the i-th forward (or backward) of stage-local work.
PipelineOp InterleavedOp(int stages, int v, int64_t i, bool forward) {
  const int64_t group = int64_t{stages} * v;
  const int64_t within = i % group;
  int chunk = static_cast<int>(within / stages);
  if (!forward) chunk = v - 1 - chunk;
  const int micro = static_cast<int>((i / group) * stages + within % stages);
  return {.forward = forward, .micro_batch = micro, .chunk = chunk};
}

}  // namespace

std::vector<PipelineOp> PipelineStageOps(zerotrain::ParallelConfig::PipelineSchedule schedule,
                                         int stages, int rank, int micro_batches,
                                         int virtual_stages) {
  const int m = micro_batches;
  std::vector<PipelineOp> ops;
  const bool last = rank == stages - 1;
  if (schedule == zerotrain::ParallelConfig::GPIPE) {
    for (int k = 0; k < m; ++k) {
      ops.push_back({.forward = true, .micro_batch = k});
      if (last) ops.push_back({.forward = false, .micro_batch = k});
    }
    if (!last) {
      for (int k = 0; k < m; ++k) ops.push_back({.forward = false, .micro_batch = k});
    }
    return ops;
  }
  if (schedule == zerotrain::ParallelConfig::INTERLEAVED) {
    const int v = std::max(1, virtual_stages);
    const int64_t total = int64_t{m} * v;
    const int64_t warmup =
        std::min<int64_t>(2 * int64_t{stages - rank - 1} + int64_t{v - 1} * stages, total);
    int64_t next_forward = 0, next_backward = 0;
    for (; next_forward < warmup; ++next_forward) {
      ops.push_back(InterleavedOp(stages, v, next_forward, true));
    }
    for (; next_forward < total; ++next_forward, ++next_backward) {
      ops.push_back(InterleavedOp(stages, v, next_forward, true));
      ops.push_back(InterleavedOp(stages, v, next_backward, false));
    }
    for (; next_backward < total; ++next_backward) {
      ops.push_back(InterleavedOp(stages, v, next_backward, false));
    }
    return ops;
  }
  const int warmup = std::min(stages - rank - 1, m);
  int next_forward = 0, next_backward = 0;
  for (; next_forward < warmup; ++next_forward) {
    ops.push_back({.forward = true, .micro_batch = next_forward});
  }
  for (; next_forward < m; ++next_forward, ++next_backward) {
    ops.push_back({.forward = true, .micro_batch = next_forward});
    ops.push_back({.forward = false, .micro_batch = next_backward});
  }
  for (; next_backward < m; ++next_backward) {
    ops.push_back({.forward = false, .micro_batch = next_backward});
  }
  return ops;
}

int MaxInFlight(const std::vector<PipelineOp>& ops, int chunk) {
  int now = 0, most = 0;
  for (const PipelineOp& op : ops) {
    if (op.chunk != chunk) continue;
    now += op.forward ? 1 : -1;
    most = std::max(most, now);
  }
  return most;
}

}  // namespace zt
