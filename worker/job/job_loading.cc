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

absl::StatusOr<zerotrain::JobSpec> JobForPlanning(zerotrain::JobSpec job,
                                                  const JobLoadOptions& options) {
  ZT_RETURN_IF_ERROR(ValidatedJob(job, options).status());
  const bool stage_set = job.parallel().has_zero_stage();
  const auto checkpointing = job.memory().activation_checkpointing();
  ApplyJobDefaults(&job);
  if (!stage_set) job.mutable_parallel()->clear_zero_stage();
  job.mutable_memory()->set_activation_checkpointing(checkpointing);
  return job;
}

namespace {

// Names the file on every line (validation reports one violation per line) and keeps the
// code: the caller decides by it what to do next.
absl::Status InFile(const std::string& path, const absl::Status& status) {
  std::vector<std::string> lines = absl::StrSplit(status.message(), '\n');
  for (std::string& line : lines) line = absl::StrCat(path, ": ", line);
  return absl::Status(status.code(), absl::StrJoin(lines, "\n"));
}

}  // namespace

absl::StatusOr<zerotrain::JobSpec> LoadValidatedJob(const std::string& path,
                                                    const JobLoadOptions& options) {
  ZT_ASSIGN_OR_RETURN(zerotrain::JobSpec job, LoadJobFile(path));
  absl::StatusOr<zerotrain::JobSpec> validated = ValidatedJob(std::move(job), options);
  if (!validated.ok()) return InFile(path, validated.status());
  return validated;
}

absl::StatusOr<zerotrain::JobSpec> LoadJobForPlanning(const std::string& path,
                                                      const JobLoadOptions& options) {
  ZT_ASSIGN_OR_RETURN(zerotrain::JobSpec job, LoadJobFile(path));
  absl::StatusOr<zerotrain::JobSpec> planned = JobForPlanning(std::move(job), options);
  if (!planned.ok()) return InFile(path, planned.status());
  return planned;
}

}  // namespace zt
