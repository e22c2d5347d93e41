// The rules of proto/job.proto's ParallelConfig: world size, ZeRO, hybrid sharding, and the
// tensor / pipeline / sequence parallel layout (Megatron-LM's rules where it has one). Part of
// ValidateJobSpec (worker/job/job_validation.h); kept apart because the layout's rules cross
// into the model's shape (heads, KV heads, layers). Stateless and thread-safe.
#pragma once

#include <string>
#include <vector>

#include "proto/job.pb.h"

namespace zt {

// One line per violated rule, each naming the field, its value and the rule
// ("parallel.tensor_parallel: 3 does not divide model.n_head 8 ..."), on a spec that
// ApplyJobDefaults completed. Empty when all hold.
std::vector<std::string> ParallelViolations(const zerotrain::JobSpec& spec);

}  // namespace zt
