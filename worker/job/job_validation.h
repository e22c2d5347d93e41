// The rules of proto/job.proto, checked once at the entry so the engine can trust the spec.
//
// Each function reports every violation it finds in one status, one line per violation, each
// naming the field, its value and the rule ("model.d_model: 250 is not divisible by
// model.n_head 4"). Stateless and thread-safe.
#pragma once

#include "absl/status/status.h"
#include "proto/job.pb.h"

namespace zt {

// Checks every rule documented in proto/job.proto on a spec that ApplyJobDefaults has
// completed (an `optional` field still unset is reported as a violation). Returns OK or
// InvalidArgument listing all violations. Does not touch the file system.
absl::Status ValidateJobSpec(const zerotrain::JobSpec& spec);

// Checks that every data.train and data.val file and model.init_from (when set) exists and is
// a readable regular file. Relative paths are resolved against the current directory.
// Returns OK, or one status listing every bad path by field and index
// ("data.train[1]: 'x.bin' does not exist"): NotFound when any path is missing, else
// PermissionDenied when any is unreadable, else InvalidArgument (not a regular file).
absl::Status CheckJobPaths(const zerotrain::JobSpec& spec);

// Checks what this engine version cannot run yet, though the schema allows it: gradient
// reduction in a dtype other than the gradients', and offload (planned, not yet trained
// with). Returns OK or FailedPrecondition listing every such field. Kept apart from
// ValidateJobSpec so each line can be deleted when its feature lands. (CUDA jobs pass: a
// build without CUDA refuses them when a rank starts, worker/train/rank_device.h, and the
// coordinator places them only on nodes that announced CUDA devices.)
absl::Status CheckEngineSupport(const zerotrain::JobSpec& spec);

}  // namespace zt
