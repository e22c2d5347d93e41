// `zt list` (page by page), `zt status JOB`, `zt cancel JOB`, `zt delete JOB`,
// `zt resume JOB|CHECKPOINT`: the calls that are safe to repeat are retried
// (RemoteClient::CallIdempotent); ResumeJob is not.
#include <unistd.h>

#include <algorithm>
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
#include "cli/terminal_pictures.h"
#include "worker/node/rpc_retry.h"
#include "worker/status_macros.h"

namespace zt::cli {

namespace {

// What `zt list` asks for per call (ListJobsRequest.page_size allows up to 1000).
constexpr int64_t kListPageSize = 500;

absl::Status PrintJob(const zerotrain::Job& job, bool json) {
  if (json) return PrintJson(job);
  std::cout << FormatJobStatus(job, NowMs());
  return absl::OkStatus();
}

}  // namespace

absl::Status RunList(const ListFlags& flags) {
  if (flags.limit < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--limit: ", flags.limit, " is negative (0 or absent: every job)"));
  }
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
  // Page by page until the last page or --limit: the coordinator never sends them all at once.
  google::protobuf::RepeatedPtrField<zerotrain::JobSummary> jobs;
  do {
    const int64_t wanted = flags.limit > 0 ? flags.limit - jobs.size() : kListPageSize;
    request.set_page_size(static_cast<int32_t>(std::min<int64_t>(wanted, kListPageSize)));
    zerotrain::ListJobsResponse response;
    ZT_RETURN_IF_ERROR(client.CallIdempotent("ListJobs", [&](grpc::ClientContext* context) {
      return client.jobs->ListJobs(context, request, &response);
    }));
    for (zerotrain::JobSummary& job : *response.mutable_jobs()) *jobs.Add() = std::move(job);
    request.set_page_token(response.next_page_token());
  } while (!request.page_token().empty() && (flags.limit == 0 || jobs.size() < flags.limit));
  if (!flags.remote.json) {
    std::cout << FormatJobTable(jobs, NowMs());
    return absl::OkStatus();
  }
  std::vector<std::string> objects;
  for (const zerotrain::JobSummary& job : jobs) {
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
  ZT_RETURN_IF_ERROR(client.CallIdempotent(
      absl::StrCat("GetJob ", flags.job_id),
      [&](grpc::ClientContext* context) { return client.jobs->GetJob(context, request, &job); }));
  ZT_RETURN_IF_ERROR(PrintJob(job, flags.remote.json));
  // On a terminal, pictures below the text (scripts reading a pipe see the text alone).
  if (!flags.remote.json && isatty(STDOUT_FILENO) == 1) {
    const std::vector<double> losses(job.recent_loss().begin(), job.recent_loss().end());
    std::cout << FormatTrainingPictures(losses, job.progress(), TerminalColumns(STDOUT_FILENO) - 1);
  }
  return absl::OkStatus();
}

absl::Status RunCancel(const JobFlags& flags) {
  ZT_ASSIGN_OR_RETURN(const RemoteClient client, ConnectRemote(flags.remote));
  zerotrain::CancelJobRequest request;
  request.set_job_id(flags.job_id);
  zerotrain::Job job;
  ZT_RETURN_IF_ERROR(client.CallIdempotent(
      absl::StrCat("CancelJob ", flags.job_id),
      [&](grpc::ClientContext* context) { return client.jobs->CancelJob(context, request, &job); }));
  if (flags.remote.json) return PrintJson(job);
  std::cout << job.id() << " " << JobStateName(job.state()) << "\n";
  return absl::OkStatus();
}

absl::Status RunDelete(const JobFlags& flags) {
  ZT_ASSIGN_OR_RETURN(const RemoteClient client, ConnectRemote(flags.remote));
  zerotrain::DeleteJobRequest request;
  request.set_job_id(flags.job_id);
  zerotrain::DeleteJobResponse response;
  // A retry after a lost reply finds the job gone: NOT_FOUND then means deleted.
  bool retried = false;
  absl::Status status = client.CallIdempotent(
      absl::StrCat("DeleteJob ", flags.job_id), [&](grpc::ClientContext* context) {
        const grpc::Status s = client.jobs->DeleteJob(context, request, &response);
        if (!s.ok() && IsRetryable(s)) retried = true;
        return s;
      });
  if (retried && absl::IsNotFound(status)) status = absl::OkStatus();
  ZT_RETURN_IF_ERROR(status);
  if (flags.remote.json) return PrintJson(response);
  std::cout << flags.job_id << " deleted\n";
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
    ZT_ASSIGN_OR_RETURN(*request.mutable_spec(), JobToSubmit(flags.job_file, flags.deepspeed));
    request.set_checkpoint(std::filesystem::absolute(flags.target).lexically_normal().string());
  } else {
    if (!flags.job_file.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--job: only with a checkpoint directory; '", flags.target,
                       "' is not a path here, so it names a job, which keeps its own spec"));
    }
    if (!flags.deepspeed.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--deepspeed: only with --job and a checkpoint directory; '", flags.target,
                       "' names a job, which keeps its own spec"));
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
