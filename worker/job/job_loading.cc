#include "worker/job/job_loading.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kernels/status_macros.h"
#include "worker/job/deepspeed_config.h"
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
  const bool stage_set = job.parallel().has_zero_stage();
  const auto checkpointing = job.memory().activation_checkpointing();
  const auto offload_optimizer = job.offload().optimizer();
  const auto offload_params = job.offload().params();
  // An offload the job pins with the stage left to the planner is validated at the lowest
  // stage that allows it (the planner only considers those).
  zerotrain::JobSpec checked = job;
  if (!stage_set) {
    using Offload = zerotrain::OffloadConfig;
    auto moved = [](Offload::Device d) { return d == Offload::CPU || d == Offload::NVME; };
    const int lowest = moved(offload_params) ? 3 : moved(offload_optimizer) ? 1 : 0;
    if (lowest > 0) checked.mutable_parallel()->set_zero_stage(lowest);
  }
  ZT_RETURN_IF_ERROR(ValidatedJob(std::move(checked), options).status());
  const bool tensor_set = job.parallel().has_tensor_parallel();
  const bool pipeline_set = job.parallel().has_pipeline_parallel();
  const bool shard_group_set = job.parallel().has_shard_group_size();
  ApplyJobDefaults(&job);
  if (!stage_set) job.mutable_parallel()->clear_zero_stage();
  // The layout is the planner's to choose too; the shard group's default follows it.
  if (!tensor_set) job.mutable_parallel()->clear_tensor_parallel();
  if (!pipeline_set) job.mutable_parallel()->clear_pipeline_parallel();
  if (!shard_group_set) job.mutable_parallel()->clear_shard_group_size();
  job.mutable_memory()->set_activation_checkpointing(checkpointing);
  job.mutable_offload()->set_optimizer(offload_optimizer);
  job.mutable_offload()->set_params(offload_params);
  return job;
}

namespace {

// Names the file on every line (validation reports one violation per line) and keeps the
// code: the caller decides by it what to do next.
// With a DeepSpeed config the values checked may come from either file: both are named.
absl::Status InFile(const std::string& path, const JobLoadOptions& options,
                    const absl::Status& status) {
  const std::string label = options.deepspeed_config.empty()
                                ? path
                                : absl::StrCat(path, " with ", options.deepspeed_config);
  std::vector<std::string> lines = absl::StrSplit(status.message(), '\n');
  for (std::string& line : lines) line = absl::StrCat(label, ": ", line);
  return absl::Status(status.code(), absl::StrJoin(lines, "\n"));
}

}  // namespace

absl::StatusOr<zerotrain::JobSpec> LoadJobSource(const std::string& path,
                                                 const JobLoadOptions& options) {
  ZT_ASSIGN_OR_RETURN(zerotrain::JobSpec job, LoadJobFile(path));
  if (!options.deepspeed_config.empty()) {
    ZT_ASSIGN_OR_RETURN(job,
                        ApplyDeepSpeedConfigFile(options.deepspeed_config, std::move(job),
                                                 {.world_size = options.deepspeed_world_size}));
  }
  if (options.zero_stage >= 0) job.mutable_parallel()->set_zero_stage(options.zero_stage);
  return job;
}

absl::StatusOr<zerotrain::JobSpec> LoadValidatedJob(const std::string& path,
                                                    const JobLoadOptions& options) {
  ZT_ASSIGN_OR_RETURN(zerotrain::JobSpec job, LoadJobSource(path, options));
  absl::StatusOr<zerotrain::JobSpec> validated = ValidatedJob(std::move(job), options);
  if (!validated.ok()) return InFile(path, options, validated.status());
  return validated;
}

absl::StatusOr<zerotrain::JobSpec> LoadJobForPlanning(const std::string& path,
                                                      const JobLoadOptions& options) {
  ZT_ASSIGN_OR_RETURN(zerotrain::JobSpec job, LoadJobSource(path, options));
  absl::StatusOr<zerotrain::JobSpec> planned = JobForPlanning(std::move(job), options);
  if (!planned.ok()) return InFile(path, options, planned.status());
  return planned;
}

}  // namespace zt
