#include "worker/checkpoint/checkpoint_export.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/util/json_util.h"
#include "kernels/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/checkpoint/durable_file.h"
#include "worker/checkpoint/safetensors.h"
#include "worker/checkpoint/tensor_parallel_reshard.h"
#include "worker/model/param_layout.h"
#include "worker/checkpoint/rank_state.h"

namespace zt {
namespace {

using durable_file::ErrnoStatus;
using durable_file::JoinPath;
using durable_file::RemoveTree;
using durable_file::SyncDirectory;
using durable_file::WriteSyncedFile;

std::string RankFileName(int rank) { return absl::StrFormat("rank-%05d.safetensors", rank); }

// The manifest's state field `key`, a configuration message's JSON, parsed into `message`.
absl::Status ParseStateMessage(const Checkpoint& ckpt, const char* key,
                               google::protobuf::Message* message) {
  const nlohmann::json& state = ckpt.state();
  if (!state.is_object() || !state.contains(key)) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint '", ckpt.path(), "': its manifest's state does not record the ",
                     key, " configuration (written by an older ZeroTrain); it cannot be exported"));
  }
  const nlohmann::json& value = state[key];
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  if (!value.is_string() ||
      !google::protobuf::util::JsonStringToMessage(value.get<std::string>(), message, options)
           .ok()) {
    return absl::DataLossError(absl::StrCat("checkpoint '", ckpt.path(), "': the manifest's state.",
                                            key, " is not a valid ", key, " configuration"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Checkpoint>> OpenVerified(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::exists(std::filesystem::path(path) / kCheckpointManifestName, ec)) {
    ZT_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, OpenCheckpoint(path));
    ZT_RETURN_IF_ERROR(ckpt->VerifyAll());
    return ckpt;
  }
  if (!std::filesystem::is_directory(path, ec)) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint '", path,
                     "' is not a directory: give a checkpoint.dir or one of its step directories"));
  }
  ZT_ASSIGN_OR_RETURN(LoadableCheckpoint loadable, FindLoadable(path, CheckpointFallback::kNone));
  return std::move(loadable.checkpoint);
}

namespace {

// The export files `dir` already holds; an export never mixes with an earlier one's shards.
std::vector<std::string> ExistingExportFiles(const std::string& dir) {
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name == kHfConfigName || name == kHfWeightsName || name == kHfIndexName ||
        (name.starts_with("model-") && name.ends_with(".safetensors"))) {
      found.push_back(name);
    }
  }
  std::sort(found.begin(), found.end());
  return found;
}

// Writes `value` to `dir`/`name` under a temporary name, synced, then renamed into place.
absl::Status WriteJsonFile(const std::string& dir, const std::string& name,
                           const nlohmann::json& value) {
  const std::string path = JoinPath(dir, name);
  const std::string tmp = path + ".tmp";
  ZT_RETURN_IF_ERROR(RemoveTree(tmp));
  ZT_RETURN_IF_ERROR(WriteSyncedFile(tmp, value.dump(2) + "\n"));
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return ErrnoStatus(errno, "rename into place", path);
  }
  return SyncDirectory(dir);
}

// Consecutive runs of tensors, each within `max_bytes` unless one tensor alone exceeds it:
// transformers' split (a new file starts when the next tensor would overflow this one).
std::vector<std::vector<size_t>> SplitIntoShards(const std::vector<HfTensor>& table,
                                                 int64_t element_bytes, int64_t max_bytes) {
  std::vector<std::vector<size_t>> shards;
  int64_t bytes = 0;
  for (size_t i = 0; i < table.size(); ++i) {
    const int64_t t = table[i].numel() * element_bytes;
    if (shards.empty() || (bytes + t > max_bytes && !shards.back().empty())) {
      shards.emplace_back();
      bytes = 0;
    }
    shards.back().push_back(i);
    bytes += t;
  }
  return shards;
}

// The rank-state role of the fp32 weights the optimizer updates: the master copy when the
// precision keeps one.
std::string WeightsRole(const zerotrain::PrecisionConfig& precision) {
  const bool master =
      precision.has_master_weights()
          ? precision.master_weights()
          : precision.param_dtype() != zerotrain::PrecisionConfig::FP32 &&
                precision.param_dtype() != zerotrain::PrecisionConfig::DTYPE_UNSPECIFIED;
  return master ? "master" : "params";
}

// The saved f32 weights of the whole model, a range of a unit at a time: read straight from
// the ranks' ranges (ReadUnitRange), or, from a tensor- or pipeline-parallel checkpoint, out of
// the whole unit joined from its stage's shares — held for the next range of the same unit, so a
// unit is joined once while its tensors are written in table order.
class SavedWeights {
 public:
  SavedWeights(const zerotrain::JobSpec& saved, std::function<std::string(int)> rank_file)
      : saved_(saved), rank_file_(std::move(rank_file)), role_(WeightsRole(saved.precision())) {}

