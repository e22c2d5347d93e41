// Folding LoRA adapters into their base weights: W ← W + scale·B·A for every adapter of a
// layout (worker/model/param_layout.h), the merged model a Hugging Face export of a LoRA job
// writes (`zt export --merge-adapters`, docs/lora.md). Stateless.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "kernels/tensor.h"
#include "worker/model/param_layout.h"

namespace zt {

// Adds scale·B·A into the rows [row_begin, row_begin + rows) of each adapted weight in
// `unit_params` (one f32 flat buffer per unit, in the layout's offsets), each element summed
// in float64 over the rank and rounded once. `unit_lora` holds each unit's f32 adapter buffer
// (empty for units without adapters). InvalidArgument when the layout has no LoRA, a weight
// is quantized (dequantize it into an f32 layout first) or a buffer does not match the layout.
absl::Status MergeLoraAdapters(const ModelLayout& layout, const std::vector<Tensor>& unit_lora,
                               const std::vector<Tensor>& unit_params);

}  // namespace zt
