// Paths of a submitted job, made absolute on the submitting machine: a coordinator and its
// nodes resolve them, not the directory `zt submit` ran in.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "proto/job.pb.h"

namespace zt::cli {

// Rewrites data.train[i], data.val[i], model.init_from and checkpoint.dir (when set) that are
// relative as `cwd`/path, lexically normalized ("a/../b" → "b"); absolute ones are only
// normalized. Symlinks are left alone: the coordinator checks where they resolve. `cwd` must
// be absolute.
void AbsolutizeJobPaths(zerotrain::JobSpec* job, const std::string& cwd);

// The spec `zt submit` and `zt resume --job` send: the job file validated here with every
// check (defaults, rules, paths, engine support; errors name the file), then sent as the
// file wrote it — not the defaulted copy, whose defaults would pin parallel.zero_stage and
// memory.activation_checkpointing, which the coordinator plans when the file leaves them —
// with its paths made absolute against the current directory. A non-empty `deepspeed` config
// is laid over the job file first (worker/job/deepspeed_config.h), so what is sent is the job
// file as written plus what the config sets.
absl::StatusOr<zerotrain::JobSpec> JobToSubmit(const std::string& job_file,
                                               const std::string& deepspeed = "");

}  // namespace zt::cli