  absl::Status Read(int unit, int64_t begin, int64_t end, float* out) {
    if (saved_.parallel().tensor_parallel() <= 1 && saved_.parallel().pipeline_parallel() <= 1) {
      return ReadUnitRange(saved_, rank_file_, unit, role_, begin, end, out);
    }
    if (unit != joined_unit_) {
      const ModelLayout layout = BuildModelLayout(saved_.model());
      joined_.reserve(layout.units[unit].numel);
      joined_.resize(layout.units[unit].numel);
      joined_unit_ = -1;
      ZT_RETURN_IF_ERROR(ReadWholeUnitFromShares(saved_, rank_file_, unit, role_, joined_.data()));
      joined_unit_ = unit;
    }
    std::copy(joined_.begin() + begin, joined_.begin() + end, out);
    return absl::OkStatus();
  }

  // The most f32 values held for a joined unit.
  int64_t held_floats() const { return static_cast<int64_t>(joined_.capacity()); }

 private:
  const zerotrain::JobSpec& saved_;
  std::function<std::string(int)> rank_file_;
  std::string role_;
  int joined_unit_ = -1;
  std::vector<float> joined_;
};

}  // namespace

absl::StatusOr<zerotrain::JobSpec> SavedJobSpec(const Checkpoint& checkpoint) {
  zerotrain::JobSpec job;
  ZT_RETURN_IF_ERROR(ParseStateMessage(checkpoint, "model", job.mutable_model()));
  ZT_RETURN_IF_ERROR(ParseStateMessage(checkpoint, "precision", job.mutable_precision()));
  const nlohmann::json& state = checkpoint.state();
  auto int_field = [&](const char* key) -> int {
    const auto it = state.find(key);
    return it != state.end() && it->is_number_integer() ? it->get<int>() : -1;
  };
  const int world = int_field("world_size"), stage = int_field("zero_stage"),
            group = int_field("shard_group_size");
  if (world < 1 || group < 1 || world % group != 0 || stage < 0 || stage > 3) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint '", checkpoint.path(), "': the manifest's parallel layout (world_size ", world,
        ", zero_stage ", stage, ", shard_group_size ", group,
        ") is invalid: world_size ≥ 1, zero_stage 0–3, shard_group_size dividing world_size"));
  }
  // Each rank file of a tensor- or pipeline-parallel checkpoint holds its shares of its
  // stage's units: SavedWeights joins them, with the stages' units as the schedule's chunks.
  if (const int tp = int_field("tensor_parallel"); tp > 1) {
    job.mutable_parallel()->set_tensor_parallel(tp);
  }
  if (const int pp = int_field("pipeline_parallel"); pp > 1) {
    job.mutable_parallel()->set_pipeline_parallel(pp);
    zerotrain::ParallelConfig::PipelineSchedule schedule = zerotrain::ParallelConfig::ONE_F_ONE_B;
    const auto it = state.find("pipeline_schedule");
    if (it != state.end() &&
        (!it->is_string() ||
         !zerotrain::ParallelConfig::PipelineSchedule_Parse(it->get<std::string>(), &schedule))) {
      return absl::DataLossError(absl::StrCat("checkpoint '", checkpoint.path(),
                                              "': the manifest's pipeline_schedule ", it->dump(),
                                              " is not a schedule"));
    }
    job.mutable_parallel()->set_pipeline_schedule(schedule);
    // Checkpoints from before the interleaved schedule have one chunk a stage.
    job.mutable_parallel()->set_virtual_stages(std::max(1, int_field("virtual_stages")));
  }
  job.mutable_parallel()->set_world_size(world);
  job.mutable_parallel()->set_zero_stage(stage);
  job.mutable_parallel()->set_shard_group_size(group);
  return job;
}

