#include "worker/job/lora_validation.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "worker/model/lora_targets.h"

namespace zt {

using zerotrain::JobSpec;
using zerotrain::LoraConfig;
using zerotrain::ModelConfig;
using zerotrain::PrecisionConfig;

void ApplyLoraDefaults(JobSpec* spec) {
  ModelConfig& model = *spec->mutable_model();
  if (!model.has_lora()) return;
  LoraConfig& lora = *model.mutable_lora();
  if (!lora.has_rank()) lora.set_rank(8);
  if (!lora.has_alpha()) lora.set_alpha(8.0f);
  if (lora.target_modules().empty()) {
    // PEFT's TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING for llama and gpt2.
    if (model.family() == ModelConfig::LLAMA) {
      lora.add_target_modules("q_proj");
      lora.add_target_modules("v_proj");
    } else if (model.family() == ModelConfig::GPT2) {
      lora.add_target_modules("c_attn");
    }
  }
  if (model.base_dtype() == ModelConfig::BASE_DTYPE_UNSPECIFIED) {
    switch (spec->precision().param_dtype()) {
      case PrecisionConfig::BF16:
        model.set_base_dtype(ModelConfig::BF16);
        break;
      case PrecisionConfig::FP16:
        model.set_base_dtype(ModelConfig::FP16);
        break;
      default:
        model.set_base_dtype(ModelConfig::FP32);
        break;
    }
  }
  // LLM.int8()'s threshold (Dettmers et al. 2022, section 3.2): 6.0 isolates the outlier
  // features of every model size the paper measured.
  if (model.base_dtype() == ModelConfig::INT8 && !model.has_int8_threshold()) {
    model.set_int8_threshold(6.0f);
  }
}

std::vector<std::string> LoraViolations(const JobSpec& spec) {
  std::vector<std::string> lines;
  const ModelConfig& m = spec.model();
  const std::string base = ModelConfig::BaseDType_Name(m.base_dtype());
  if (m.has_int8_threshold()) {
    if (m.base_dtype() != ModelConfig::INT8) {
      lines.push_back(absl::StrCat("model.int8_threshold: ", m.int8_threshold(),
                                   " is LLM.int8()'s outlier threshold and applies to "
                                   "model.base_dtype INT8 only (got base_dtype ",
                                   base.empty() ? absl::StrCat(m.base_dtype()) : base, ")"));
    } else if (!(m.int8_threshold() > 0)) {  // NaN fails too
      lines.push_back(absl::StrCat("model.int8_threshold: must be > 0 (got ", m.int8_threshold(),
                                   "; Infinity turns the outlier decomposition off)"));
    }
  }
  if (!m.has_lora()) {
    if (m.base_dtype() != ModelConfig::BASE_DTYPE_UNSPECIFIED) {
      lines.push_back(absl::StrCat(
          "model.base_dtype: ", base.empty() ? absl::StrCat(m.base_dtype()) : base,
          " describes the frozen base of a LoRA job and needs model.lora; without it every "
          "weight trains and precision.param_dtype stores them (a quantized base has no "
          "gradient or optimizer state)"));
    }
    return lines;
  }
  if (base.empty() || m.base_dtype() == ModelConfig::BASE_DTYPE_UNSPECIFIED) {
    lines.push_back(absl::StrCat("model.base_dtype: must be FP32, BF16, FP16, NF4 or INT8 (got ",
                                 base.empty() ? absl::StrCat(m.base_dtype()) : base, ")"));
  }
  const LoraConfig& lora = m.lora();
  if (!lora.has_rank() || !lora.has_alpha()) {
    lines.push_back("model.lora: rank or alpha not set (ApplyJobDefaults must run first)");
    return lines;
  }
  if (lora.rank() < 1) {
    lines.push_back(absl::StrCat("model.lora.rank: must be >= 1 (got ", lora.rank(), ")"));
  }
  if (!std::isfinite(lora.alpha()) || lora.alpha() <= 0) {
    lines.push_back(
        absl::StrCat("model.lora.alpha: must be a finite number > 0 (got ", lora.alpha(), ")"));
  }
  if (!std::isfinite(lora.dropout()) || lora.dropout() < 0 || lora.dropout() >= 1) {
    lines.push_back(
        absl::StrCat("model.lora.dropout: must be in [0, 1) (got ", lora.dropout(), ")"));
  }
  const std::span<const LoraTarget> table = LoraTargets(m.family());
  if (table.empty()) return lines;  // ValidateModel names the family
  if (lora.target_modules().empty()) {
    lines.push_back(absl::StrCat("model.lora.target_modules: at least one module is required (",
                                 ModelConfig::Family_Name(m.family()), ": ",
                                 LoraModuleNames(m.family()), ")"));
  }
  // The smallest side of every adapted matrix bounds the rank (a rank above it adds
  // parameters without adding expressiveness, and PEFT refuses nothing there, but the
  // factorisation is then not low-rank at all).
  const int64_t C = m.d_model(), F = m.d_ff();
  const int64_t D = m.n_head() > 0 ? C / m.n_head() : 0;
  const int64_t kv = m.n_kv_head() * D;
  for (int i = 0; i < lora.target_modules_size(); ++i) {
    const std::string& name = lora.target_modules(i);
    const std::string field = absl::StrCat("model.lora.target_modules[", i, "]");
    const auto found = std::find_if(table.begin(), table.end(),
                                    [&](const LoraTarget& t) { return t.module == name; });
    if (found == table.end()) {
      lines.push_back(
          absl::StrCat(field, ": '", name, "' is not a ", ModelConfig::Family_Name(m.family()),
                       " module; the adaptable ones are ", LoraModuleNames(m.family())));
      continue;
    }
    for (int j = 0; j < i; ++j) {
      if (lora.target_modules(j) == name) {
        lines.push_back(absl::StrCat(field, ": '", name, "' is listed twice (first at [", j,
                                     "]); each module takes one adapter"));
        break;
      }
    }
    const int64_t out = found->rows == LoraRows::kK || found->rows == LoraRows::kV       ? kv
                        : found->rows == LoraRows::kGate || found->rows == LoraRows::kUp ? F
                                                                                         : 0;
    const int64_t smallest = out > 0 ? std::min({C, out}) : std::min(C, F);
    if (lora.rank() > smallest && smallest > 0) {
      lines.push_back(absl::StrCat("model.lora.rank: ", lora.rank(), " exceeds ", smallest,
                                   ", the smaller side of ", name,
                                   "'s matrix; a LoRA rank must be at most it"));
    }
  }
  return lines;
}

}  // namespace zt
