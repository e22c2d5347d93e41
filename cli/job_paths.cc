#include "cli/job_paths.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "worker/job/job_file.h"
#include "worker/job/job_loading.h"
#include "worker/status_macros.h"

namespace zt::cli {
namespace {

std::string Absolute(const std::string& path, const std::filesystem::path& cwd) {
  const std::filesystem::path p(path);
  return (p.is_absolute() ? p : cwd / p).lexically_normal().string();
}

}  // namespace

void AbsolutizeJobPaths(zerotrain::JobSpec* job, const std::string& cwd) {
  const std::filesystem::path base(cwd);
  zerotrain::DataConfig& data = *job->mutable_data();
  for (std::string& p : *data.mutable_train()) p = Absolute(p, base);
  for (std::string& p : *data.mutable_val()) p = Absolute(p, base);
  if (!job->model().init_from().empty()) {
    job->mutable_model()->set_init_from(Absolute(job->model().init_from(), base));
  }
  if (!job->checkpoint().dir().empty()) {
    job->mutable_checkpoint()->set_dir(Absolute(job->checkpoint().dir(), base));
  }
}

absl::StatusOr<zerotrain::JobSpec> JobToSubmit(const std::string& job_file,
                                               const std::string& deepspeed) {
  const JobLoadOptions options{.deepspeed_config = deepspeed};
  ZT_RETURN_IF_ERROR(LoadValidatedJob(job_file, options).status());
  ZT_ASSIGN_OR_RETURN(zerotrain::JobSpec job, LoadJobSource(job_file, options));
  std::error_code error;
  const std::filesystem::path cwd = std::filesystem::current_path(error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("current directory: ", error.message(), " (relative job paths need it)"));
  }
  AbsolutizeJobPaths(&job, cwd.string());
  return job;
}

}  // namespace zt::cli
