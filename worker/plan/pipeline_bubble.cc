#include "worker/plan/pipeline_bubble.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/plan/pipeline_schedule.h"

namespace zt {

absl::StatusOr<PipelineSimulation> SimulatePipeline(
    zerotrain::ParallelConfig::PipelineSchedule schedule, int stages, int micro_batches,
    int virtual_stages) {
  const int p = stages, m = micro_batches;
  const int v = schedule == zerotrain::ParallelConfig::INTERLEAVED ? std::max(1, virtual_stages)
                                                                   : 1;
  const int model_chunks = p * v;
  std::vector<std::vector<PipelineOp>> ops(p);
  for (int r = 0; r < p; ++r) ops[r] = PipelineStageOps(schedule, p, r, m, v);
  // The time step at whose end each (model chunk, micro-batch)'s forward / backward is done;
  // -1: not yet.
  auto index = [&](int chunk, int k) { return static_cast<size_t>(chunk) * m + k; };
  std::vector<int64_t> forward_done(static_cast<size_t>(model_chunks) * m, -1);
  std::vector<int64_t> backward_done(forward_done.size(), -1);
  std::vector<size_t> next(p, 0);
  PipelineSimulation sim;
  size_t left = 0;
  for (const auto& o : ops) left += o.size();
  for (int64_t t = 0; left > 0; ++t) {
    // Inputs must be done by an earlier step: decide every stage's op, then record them.
    std::vector<std::pair<int, PipelineOp>> ran;
    for (int r = 0; r < p; ++r) {
      if (next[r] == ops[r].size()) continue;
      const PipelineOp& op = ops[r][next[r]];
      const int chunk = ModelChunk(p, r, op.chunk);
      const size_t i = index(chunk, op.micro_batch);
      auto done_before = [&](const std::vector<int64_t>& done, size_t j) {
        return done[j] >= 0 && done[j] < t;
      };
      bool ready;
      if (op.forward) {
        ready = chunk == 0 || done_before(forward_done, index(chunk - 1, op.micro_batch));
      } else {
        ready = done_before(forward_done, i) &&
                (chunk == model_chunks - 1 ||
                 done_before(backward_done, index(chunk + 1, op.micro_batch)));
      }
      if (ready) ran.push_back({r, op});
    }
    if (ran.empty()) {
      for (int r = 0; r < p; ++r) {
        if (next[r] == ops[r].size()) continue;
        const PipelineOp& op = ops[r][next[r]];
        return absl::InternalError(absl::StrCat(
            "pipeline schedule deadlocks: stage ", r, " waits forever on chunk ", op.chunk,
            " micro-batch ", op.micro_batch, op.forward ? " forward" : " backward"));
      }
    }
    for (const auto& [r, op] : ran) {
      const size_t i = index(ModelChunk(p, r, op.chunk), op.micro_batch);
      std::vector<int64_t>& done = op.forward ? forward_done : backward_done;
      if (done[i] >= 0) {
        return absl::InternalError(absl::StrCat("pipeline schedule: stage ", r, " runs chunk ",
                                                op.chunk, " micro-batch ", op.micro_batch,
                                                op.forward ? " forward" : " backward", " twice"));
      }
      done[i] = t;
      ++next[r];
      --left;
      ++sim.busy;
      sim.makespan = t + 1;
    }
  }
  for (size_t i = 0; i < forward_done.size(); ++i) {
    if (forward_done[i] < 0 || backward_done[i] < 0) {
      return absl::InternalError(absl::StrCat("pipeline schedule: model chunk ", i / m,
                                              " micro-batch ", i % m, " never runs its ",
                                              forward_done[i] < 0 ? "forward" : "backward"));
    }
  }
  sim.bubble = 1.0 - static_cast<double>(sim.busy) / (static_cast<double>(p) * sim.makespan);
  return sim;
}

}  // namespace zt
