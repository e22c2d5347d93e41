// The optimizer of one rank: AdamW or SGD over the units' flat buffers.
//
// Weight decay is decoupled and, unless optimizer.decay_all_parameters, applies only to the
// matrices of linear layers — not to norms, biases or embeddings (GPT-2/nanoGPT practice).
// Each unit's buffer is therefore stepped as a few contiguous segments, each with its own
// decay. States ("<unit>.adam_m", "<unit>.adam_v" or "<unit>.momentum") come from the memory
// plan's arenas. Not thread-safe: one per rank.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/device.h"
#include "kernels/tensor.h"
#include "proto/job.pb.h"
#include "worker/model/param_layout.h"
#include "worker/plan/arena.h"

namespace zt {

class Optimizer {
 public:
  static absl::StatusOr<Optimizer> Create(const zerotrain::OptimizerConfig& config,
                                          const ModelLayout& layout, const Arenas& state);

  // One update of every unit: param ← update(param, grad · grad_scale) at learning rate `lr`.
  // `grad_scale` carries gradient clipping (and, later, loss-scale removal).
  absl::Status Step(const DeviceContext& ctx, const std::vector<Tensor>& params,
                    const std::vector<Tensor>& grads, float lr, float grad_scale);

  // Updates applied so far (AdamW's bias-correction step is this + 1 during Step).
  int64_t steps_taken() const { return steps_taken_; }

 private:
  struct Segment {
    int64_t offset = 0;
    int64_t numel = 0;
    bool decay = false;
  };
  Optimizer() = default;

  zerotrain::OptimizerConfig config_;
  std::vector<std::vector<Segment>> segments_;  // per unit
  std::vector<Tensor> m_, v_, momentum_;        // per unit, as the type needs
  int64_t steps_taken_ = 0;
};

}  // namespace zt
