#include "worker/train/pipeline_full_weights.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/status_macros.h"
#include "worker/parallel/parallel_layout.h"
#include "worker/plan/parallel_plan.h"

namespace zt {

std::vector<int> StageOfEachUnit(const zerotrain::JobSpec& job) {
  const ParallelLayout mine = ParallelLayout::ForJob(job, 0);
  std::vector<int> stage_of(BuildModelLayout(job.model()).units.size(), -1);
  for (int s = 0; s < mine.pipeline_size(); ++s) {
    const ParallelLayout at = ParallelLayout::ForJob(
        job, mine.RankAt({.tensor = 0, .data = 0, .pipeline = s}));
    for (const PipelineChunk& c : PipelineChunksOf(job, at)) {
      for (int u = c.first; u < c.last; ++u) stage_of[u] = s;
    }
  }
  return stage_of;
}

absl::Status JoinPipelineStages(Communicator& pipeline, int stage, const ModelLayout& whole,
                                const std::vector<int>& stage_of_unit, const std::vector<int>& held,
                                std::vector<std::vector<float>>& units, RankDevice* device,
                                UnitValues values) {
  const bool adapters = values == UnitValues::kAdapters;
  const auto size_of = [&](const UnitLayout& u) { return adapters ? u.lora_numel : u.numel; };
  if (held.size() != units.size() || stage_of_unit.size() != whole.units.size()) {
    return absl::InternalError(absl::StrCat("JoinPipelineStages: ", units.size(),
                                            " units for ", held.size(), " held, ",
                                            stage_of_unit.size(), " stages for ",
                                            whole.units.size(), " units of the model"));
  }
  std::vector<std::vector<float>> out(whole.units.size());
  for (size_t k = 0; k < held.size(); ++k) out[held[k]] = std::move(units[k]);
  ScratchTensor scratch;
  if (device != nullptr) {
    int64_t largest = 0;
    for (const UnitLayout& u : whole.units) largest = std::max(largest, size_of(u));
    ZT_ASSIGN_OR_RETURN(scratch, device->AllocateScratchF32(largest));
  }
  for (size_t u = 0; u < whole.units.size(); ++u) {
    const int root = stage_of_unit[u];
    if (root < 0) return absl::InternalError(absl::StrCat("unit ", u, " is held by no stage"));
    std::vector<float>& unit = out[u];
    const int64_t n = size_of(whole.units[u]);
    if (root == stage && unit.size() != static_cast<size_t>(n)) {
      return absl::InternalError(absl::StrCat("JoinPipelineStages: stage ", stage, " holds ",
                                              unit.size(), " of unit ", whole.units[u].name, "'s ",
                                              n, " values"));
    }
    if (n == 0) continue;  // a unit without adapters: nothing to send, on every stage alike
    unit.resize(static_cast<size_t>(n));
    Tensor data(unit.data(), DType::kF32, {n});
    if (device != nullptr) {
      data = scratch.tensor.Slice(0, n);
      if (root == stage) ZT_RETURN_IF_ERROR(device->Upload(data, unit.data()));
    }
    ZT_ASSIGN_OR_RETURN(CommHandle h, pipeline.Broadcast(data, root,
                                                         whole.units[u].name +
                                                             (adapters ? " adapters from its stage"
                                                                       : " from its stage")));
    ZT_RETURN_IF_ERROR(h.Wait());
    if (device != nullptr) ZT_RETURN_IF_ERROR(device->Download(unit.data(), data));
  }
  units = std::move(out);
  return absl::OkStatus();
}

}  // namespace zt
