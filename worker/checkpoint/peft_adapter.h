// LoRA adapters in PEFT's directory layout, so `peft` loads what ZeroTrain writes and the other
// way round (docs/lora.md, "PEFT layout"):
//
//   adapter_config.json        PEFT's LoraConfig as JSON: peft_type "LORA", task_type
//                              "CAUSAL_LM", r, lora_alpha, lora_dropout, target_modules,
//                              bias "none", fan_in_fan_out (true for GPT-2's Conv1D),
//                              base_model_name_or_path, inference_mode, …
//   adapter_model.safetensors  one F32 tensor per adapter matrix, named as PEFT's
//                              get_peft_model_state_dict names them:
//     LLAMA  base_model.model.model.layers.<i>.<self_attn|mlp>.<module>.lora_<A|B>.weight
//     GPT2   base_model.model.transformer.h.<i>.<attn|mlp>.<module>.lora_<A|B>.weight
//   lora_A (r, in), lora_B (out, r), as torch.nn.Linear stores them (also for GPT-2, whose
//   base Conv1D is [in, out]: PEFT's adapters are Linear layers).
//
// The adapters come from and go to the model's per-unit adapter buffers (Transformer::
// unit_lora(), f32, laid out by worker/model/param_layout.h). Stateless; thread-safe for
// distinct directories.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/tensor.h"
#include "proto/job.pb.h"
#include "worker/model/param_layout.h"

namespace zt {

inline constexpr char kPeftConfigFile[] = "adapter_config.json";
inline constexpr char kPeftWeightsFile[] = "adapter_model.safetensors";

// The PEFT state-dict name of block `block`'s adapter matrix `a_or_b` ("lora_A" | "lora_B")
// of `site`, for `family`.
std::string PeftTensorName(zerotrain::ModelConfig::Family family, int block, const LoraSite& site,
                           const char* a_or_b);

struct PeftWriteOptions {
  // adapter_config.json's base_model_name_or_path: where the base came from (model.init_from),
  // or empty (written as null).
  std::string base_model_name_or_path;
};
// Writes `dir` (created if missing; its two files replaced atomically, each written to a
// temporary name, synced and renamed) from `unit_lora` (one f32 buffer per unit, empty for
// units without adapters), for `model` (with model.lora) and its layout. InvalidArgument
// without model.lora or when a buffer's size differs from the layout; errno-derived statuses
// naming the file otherwise.
absl::Status WritePeftAdapter(const zerotrain::ModelConfig& model, const ModelLayout& layout,
                              const std::vector<Tensor>& unit_lora, const std::string& dir,
                              const PeftWriteOptions& options = {});

// Reads the adapter directory `dir` into `unit_lora`. Its adapter_config.json must be a LORA
// config whose r, lora_alpha and target_modules (as a set) equal model.lora's, and whose
// bias is "none": FailedPrecondition naming the field, both values and model.lora.init_from
// otherwise. Every adapter tensor the layout has must be present with its shape (F32, F16 or
// BF16): NotFound / InvalidArgument naming the tensor and the file. DataLoss for a corrupt
// file.
absl::Status ReadPeftAdapter(const zerotrain::ModelConfig& model, const ModelLayout& layout,
                             const std::string& dir, const std::vector<Tensor>& unit_lora);

// The merged model W + scale·B·A as a Hugging Face safetensors file (ExportHuggingFace's layout
// and guarantees) for a LoRA `model` whose base is not quantized: `unit_params` are its f32
// base buffers (left unchanged: each unit is merged in a copy, so the export holds one more
// f32 copy of the model), `unit_lora` its adapters, `dtype` the file's (the base's original
// dtype). InvalidArgument for a quantized base (NF4/INT8), or buffers that do not match.
absl::Status ExportMergedHuggingFace(const std::string& path, const zerotrain::ModelConfig& model,
                                     const ModelLayout& layout,
                                     const std::vector<const float*>& unit_params,
                                     const std::vector<Tensor>& unit_lora, DType dtype);

}  // namespace zt
