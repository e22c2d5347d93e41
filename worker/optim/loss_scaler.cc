#include "worker/optim/loss_scaler.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"

namespace zt {

LossScaler::LossScaler(const LossScalerConfig& config) : config_(config) {
  state_.scale = config.static_scale > 0 ? config.static_scale
                                         : std::ldexp(1.0, config.initial_power);
  state_.hysteresis_left = config.hysteresis;
}

absl::Status LossScaler::Update(bool overflow) {
  if (!overflow) {
    state_.overflows_at_min_scale = 0;
    if (config_.static_scale > 0) return absl::OkStatus();
    ++state_.clean_steps;
    if (config_.consecutive_hysteresis) state_.hysteresis_left = config_.hysteresis;
    if (state_.clean_steps % config_.window == 0) {
      state_.scale *= 2;
      state_.hysteresis_left = config_.hysteresis;
    }
    return absl::OkStatus();
  }
  ++state_.skipped_steps;
  state_.clean_steps = 0;
  if (config_.static_scale > 0) return absl::OkStatus();
  if (state_.scale <= config_.min_scale) {
    if (++state_.overflows_at_min_scale >= config_.max_overflows_at_min_scale) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "fp16 loss scale is at precision.loss_scale.min_scale %g and gradients overflowed "
          "in %d steps in a row: the model diverged or fp16 cannot represent it; use BF16, "
          "lower optimizer.lr, or lower min_scale",
          config_.min_scale, state_.overflows_at_min_scale));
    }
  }
  if (state_.hysteresis_left > 1) {
    --state_.hysteresis_left;
  } else {
    state_.scale = std::max(state_.scale / 2, config_.min_scale);
  }
  return absl::OkStatus();
}

}  // namespace zt
