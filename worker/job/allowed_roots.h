// Which filesystem paths a job may touch on this node (`ztd --node --allowed-root DIR`...).
//
// A path is allowed when it resolves, after every symlink, to a root or to something beneath
// one (roots are resolved the same way). A path that does not exist yet (a checkpoint.dir a
// fresh job creates) is judged by its nearest existing ancestor, resolved, with the missing
// components appended; a missing component ".." is refused, since it could climb out of the
// root once something creates the directories beneath it. Relative paths resolve against the
// daemon's working directory.
//
// No roots: no restriction (a node on a laptop or in a test; production nodes pass their data
// and checkpoint filesystems).
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/job.pb.h"

namespace zt {

class AllowedRoots {
 public:
  // NotFound naming the root when one does not exist (a typo would otherwise refuse every
  // job, or none).
  static absl::StatusOr<AllowedRoots> Create(const std::vector<std::string>& roots);

  // OK, or PermissionDenied "<field> <path> is outside the allowed roots (<roots>)".
  absl::Status Check(const std::string& field, const std::string& path) const;
  // Every path of the job: data.train[i], data.val[i], model.init_from, checkpoint.dir, and
  // offload.nvme_path when the job offloads to NVMe. All
  // violations in one PermissionDenied, one per line. For a data pattern (worker/job/
  // data_paths.h) its directory part is checked; the files it matches are checked where it
  // is expanded.
  absl::Status CheckJob(const zerotrain::JobSpec& job) const;

  const std::vector<std::string>& roots() const { return roots_; }

 private:
  explicit AllowedRoots(std::vector<std::string> roots) : roots_(std::move(roots)) {}
  std::vector<std::string> roots_;  // resolved
};

}  // namespace zt
