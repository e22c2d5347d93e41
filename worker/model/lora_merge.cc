#include "worker/model/lora_merge.h"

#include "absl/strings/str_cat.h"

namespace zt {

absl::Status MergeLoraAdapters(const ModelLayout& layout, const std::vector<Tensor>& unit_lora,
                               const std::vector<Tensor>& unit_params) {
  if (!layout.lora) return absl::InvalidArgumentError("MergeLoraAdapters: the layout has no LoRA");
  if (unit_lora.size() != layout.units.size() || unit_params.size() != layout.units.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("MergeLoraAdapters: ", unit_params.size(), " parameter and ", unit_lora.size(),
                     " adapter buffers for ", layout.units.size(), " units"));
  }
  const int64_t r = layout.lora_rank;
  for (size_t u = 0; u < layout.units.size(); ++u) {
    const UnitLayout& unit = layout.units[u];
    if (unit.lora.empty()) continue;
    const Tensor& params = unit_params[u];
    const Tensor& lora = unit_lora[u];
    if (params.dtype() != DType::kF32 || params.numel() < unit.numel || lora.empty() ||
        lora.dtype() != DType::kF32 || lora.numel() < unit.lora_numel) {
      return absl::InvalidArgumentError(
          absl::StrCat("MergeLoraAdapters: unit ", unit.name, ": parameters ", params.DebugString(),
                       " and adapters ", lora.DebugString(), " must be f32 of at least ",
                       unit.numel, " and ", unit.lora_numel, " elements"));
    }
    for (const LoraSite& site : unit.lora) {
      const ParamSpec* base = unit.Find(site.weight);
      if (base == nullptr || base->quantized) {
        return absl::InvalidArgumentError(absl::StrCat("MergeLoraAdapters: ", unit.name, ".",
                                                       site.weight,
                                                       " is quantized; merge into f32 weights"));
      }
      const float* a = lora.data<float>() + site.a.offset;  // (r, in)
      const float* b = lora.data<float>() + site.b.offset;  // (rows, r)
      float* w = params.data<float>() + base->offset + site.row_begin * site.in;
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < site.rows; ++i) {
        for (int64_t j = 0; j < site.in; ++j) {
          double ba = 0;
          for (int64_t k = 0; k < r; ++k) ba += double{b[i * r + k]} * double{a[k * site.in + j]};
          w[i * site.in + j] =
              static_cast<float>(double{w[i * site.in + j]} + layout.lora_scale * ba);
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace zt
