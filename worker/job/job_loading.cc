#include "worker/job/job_loading.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kernels/status_macros.h"
#include "worker/job/job_defaults.h"
#include "worker/job/job_file.h"
#include "worker/job/job_validation.h"

namespace zt {

absl::StatusOr<zerotrain::JobSpec> ValidatedJob(zerotrain::JobSpec job,
                                                const JobLoadOptions& options) {
  ApplyJobDefaults(&job);
  ZT_RETURN_IF_ERROR(ValidateJobSpec(job));
  if (options.check_paths) ZT_RETURN_IF_ERROR(CheckJobPaths(job));
  if (options.check_engine_support) ZT_RETURN_IF_ERROR(CheckEngineSupport(job));
  return job;
}

absl::StatusOr<zerotrain::JobSpec> LoadValidatedJob(const std::string& path,
                                                    const JobLoadOptions& options) {
  ZT_ASSIGN_OR_RETURN(zerotrain::JobSpec job, LoadJobFile(path));
  absl::StatusOr<zerotrain::JobSpec> validated = ValidatedJob(std::move(job), options);
  if (!validated.ok()) {
    // Name the file on every line (validation reports one violation per line), keep the
    // code: the caller decides by it what to do next.
    std::vector<std::string> lines = absl::StrSplit(validated.status().message(), '\n');
    for (std::string& line : lines) line = absl::StrCat(path, ": ", line);
    return absl::Status(validated.status().code(), absl::StrJoin(lines, "\n"));
  }
  return validated;
}

}  // namespace zt
