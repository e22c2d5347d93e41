#include "worker/plan/pipeline_schedule.h"

#include <algorithm>

namespace zt {

std::vector<PipelineOp> PipelineStageOps(zerotrain::ParallelConfig::PipelineSchedule schedule,
                                         int stages, int rank, int micro_batches) {
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

int MaxInFlight(const std::vector<PipelineOp>& ops) {
  int now = 0, most = 0;
  for (const PipelineOp& op : ops) {
    now += op.forward ? 1 : -1;
    most = std::max(most, now);
  }
  return most;
}

}  // namespace zt
