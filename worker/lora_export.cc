#include "worker/lora_export.h"

#include <filesystem>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/status_macros.h"
#include "kernels/tensor.h"
#include "worker/checkpoint/durable_file.h"
#include "worker/checkpoint/hf_interop.h"
#include "worker/checkpoint/peft_adapter.h"
#include "worker/checkpoint/safetensors.h"
#include "worker/checkpoint_export.h"
#include "worker/model/param_layout.h"
#include "worker/rank_state.h"

namespace zt {
namespace {

std::string RankFile(const std::string& step_dir, int rank) {
  return (std::filesystem::path(step_dir) / absl::StrFormat("rank-%05d.safetensors", rank))
      .string();
}

// The f32 base weights of a LoRA checkpoint, one vector per unit of `layout`.
absl::StatusOr<std::vector<std::vector<float>>> ReadBase(const zerotrain::JobSpec& saved,
                                                         const ModelLayout& layout,
                                                         const std::string& step_dir) {
  std::vector<std::vector<float>> base;
  std::vector<float*> units;
  for (const UnitLayout& u : layout.units) {
    base.emplace_back(static_cast<size_t>(u.numel));
    units.push_back(base.back().data());
  }
  const std::string& from = saved.model().init_from();
  if (!from.empty()) {
    // Not in the checkpoint: the job reloads it from model.init_from at every start.
    ZT_RETURN_IF_ERROR(IsCheckpoint(from) ? ReadCheckpointWeights(from, saved.model(), units)
                                          : ImportHuggingFace(from, saved.model(), layout, units));
    return base;
  }
  auto rank_file = [&](int r) { return RankFile(step_dir, r); };
  for (size_t u = 0; u < layout.units.size(); ++u) {
    ZT_RETURN_IF_ERROR(ReadUnitRange(saved, rank_file, static_cast<int>(u), "params", 0,
                                     layout.units[u].numel, units[u]));
  }
  return base;
}

}  // namespace

absl::StatusOr<bool> IsLoraCheckpoint(const std::string& checkpoint) {
  ZT_ASSIGN_OR_RETURN(const std::unique_ptr<Checkpoint> ckpt, OpenVerified(checkpoint));
  ZT_ASSIGN_OR_RETURN(const zerotrain::JobSpec saved, SavedJobSpec(*ckpt));
  return saved.model().has_lora();
}

absl::StatusOr<LoraExportResult> ExportLoraCheckpoint(const std::string& checkpoint,
                                                      const std::string& out_dir,
                                                      const LoraExportOptions& options) {
  ZT_ASSIGN_OR_RETURN(const std::unique_ptr<Checkpoint> ckpt, OpenVerified(checkpoint));
  ZT_ASSIGN_OR_RETURN(const zerotrain::JobSpec saved, SavedJobSpec(*ckpt));
  if (!saved.model().has_lora()) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint '", ckpt->path(),
                     "' was not saved by a LoRA job (its model has no lora): "
                     "export it without --merge-adapters as a Hugging Face model"));
  }
  const ModelLayout layout = BuildModelLayout(saved.model());
  if (options.merge_adapters && (saved.model().base_dtype() == zerotrain::ModelConfig::NF4 ||
                                 saved.model().base_dtype() == zerotrain::ModelConfig::INT8)) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint '", ckpt->path(),
                     "': --merge-adapters needs an unquantized base; this job's "
                     "model.base_dtype is ",
                     zerotrain::ModelConfig::BaseDType_Name(saved.model().base_dtype()),
                     " (export the adapters alone, without --merge-adapters)"));
  }
  // The adapters: rank 0's copy (every rank holds them whole after a step).
  ZT_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file,
                      SafetensorsFile::Open(RankFile(ckpt->path(), 0)));
  std::vector<std::vector<float>> adapters(layout.units.size());
  std::vector<Tensor> unit_lora(layout.units.size());
  for (size_t u = 0; u < layout.units.size(); ++u) {
    const UnitLayout& unit = layout.units[u];
    if (unit.lora_numel == 0) continue;
    const std::string name = unit.name + ".lora";
    const SafetensorsTensorInfo* info = file->Find(name);
    if (info == nullptr) {
      return absl::DataLossError(absl::StrCat("checkpoint '", ckpt->path(), "': ", file->path(),
                                              " has no tensor ", name, " (the unit's adapters)"));
    }
    std::vector<float> all(static_cast<size_t>(info->numel()));
    ZT_RETURN_IF_ERROR(file->ReadAsF32(*info, absl::MakeSpan(all)));
    if (static_cast<int64_t>(all.size()) < unit.lora_numel) {
      return absl::DataLossError(absl::StrCat("checkpoint '", ckpt->path(), "': ", name, " holds ",
                                              all.size(), " values, the layout needs ",
                                              unit.lora_numel));
    }
    all.resize(static_cast<size_t>(unit.lora_numel));
    adapters[u] = std::move(all);
    unit_lora[u] = Tensor(adapters[u].data(), DType::kF32, {unit.lora_numel});
  }
  LoraExportResult result{.checkpoint = ckpt->path(), .step = ckpt->step()};
  if (!options.merge_adapters) {
    ZT_RETURN_IF_ERROR(WritePeftAdapter(saved.model(), layout, unit_lora, out_dir,
                                        {.base_model_name_or_path = saved.model().init_from()}));
    return result;
  }
  ZT_ASSIGN_OR_RETURN(const std::vector<std::vector<float>> base,
                      ReadBase(saved, layout, ckpt->path()));
  std::vector<const float*> pointers;
  for (const std::vector<float>& b : base) pointers.push_back(b.data());
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return durable_file::ErrnoStatus(ec.value(), "create the export directory", out_dir);
  const std::string weights = (std::filesystem::path(out_dir) / kHfWeightsName).string();
  ZT_RETURN_IF_ERROR(
      ExportMergedHuggingFace(weights, saved.model(), layout, pointers, unit_lora, options.dtype));
  // The merged model is a plain one: its config has no adapters.
  zerotrain::ModelConfig plain = saved.model();
  plain.clear_lora();
  plain.clear_base_dtype();
  ZT_ASSIGN_OR_RETURN(const nlohmann::json config, HuggingFaceConfig(plain, options.dtype));
  ZT_RETURN_IF_ERROR(durable_file::WriteSyncedFile(
      (std::filesystem::path(out_dir) / kHfConfigName).string(), config.dump(2) + "\n"));
  return result;
}

}  // namespace zt