absl::StatusOr<CheckpointExportResult> ExportCheckpoint(const std::string& checkpoint,
                                                        const std::string& out_dir,
                                                        const CheckpointExportOptions& options) {
  if (options.dtype != DType::kF32 && options.dtype != DType::kBF16 &&
      options.dtype != DType::kF16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "export dtype ", std::string(DTypeName(options.dtype)), " is not one of f32, bf16, f16"));
  }
  if (options.max_shard_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_shard_bytes is ", options.max_shard_bytes, "; it must be ≥ 1"));
  }
  ZT_ASSIGN_OR_RETURN(const std::unique_ptr<Checkpoint> ckpt, OpenVerified(checkpoint));
  ZT_ASSIGN_OR_RETURN(const zerotrain::JobSpec job, SavedJobSpec(*ckpt));
  for (int r = 0; r < job.parallel().world_size(); ++r) {
    if (ckpt->Find(RankFileName(r)) == nullptr) {
      return absl::DataLossError(absl::StrCat("checkpoint '", ckpt->path(), "': rank file ",
                                              RankFileName(r), " is not in its manifest (",
                                              job.parallel().world_size(), " ranks saved)"));
    }
  }
  const ModelLayout layout = BuildModelLayout(job.model());
  ZT_ASSIGN_OR_RETURN(const std::vector<HfTensor> table, HuggingFaceTensors(job.model(), layout));
  ZT_ASSIGN_OR_RETURN(const nlohmann::json config, HuggingFaceConfig(job.model(), options.dtype));

  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return ErrnoStatus(ec.value(), "create the export directory", out_dir);
  if (const std::vector<std::string> old = ExistingExportFiles(out_dir); !old.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--out '", out_dir, "' already holds an export (", absl::StrJoin(old, ", "),
                     "); give a new or empty directory, or remove those files"));
  }

  const std::string step_dir = ckpt->path();
  SavedWeights weights(job, [&](int r) { return JoinPath(step_dir, RankFileName(r)); });

  const int64_t element_bytes = DTypeSize(options.dtype);
  const std::vector<std::vector<size_t>> shards =
      SplitIntoShards(table, element_bytes, options.max_shard_bytes);
  const int count = static_cast<int>(shards.size());
  CheckpointExportResult result{.checkpoint = step_dir, .step = ckpt->step()};
  nlohmann::json weight_map = nlohmann::json::object();
  std::vector<float> values, scratch;
  for (int s = 0; s < count; ++s) {
    const std::string name = count == 1 ? kHfWeightsName : HfShardName(s + 1, count);
    std::vector<SafetensorsTensorSpec> specs;
    for (size_t i : shards[s])
      specs.push_back({table[i].name, ToStDType(options.dtype), table[i].shape});
    ZT_ASSIGN_OR_RETURN(
        std::unique_ptr<SafetensorsWriter> writer,
        SafetensorsWriter::Create(JoinPath(out_dir, name), std::move(specs), {{"format", "pt"}}));
    for (size_t i : shards[s]) {
      const HfTensor& t = table[i];
      const int64_t begin = t.unit_begin(), end = begin + t.numel();
      if (options.on_read) options.on_read(t, begin, end);
      // reserve() first: resize() alone may grow the capacity past the tensor.
      values.reserve(t.numel());
      values.resize(t.numel());
      ZT_RETURN_IF_ERROR(weights.Read(t.unit, begin, end, values.data()));
      ZT_RETURN_IF_ERROR(writer->WriteF32(t.name, HfOrder(t, values, &scratch)));
      result.peak_buffer_floats = std::max(
          result.peak_buffer_floats,
          static_cast<int64_t>(values.capacity() + scratch.capacity()) + weights.held_floats());
      result.total_bytes += t.numel() * element_bytes;
      ++result.tensors;
      weight_map[t.name] = name;
    }
    ZT_RETURN_IF_ERROR(writer->Finish());
    result.files.push_back(name);
  }
  if (count > 1) {
    ZT_RETURN_IF_ERROR(WriteJsonFile(
        out_dir, kHfIndexName,
        {{"metadata", {{"total_size", result.total_bytes}}}, {"weight_map", weight_map}}));
    result.files.push_back(kHfIndexName);
  }
  // config.json last: a directory with it is a complete export.
  ZT_RETURN_IF_ERROR(WriteJsonFile(out_dir, kHfConfigName, config));
  result.files.push_back(kHfConfigName);
  return result;
}

bool IsCheckpoint(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path p(path);
  return std::filesystem::exists(p / kCheckpointLatestName, ec) ||
         std::filesystem::exists(p / kCheckpointManifestName, ec);
}

absl::Status ReadCheckpointWeights(const std::string& checkpoint,
                                   const zerotrain::ModelConfig& model,
                                   const std::vector<float*>& units) {
  ZT_ASSIGN_OR_RETURN(const std::unique_ptr<Checkpoint> ckpt, OpenVerified(checkpoint));
  ZT_ASSIGN_OR_RETURN(const zerotrain::JobSpec saved, SavedJobSpec(*ckpt));
  const ModelLayout layout = BuildModelLayout(model);
  const ModelLayout saved_layout = BuildModelLayout(saved.model());
  auto other_model = [&](const std::string& what) {
    return absl::FailedPreconditionError(absl::StrCat("model.init_from: checkpoint '", ckpt->path(),
                                                      "' was saved for another model: ", what));
  };
  if (saved.model().family() != model.family()) {
    return other_model(
        absl::StrCat("family ", zerotrain::ModelConfig::Family_Name(saved.model().family()),
                     ", this job's ", zerotrain::ModelConfig::Family_Name(model.family())));
  }
  if (saved_layout.units.size() != layout.units.size() || units.size() != layout.units.size()) {
    return other_model(
        absl::StrCat(saved_layout.units.size(), " units, this job's ", layout.units.size()));
  }
  for (size_t u = 0; u < layout.units.size(); ++u) {
    if (saved_layout.units[u].numel != layout.units[u].numel) {
      return other_model(absl::StrCat("unit ", u, " has ", saved_layout.units[u].numel,
                                      " parameters, this job's ", layout.units[u].numel));
    }
  }
  const std::string step_dir = ckpt->path();
  SavedWeights weights(saved, [&](int r) { return JoinPath(step_dir, RankFileName(r)); });
  for (size_t u = 0; u < layout.units.size(); ++u) {
    if (units[u] == nullptr) continue;  // a unit the caller does not hold
    ZT_RETURN_IF_ERROR(weights.Read(static_cast<int>(u), 0, layout.units[u].numel, units[u]));
  }
  return absl::OkStatus();
}

}  // namespace zt
