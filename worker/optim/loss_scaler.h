// Dynamic loss scaling for fp16 training (Micikevicius et al.; DeepSpeed's DynamicLossScaler
// knobs and defaults).
//
// The loss is multiplied by scale() before the backward so that small fp16 gradients do not
// flush to zero; the optimizer divides it back out (grad_scale = 1/scale). After each step the
// trainer reports whether any gradient was inf/NaN:
//   overflow: the step is skipped. With hysteresis h, the first h−1 overflows in a row only
//     spend hysteresis; later ones halve the scale (never below min_scale).
//   clean: after `window` clean steps since the last overflow the scale doubles and the
//     hysteresis is restored — or, with consecutive_hysteresis, every clean step restores it.
// A run whose scale sits at min_scale and still overflows `max_overflows_at_min_scale` times
// in a row cannot make progress: Update() returns FailedPrecondition instead of looping.
// A static scale never changes (and never fails). Not thread-safe; one per rank.
#pragma once

#include <cstdint>

#include "absl/status/status.h"

namespace zt {

struct LossScalerConfig {
  int initial_power = 16;  // initial scale 2^16
  int64_t window = 1000;
  int hysteresis = 2;
  double min_scale = 1.0;
  double static_scale = 0;  // > 0: a fixed scale, no dynamics
  int64_t max_overflows_at_min_scale = 100;
  bool consecutive_hysteresis = false;
};

// What a checkpoint saves and a resumed run restores.
struct LossScalerState {
  double scale = 1;
  int hysteresis_left = 0;
  int64_t clean_steps = 0;             // since the last overflow (or the start)
  int64_t overflows_at_min_scale = 0;  // in a row
  int64_t skipped_steps = 0;           // cumulative
};

class LossScaler {
 public:
  explicit LossScaler(const LossScalerConfig& config);

  double scale() const { return state_.scale; }
  int64_t skipped_steps() const { return state_.skipped_steps; }
  const LossScalerState& state() const { return state_; }
  void Restore(const LossScalerState& state) { state_ = state; }

  // Records the outcome of a step (true: some gradient was inf/NaN, the step is skipped).
  absl::Status Update(bool overflow);

 private:
  LossScalerConfig config_;
  LossScalerState state_;
};

}  // namespace zt
