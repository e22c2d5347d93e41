// What a node checks of a job before it starts the job's ranks: that every input the job
// names is there on this node and usable, so that a job which can never run fails its first
// attempt with the field and the path, instead of every rank failing on its own and the
// coordinator restarting it until its restarts are spent.
//
// Checked (after ValidatedJob, which has checked that data files and model.init_from exist
// and are readable regular files or directories):
//   data.train, data.val  each entry expands (worker/job/data_paths.h) to at least one file;
//                         every file is inside the allowed roots after symlinks (a pattern's
//                         matches are only known here) and has a readable token-shard header
//                         that agrees with its size;
//   checkpoint.dir        exists or can be created, is a directory, and this process may
//                         write into it.
// Stateless and thread-safe.
#pragma once

#include "absl/status/status.h"
#include "proto/job.pb.h"
#include "worker/job/allowed_roots.h"

namespace zt {

// OK, or the first problem with its own code, naming the field and the path: NotFound (a
// pattern matches nothing, a file vanished), PermissionDenied (outside the roots, not
// writable), InvalidArgument (not a token shard), DataLoss (a truncated shard),
// FailedPrecondition (checkpoint.dir is not a directory), or the operating system's error.
absl::Status CheckJobInputsOnNode(const zerotrain::JobSpec& spec, const AllowedRoots& roots);

}  // namespace zt
