#include "worker/checkpoint/tensor_parallel_reshard.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/status_macros.h"
#include "worker/checkpoint/safetensors.h"
#include "worker/model/param_layout.h"
#include "worker/model/tensor_parallel_slice.h"
#include "worker/parallel/parallel_layout.h"
#include "worker/plan/parallel_plan.h"

namespace zt {
namespace {

// For each element of `local` (a share at tp, rank r), its index in the whole unit, or -1 for
// padding.
std::vector<int64_t> GlobalIndex(const zerotrain::ModelConfig& m, const UnitLayout& local,
                                 const UnitLayout& whole, int tp, int r) {
  std::vector<int64_t> g(local.numel, -1);
  for (const ParamSpec& p : local.params) {
    // A pipeline head stage's copy of the tied embedding ("lm_head.weight" appended to the
    // head unit) is not a parameter of the whole unit: it is wte's, read from the embedding.
    if (whole.Find(p.name) == nullptr) continue;
    const ParamSpec& w = *whole.Find(p.name);
    const TensorParallelSlice s = SliceOf(m, p.name, w.shape, tp, r);
    for (const TensorParallelSlice::Rows& run : s.rows) {
      for (int64_t i = 0; i < run.count; ++i) {
        for (int64_t c = 0; c < s.local_cols; ++c) {
          g[p.offset + (run.local_begin + i) * s.local_cols + c] =
              w.offset + (run.global_begin + i) * s.global_cols + s.col_begin + c;
        }
      }
    }
  }
  return g;
}

// Elements [begin, end) of the unit that buffer `role` of `rank` holds, from its element 0.
struct Segment {
  int64_t begin = 0, end = 0;
};
Segment SegmentOf(const zerotrain::JobSpec& job, int rank, const UnitLayout& unit,
                  const std::string& role) {
  const int stage = job.parallel().zero_stage();
  const bool sharded = role == "params" ? stage >= 3 : stage >= 1;
  if (!sharded) return {0, unit.numel};
  const UnitShard shard = ShardOf(unit.numel, ParallelLayout::ForJob(job, rank).shard());
  return {shard.owned.begin, shard.owned.end};
}

bool Elementwise(const std::string& role) {
  return role == "params" || role == "master" || role == "adam_m" || role == "adam_v" ||
         role == "momentum";
}

// Every saved rank's file, opened (mapped) once.
absl::StatusOr<std::vector<std::unique_ptr<SafetensorsFile>>> OpenSavedRanks(
    const zerotrain::JobSpec& saved, const std::function<std::string(int)>& rank_file) {
  std::vector<std::unique_ptr<SafetensorsFile>> files(saved.parallel().world_size());
  for (size_t r = 0; r < files.size(); ++r) {
    ZT_ASSIGN_OR_RETURN(files[r], SafetensorsFile::Open(rank_file(static_cast<int>(r))));
  }
  return files;
}

// Unit u's buffer `role` (saved as `buffer`, f32) of the whole model, in unit_values (sized to
// the whole unit), placed element by element from every saved rank's range of its share. A
// saved rank holds the unit as its RankModelLayout says (a tensor-parallel share, and with
// pipeline parallelism only its stage's units): ranks of other stages are skipped.
absl::Status JoinWholeUnit(const zerotrain::JobSpec& saved,
                           const std::vector<std::unique_ptr<SafetensorsFile>>& files,
                           const std::function<std::string(int)>& rank_file, int u,
                           const std::string& buffer, const std::string& role,
                           std::vector<float>* unit_values) {
  const zerotrain::ModelConfig& m = saved.model();
  const ModelLayout whole = BuildModelLayout(m);
  const UnitLayout& whole_unit = whole.units[u];
  unit_values->assign(whole_unit.numel, 0.0f);
  bool found = false;
  for (int r = 0; r < static_cast<int>(files.size()); ++r) {
    const ParallelLayout place = ParallelLayout::ForJob(saved, r);
    const ModelLayout rank_layout = RankModelLayout(saved, place);
    const UnitLayout* local = nullptr;
    for (const UnitLayout& unit : rank_layout.units) {
      if (unit.name == whole_unit.name) local = &unit;
    }
    if (local == nullptr) continue;  // another pipeline stage's unit
    found = true;
    const std::vector<int64_t> index =
        GlobalIndex(m, *local, whole_unit, place.tensor_size(), place.coordinates().tensor);
    const Segment seg = SegmentOf(saved, r, *local, role);
    if (seg.end <= seg.begin) continue;  // an empty range: the plan holds no such buffer
    const SafetensorsTensorInfo* info = files[r]->Find(buffer);
    const int64_t need = (seg.end - seg.begin) * static_cast<int64_t>(sizeof(float));
    if (info == nullptr || info->nbytes() < need) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint file '", rank_file(r), "': buffer ", buffer,
                       info == nullptr ? " is missing" : " is shorter than its layout says"));
    }
    if (info->dtype != StDType::kF32) {
      return absl::UnimplementedError(absl::StrCat(
          "checkpoint file '", rank_file(r), "': buffer ", buffer,
          " is not f32, which is all a tensor- or pipeline-parallel checkpoint is read in"));
    }
    const absl::Span<const uint8_t> bytes = files[r]->Bytes(*info);
    std::vector<float> values(seg.end - seg.begin);
    std::memcpy(values.data(), bytes.data(), need);
    files[r]->Release(*info);
    for (int64_t i = seg.begin; i < seg.end; ++i) {
      if (index[i] >= 0) (*unit_values)[index[i]] = values[i - seg.begin];
    }
  }
  if (!found) {
    return absl::DataLossError(
        absl::StrCat("checkpoint: no saved rank holds unit ", whole_unit.name, " (", buffer, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ReadWholeUnitFromShares(const zerotrain::JobSpec& saved,
                                     const std::function<std::string(int)>& rank_file, int unit,
                                     const std::string& role, float* out) {
  const ModelLayout whole = BuildModelLayout(saved.model());
  if (unit < 0 || unit >= static_cast<int>(whole.units.size()) ||
      (role != "params" && role != "master")) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReadWholeUnitFromShares: unit ", unit, " role '", role, "' is not a weight"));
  }
  ZT_ASSIGN_OR_RETURN(const auto files, OpenSavedRanks(saved, rank_file));
  std::vector<float> values;
  ZT_RETURN_IF_ERROR(JoinWholeUnit(saved, files, rank_file, unit,
                                   whole.units[unit].name + "." + role, role, &values));
  std::copy(values.begin(), values.end(), out);
  return absl::OkStatus();
}

absl::Status ReshardTensorParallelState(const zerotrain::JobSpec& saved,
                                        const std::function<std::string(int)>& rank_file,
                                        const zerotrain::JobSpec& job, int rank,
                                        const MemoryPlan& plan, const Arenas& into,
                                        bool weights_only) {
  const zerotrain::ModelConfig& m = job.model();
  const ModelLayout whole = BuildModelLayout(m);
  const ParallelLayout place = ParallelLayout::ForJob(job, rank);
  // This rank's units: its tensor-parallel shares of its pipeline stage's units.
  const ModelLayout local = RankModelLayout(job, place);
  ZT_ASSIGN_OR_RETURN(const auto files, OpenSavedRanks(saved, rank_file));
  const auto whole_index = [&](const std::string& name) {
    for (size_t k = 0; k < whole.units.size(); ++k) {
      if (whole.units[k].name == name) return static_cast<int>(k);
    }
    return -1;
  };
  std::vector<float> unit_values, embedding_values;
  for (const BufferSpec& buffer : plan.buffers) {
    if (!IsCheckpointed(buffer, weights_only)) continue;
    const BufferSpec* b = &buffer;
    int u = -1;
    for (size_t k = 0; k < local.units.size(); ++k) {
      if (b->name.starts_with(local.units[k].name + ".")) u = static_cast<int>(k);
    }
    const std::string role = u < 0 ? "" : b->name.substr(local.units[u].name.size() + 1);
    if (u < 0 || !Elementwise(role) || b->dtype != DType::kF32) {
      return absl::UnimplementedError(absl::StrCat(
          "resuming at another tensor- or pipeline-parallel layout: buffer ", b->name,
          " is not f32 parameters, master weights, AdamW moments or SGD momentum, which is all "
          "the resharding of such checkpoints reads so far"));
    }
    const UnitLayout& mine = local.units[u];
    const int w = whole_index(mine.name);
    // The whole unit's values of this role, from every saved rank's range of its share.
    ZT_RETURN_IF_ERROR(JoinWholeUnit(saved, files, rank_file, w, whole.units[w].name + "." + role,
                                     role, &unit_values));
    // This rank's share and range of it.
    const std::vector<int64_t> index =
        GlobalIndex(m, mine, whole.units[w], place.tensor_size(), place.coordinates().tensor);
    const Segment seg = SegmentOf(job, rank, mine, role);
    ZT_ASSIGN_OR_RETURN(Tensor out, into.Get(b->name));
    float* dst = out.data<float>();
    std::fill(dst, dst + out.numel(), 0.0f);
    for (int64_t i = seg.begin; i < seg.end; ++i) {
      if (index[i] >= 0) dst[i - seg.begin] = unit_values[index[i]];
    }
    // A pipeline head stage's copy of the tied embedding: the same parameter as wte, with the
    // same optimizer state (its gradient is summed with the embedding's every step), so it
    // starts as the embedding's share.
    const ParamSpec* copy = mine.Find("lm_head.weight");
    if (copy == nullptr || whole.units[w].Find("lm_head.weight") != nullptr) continue;
    const UnitLayout& embedding = whole.embedding();
    ZT_RETURN_IF_ERROR(JoinWholeUnit(saved, files, rank_file, whole_index(embedding.name),
                                     embedding.name + "." + role, role, &embedding_values));
    const TensorParallelSlice s = SliceOf(m, "wte", embedding.Find("wte")->shape,
                                          place.tensor_size(), place.coordinates().tensor);
    std::vector<float> share(copy->numel);
    ExtractSlice(s, embedding_values.data() + embedding.Find("wte")->offset, share.data());
    for (int64_t i = std::max(seg.begin, copy->offset);
         i < std::min(seg.end, copy->offset + copy->numel); ++i) {
      dst[i - seg.begin] = share[i - copy->offset];
    }
  }
  return absl::OkStatus();
}

}  // namespace zt
