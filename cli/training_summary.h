// One line per concern of how a job trains (batch, precision, optimizer and schedule,
// sharding), for `zt estimate --deepspeed`, so a user sees what their DeepSpeed config became.
#pragma once

#include <string>

#include "proto/job.pb.h"

namespace zt::cli {

// `job` has its defaults applied (job_loading.h); every line starts with two spaces and ends
// with a newline. Example first line:
//   "  batch: 4 per rank × 8 accumulation steps × 2 ranks = 64 sequences per step".
std::string TrainingSummary(const zerotrain::JobSpec& job);

}  // namespace zt::cli
