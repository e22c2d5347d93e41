// `zt list`, `zt status JOB`, `zt cancel JOB`, `zt resume JOB|CHECKPOINT`: one call each.
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/commands.h"
#include "cli/job_paths.h"
#include "cli/output_format.h"
#include "cli/remote_client.h"
#include "cli/remote_format.h"
#include "worker/status_macros.h"

namespace zt::cli {

namespace {

absl::Status PrintJob(const zerotrain::Job& job, bool json) {
  if (json) return PrintJson(job);
  std::cout << FormatJobStatus(job, NowMs());
  return absl::OkStatus();
}

}  // namespace

absl::Status RunList(const ListFlags& flags) {
  zerotrain::ListJobsRequest request;
  if (!flags.state.empty()) {
    zerotrain::Job::State state;
    if (!zerotrain::Job::State_Parse(absl::AsciiStrToUpper(flags.state), &state) ||
        state == zerotrain::Job::STATE_UNSPECIFIED) {
      std::vector<std::string> names;
      for (int s = zerotrain::Job::PENDING; s <= zerotrain::Job::State_MAX; ++s) {
        names.push_back(zerotrain::Job::State_Name(s));
      }
      return absl::InvalidArgumentError(
          absl::StrCat("--state: '", flags.state, "' is not one of ", absl::StrJoin(names, ", ")));
    }
    request.add_states(state);
  }
  ZT_ASSIGN_OR_RETURN(const RemoteClient client, ConnectRemote(flags.remote));
  zerotrain::ListJobsResponse response;
  auto context = client.Context();
  const grpc::Status status = client.jobs->ListJobs(context.get(), request, &response);
  if (!status.ok()) return client.Error(status, "ListJobs");
  if (!flags.remote.json) {
    std::cout << FormatJobTable(response.jobs(), NowMs());
    return absl::OkStatus();
  }
  std::vector<std::string> objects;
  for (const zerotrain::Job& job : response.jobs()) {
    ZT_ASSIGN_OR_RETURN(std::string text, ToJson(job));
    objects.push_back(std::move(text));
  }
  std::cout << "[" << absl::StrJoin(objects, ",\n") << "]\n";
  return absl::OkStatus();
}

absl::Status RunStatus(const JobFlags& flags) {
  ZT_ASSIGN_OR_RETURN(const RemoteClient client, ConnectRemote(flags.remote));
  zerotrain::GetJobRequest request;
  request.set_job_id(flags.job_id);
  zerotrain::Job job;
  auto context = client.Context();
  const grpc::Status status = client.jobs->GetJob(context.get(), request, &job);
  if (!status.ok()) return client.Error(status, absl::StrCat("GetJob ", flags.job_id));
  return PrintJob(job, flags.remote.json);
}

absl::Status RunCancel(const JobFlags& flags) {
  ZT_ASSIGN_OR_RETURN(const RemoteClient client, ConnectRemote(flags.remote));
  zerotrain::CancelJobRequest request;
  request.set_job_id(flags.job_id);
  zerotrain::Job job;
  auto context = client.Context();
  const grpc::Status status = client.jobs->CancelJob(context.get(), request, &job);
  if (!status.ok()) return client.Error(status, absl::StrCat("CancelJob ", flags.job_id));
  if (flags.remote.json) return PrintJson(job);
  std::cout << job.id() << " " << JobStateName(job.state()) << "\n";
  return absl::OkStatus();
}

absl::Status RunResume(const ResumeFlags& flags) {
  zerotrain::ResumeJobRequest request;
  request.set_fallback(flags.fallback);
  std::error_code error;
  if (std::filesystem::exists(flags.target, error)) {
    if (flags.job_file.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--job: required to resume from the checkpoint directory ", flags.target,
                       " (the job file to continue)"));
    }
    ZT_ASSIGN_OR_RETURN(*request.mutable_spec(), JobToSubmit(flags.job_file));
    request.set_checkpoint(std::filesystem::absolute(flags.target).lexically_normal().string());
  } else {
    if (!flags.job_file.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--job: only with a checkpoint directory; '", flags.target,
                       "' is not a path here, so it names a job, which keeps its own spec"));
    }
    request.set_job_id(flags.target);
  }
  ZT_ASSIGN_OR_RETURN(const RemoteClient client, ConnectRemote(flags.remote));
  zerotrain::Job job;
  auto context = client.Context();
  const grpc::Status status = client.jobs->ResumeJob(context.get(), request, &job);
  if (!status.ok()) return client.Error(status, absl::StrCat("ResumeJob ", flags.target));
  if (flags.remote.json) return PrintJson(job);
  std::cout << job.id() << std::endl;
  return absl::OkStatus();
}

}  // namespace zt::cli
