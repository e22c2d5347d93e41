// A PEFT adapter directory of known, nonzero values (B included, unlike PEFT's init), for the
// tests that start a LoRA job from model.lora.init_from: a rank that ignored the file, or read
// another unit's or share's values, starts elsewhere.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/tensor.h"
#include "proto/job.pb.h"
#include "worker/checkpoint/peft_adapter.h"
#include "worker/model/param_layout.h"

namespace zt::testing {

// Writes `dir` (WritePeftAdapter) with every adapter of `layout` (the one-rank model's) set to
// a fixed pattern in [-0.09, 0.09], and returns those values per unit (empty for a unit
// without adapters).
inline absl::StatusOr<std::vector<std::vector<float>>> WritePatternPeftAdapter(
    const zerotrain::ModelConfig& model, const ModelLayout& layout, const std::string& dir) {
  std::vector<std::vector<float>> given(layout.units.size());
  std::vector<Tensor> views(layout.units.size());
  for (size_t u = 0; u < layout.units.size(); ++u) {
    for (int64_t i = 0; i < layout.units[u].lora_numel; ++i) {
      given[u].push_back(0.01f * static_cast<float>((i * 7 + static_cast<int64_t>(u) * 3) % 19) -
                         0.09f);
    }
    if (!given[u].empty()) {
      views[u] = Tensor(given[u].data(), DType::kF32, {layout.units[u].lora_numel});
    }
  }
  const absl::Status written = WritePeftAdapter(model, layout, views, dir);
  if (!written.ok()) return written;
  return given;
}

}  // namespace zt::testing
