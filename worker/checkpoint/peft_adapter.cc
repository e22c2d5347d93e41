#include "worker/checkpoint/peft_adapter.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "worker/checkpoint/durable_file.h"
#include "worker/checkpoint/hf_interop.h"
#include "worker/checkpoint/safetensors.h"
#include "worker/model/lora_merge.h"
#include "worker/status_macros.h"

namespace zt {
namespace {

using zerotrain::ModelConfig;

// The module names of model.lora.target_modules, in the job's order, each once.
std::vector<std::string> TargetModules(const ModelConfig& model) {
  return {model.lora().target_modules().begin(), model.lora().target_modules().end()};
}

nlohmann::json PeftConfig(const ModelConfig& model, const PeftWriteOptions& options) {
  const zerotrain::LoraConfig& lora = model.lora();
  nlohmann::json base = nullptr;
  if (!options.base_model_name_or_path.empty()) base = options.base_model_name_or_path;
  // The fields of PEFT's LoraConfig (peft.tuners.lora.config) with PEFT's values for what
  // this engine does not use (no rank or alpha patterns, no DoRA, no rsLoRA scaling).
  return nlohmann::json{
      {"peft_type", "LORA"},
      {"task_type", "CAUSAL_LM"},
      {"r", lora.rank()},
      {"lora_alpha", lora.alpha()},
      {"lora_dropout", lora.dropout()},
      {"target_modules", TargetModules(model)},
      {"bias", "none"},
      {"fan_in_fan_out", model.family() == ModelConfig::GPT2},
      {"base_model_name_or_path", base},
      {"inference_mode", true},
      {"init_lora_weights", true},
      {"modules_to_save", nullptr},
      {"layers_to_transform", nullptr},
      {"layers_pattern", nullptr},
      {"rank_pattern", nlohmann::json::object()},
      {"alpha_pattern", nlohmann::json::object()},
      {"use_rslora", false},
      {"use_dora", false},
      {"revision", nullptr},
  };
}

absl::Status CheckBuffers(const ModelLayout& layout, const std::vector<Tensor>& unit_lora,
                          const char* op) {
  if (unit_lora.size() != layout.units.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", unit_lora.size(), " adapter buffers for ", layout.units.size(), " units"));
  }
  for (size_t u = 0; u < layout.units.size(); ++u) {
    const int64_t want = layout.units[u].lora_numel;
    const Tensor& t = unit_lora[u];
    if (want == 0) continue;
    if (t.empty() || t.dtype() != DType::kF32 || t.numel() < want) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": unit ", layout.units[u].name,
                                                     "'s adapter buffer is ", t.DebugString(),
                                                     ", the layout needs f32[", want, "]"));
    }
  }
  return absl::OkStatus();
}

absl::Status ConfigMismatch(const std::string& path, const std::string& field,
                            const std::string& have, const std::string& want) {
  return absl::FailedPreconditionError(absl::StrCat("model.lora.init_from: ", path, ": ", field,
                                                    " is ", have, " but the job's model.lora has ",
                                                    want, "; they must be equal"));
}

}  // namespace

std::string PeftTensorName(ModelConfig::Family family, int block, const LoraSite& site,
                           const char* a_or_b) {
  const char* layers = family == ModelConfig::GPT2 ? "base_model.model.transformer.h."
                                                   : "base_model.model.model.layers.";
  return absl::StrCat(layers, block, ".", site.hf_path, ".", a_or_b, ".weight");
}

absl::Status WritePeftAdapter(const ModelConfig& model, const ModelLayout& layout,
                              const std::vector<Tensor>& unit_lora, const std::string& dir,
                              const PeftWriteOptions& options) {
  if (!model.has_lora() || !layout.lora) {
    return absl::InvalidArgumentError("WritePeftAdapter: the model has no model.lora");
  }
  ZT_RETURN_IF_ERROR(CheckBuffers(layout, unit_lora, "WritePeftAdapter"));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return durable_file::ErrnoStatus(ec.value(), "create adapter directory", dir);

  std::vector<SafetensorsTensorSpec> specs;
  std::vector<const float*> data;
  for (size_t u = 0; u < layout.units.size(); ++u) {
    const UnitLayout& unit = layout.units[u];
    for (const LoraSite& site : unit.lora) {
      for (const auto& [which, spec] :
           {std::pair{"lora_A", &site.a}, std::pair{"lora_B", &site.b}}) {
        specs.push_back({.name = PeftTensorName(model.family(), unit.block_index, site, which),
                         .dtype = StDType::kF32,
                         .shape = spec->shape});
        data.push_back(unit_lora[u].data<float>() + spec->offset);
      }
    }
  }
  const std::string weights = durable_file::JoinPath(dir, kPeftWeightsFile);
  ZT_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsWriter> writer,
                      SafetensorsWriter::Create(weights, specs, {{"format", "pt"}}));
  for (size_t k = 0; k < specs.size(); ++k) {
    int64_t n = 1;
    for (int64_t d : specs[k].shape) n *= d;
    ZT_RETURN_IF_ERROR(writer->WriteF32(specs[k].name, absl::MakeConstSpan(data[k], n)));
  }
  ZT_RETURN_IF_ERROR(writer->Finish());

  // The config last, through a temporary name, so a directory with a config is complete.
  const std::string config = durable_file::JoinPath(dir, kPeftConfigFile);
  const std::string tmp = config + ".tmp";
  ZT_RETURN_IF_ERROR(durable_file::RemoveTree(tmp));
  ZT_RETURN_IF_ERROR(durable_file::WriteSyncedFile(tmp, PeftConfig(model, options).dump(2) + "\n"));
  if (std::rename(tmp.c_str(), config.c_str()) != 0) {
    return durable_file::ErrnoStatus(errno, "rename adapter config into place", config);
  }
  return durable_file::SyncDirectory(dir);
}

