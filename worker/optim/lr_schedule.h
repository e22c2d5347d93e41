// Learning-rate schedules: linear warmup, then constant, cosine or linear decay to
// min_lr_ratio · lr at max_steps (nanoGPT / DeepSpeed WarmupDecayLR shapes).
#pragma once

#include <cstdint>

#include "proto/job.pb.h"

namespace zt {

// The learning rate of optimizer step `step` (0-based) of a run of `max_steps` steps.
float LearningRate(const zerotrain::OptimizerConfig& config, int64_t step, int64_t max_steps);

}  // namespace zt
