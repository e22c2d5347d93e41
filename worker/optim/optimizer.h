// The optimizer of one rank: AdamW, SGD, 8-bit AdamW or Adafactor over the units' flat
// buffers.
//
// Every tensor is stepped on its own slice of its unit's buffer, with the state slices that
// worker/plan/optimizer_state_layout.h assigns it (the same description the memory plan
// reserved the state from). Weight decay is decoupled and, unless
// optimizer.decay_all_parameters, applies only to the matrices of linear layers — not to
// norms, biases or embeddings (GPT-2/nanoGPT practice). Not thread-safe: one per rank.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/device.h"
#include "kernels/tensor.h"
#include "proto/job.pb.h"
#include "worker/model/param_layout.h"
#include "worker/plan/arena.h"
#include "worker/plan/optimizer_state_layout.h"

namespace zt {

class Optimizer {
 public:
  static absl::StatusOr<Optimizer> Create(const zerotrain::OptimizerConfig& config,
                                          const ModelLayout& layout, const Arenas& state);

  // One update of every unit: param ← update(param, grad · grad_scale) at learning rate `lr`
  // (Adafactor with relative_step ignores it). `grad_scale` carries gradient clipping (and
  // loss-scale removal).
  absl::Status Step(const DeviceContext& ctx, const std::vector<Tensor>& params,
                    const std::vector<Tensor>& grads, float lr, float grad_scale);

  // Updates applied so far (the bias-correction step is this + 1 during Step).
  int64_t steps_taken() const { return steps_taken_; }

 private:
  struct Unit {
    UnitOptimizerState state;
    std::vector<Tensor> buffers;  // parallel to state.buffers, from the arenas
  };
  Optimizer() = default;
  absl::Status StepTensor(const DeviceContext& ctx, const Unit& unit, const ParamSpec& p,
                          const TensorState& t, const Tensor& param, const Tensor& grad, float lr,
                          float grad_scale, int64_t step) const;

  zerotrain::OptimizerConfig config_;
  ModelLayout layout_;
  std::vector<Unit> units_;
  int64_t steps_taken_ = 0;
};

}  // namespace zt
