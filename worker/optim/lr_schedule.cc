#include "worker/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace zt {

float LearningRate(const zerotrain::OptimizerConfig& config, int64_t step, int64_t max_steps) {
  const double peak = config.lr();
  const auto& s = config.schedule();
  const int64_t warmup = s.warmup_steps();
  // Step 0 of a warmup already trains: it gets lr·1/warmup, not 0.
  if (step < warmup) return static_cast<float>(peak * static_cast<double>(step + 1) / warmup);
  const double floor = peak * s.min_lr_ratio();
  const int64_t decay_steps = max_steps - warmup;
  if (s.decay() == zerotrain::OptimizerConfig::CONSTANT || decay_steps <= 1) {
    return static_cast<float>(peak);
  }
  // progress runs from 0 at the first post-warmup step to 1 at the last step.
  const double progress =
      std::clamp(static_cast<double>(step - warmup) / static_cast<double>(decay_steps - 1), 0.0, 1.0);
  double factor = 1.0 - progress;  // LINEAR
  if (s.decay() == zerotrain::OptimizerConfig::COSINE) {
    factor = 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  }
  return static_cast<float>(floor + (peak - floor) * factor);
}

}  // namespace zt