absl::Status ReadPeftAdapter(const ModelConfig& model, const ModelLayout& layout,
                             const std::string& dir, const std::vector<Tensor>& unit_lora) {
  if (!model.has_lora() || !layout.lora) {
    return absl::InvalidArgumentError("ReadPeftAdapter: the model has no model.lora");
  }
  ZT_RETURN_IF_ERROR(CheckBuffers(layout, unit_lora, "ReadPeftAdapter"));
  const std::string config_path = durable_file::JoinPath(dir, kPeftConfigFile);
  ZT_ASSIGN_OR_RETURN(const std::string text, durable_file::ReadSmallFile(config_path));
  const nlohmann::json config = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) {
    return absl::DataLossError(absl::StrCat(config_path, ": not a JSON object"));
  }
  const zerotrain::LoraConfig& lora = model.lora();
  auto field = [&](const char* name) -> const nlohmann::json* {
    auto it = config.find(name);
    return it == config.end() ? nullptr : &*it;
  };
  const nlohmann::json* type = field("peft_type");
  if (type == nullptr || !type->is_string() || type->get<std::string>() != "LORA") {
    return ConfigMismatch(config_path, "peft_type", type ? type->dump() : "missing", "\"LORA\"");
  }
  const nlohmann::json* r = field("r");
  if (r == nullptr || !r->is_number_integer() || r->get<int64_t>() != lora.rank()) {
    return ConfigMismatch(config_path, "r", r ? r->dump() : "missing",
                          absl::StrCat("rank ", lora.rank()));
  }
  const nlohmann::json* alpha = field("lora_alpha");
  if (alpha == nullptr || !alpha->is_number() || alpha->get<double>() != lora.alpha()) {
    return ConfigMismatch(config_path, "lora_alpha", alpha ? alpha->dump() : "missing",
                          absl::StrCat("alpha ", lora.alpha()));
  }
  const nlohmann::json* bias = field("bias");
  if (bias != nullptr && !(bias->is_string() && bias->get<std::string>() == "none")) {
    return ConfigMismatch(config_path, "bias", bias->dump(), "no trained biases (\"none\")");
  }
  const nlohmann::json* targets = field("target_modules");
  std::set<std::string> have;
  if (targets != nullptr && targets->is_array()) {
    for (const nlohmann::json& t : *targets) {
      if (t.is_string()) have.insert(t.get<std::string>());
    }
  }
  const std::vector<std::string> wanted = TargetModules(model);
  if (have != std::set<std::string>(wanted.begin(), wanted.end())) {
    return ConfigMismatch(config_path, "target_modules", targets ? targets->dump() : "missing",
                          absl::StrCat("target_modules [", absl::StrJoin(wanted, ", "), "]"));
  }

  const std::string weights = durable_file::JoinPath(dir, kPeftWeightsFile);
  ZT_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(weights));
  for (size_t u = 0; u < layout.units.size(); ++u) {
    const UnitLayout& unit = layout.units[u];
    for (const LoraSite& site : unit.lora) {
      for (const auto& [which, spec] :
           {std::pair{"lora_A", &site.a}, std::pair{"lora_B", &site.b}}) {
        const std::string name = PeftTensorName(model.family(), unit.block_index, site, which);
        const SafetensorsTensorInfo* info = file->Find(name);
        if (info == nullptr) {
          return absl::NotFoundError(absl::StrCat(weights, ": no tensor ", name));
        }
        if (info->shape != spec->shape) {
          return absl::InvalidArgumentError(
              absl::StrCat(weights, ": ", name, " has shape [", absl::StrJoin(info->shape, ", "),
                           "], the model's adapter is [", absl::StrJoin(spec->shape, ", "), "]"));
        }
        ZT_RETURN_IF_ERROR(file->ReadAsF32(
            *info, absl::MakeSpan(unit_lora[u].data<float>() + spec->offset, spec->numel)));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ExportMergedHuggingFace(const std::string& path, const ModelConfig& model,
                                     const ModelLayout& layout,
                                     const std::vector<const float*>& unit_params,
                                     const std::vector<Tensor>& unit_lora, DType dtype) {
  if (model.base_dtype() == ModelConfig::NF4 || model.base_dtype() == ModelConfig::INT8) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ExportMergedHuggingFace: base_dtype ", ModelConfig::BaseDType_Name(model.base_dtype()),
        " is quantized; merging into it is not supported"));
  }
  if (unit_params.size() != layout.units.size()) {
    return absl::InvalidArgumentError("ExportMergedHuggingFace: one buffer per unit is needed");
  }
  std::vector<std::vector<float>> merged(layout.units.size());
  std::vector<Tensor> views;
  std::vector<const float*> pointers;
  for (size_t u = 0; u < layout.units.size(); ++u) {
    merged[u].assign(unit_params[u], unit_params[u] + layout.units[u].numel);
    views.push_back(Tensor(merged[u].data(), DType::kF32, {layout.units[u].numel}));
    pointers.push_back(merged[u].data());
  }
  ZT_RETURN_IF_ERROR(MergeLoraAdapters(layout, unit_lora, views));
  // The merged model is a plain one: the same tensors at the same offsets, without adapters.
  ModelConfig plain = model;
  plain.clear_lora();
  plain.clear_base_dtype();
  return ExportHuggingFace(path, plain, BuildModelLayout(plain), pointers, dtype);
}

}  // namespace zt
