// `zt submit JOBFILE [--deepspeed DS_CONFIG] [--watch] [--priority N]`: validate the job here
// (paths included, so a typo fails before it queues), then send it as the file wrote it with
// absolute paths: the coordinator applies the defaults and plans what the file leaves open. The
// request carries a fresh request_id, so the call is retried like a read
// (RemoteClient::CallIdempotent).
#include <iostream>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "cli/commands.h"
#include "cli/job_paths.h"
#include "cli/remote_client.h"
#include "worker/status_macros.h"

namespace zt::cli {
namespace {

// 128 random bits as 32 hex digits (SubmitJobRequest.request_id).
std::string NewRequestId() {
  std::random_device random;
  std::string id;
  for (int i = 0; i < 4; ++i) id += absl::StrCat(absl::Hex(random(), absl::kZeroPad8));
  return id;
}

}  // namespace

absl::Status RunSubmit(const SubmitFlags& flags) {
  ZT_ASSIGN_OR_RETURN(zerotrain::JobSpec job, JobToSubmit(flags.job_file, flags.deepspeed));
  if (flags.has_priority) job.mutable_scheduling()->set_priority(flags.priority);
  ZT_ASSIGN_OR_RETURN(const RemoteClient client, ConnectRemote(flags.remote));
  zerotrain::SubmitJobRequest request;
  *request.mutable_spec() = std::move(job);
  // The same id on every try: a retry after a lost reply returns the job the first try made.
  request.set_request_id(NewRequestId());
  zerotrain::Job submitted;
  ZT_RETURN_IF_ERROR(client.CallIdempotent(
      absl::StrCat("SubmitJob ", flags.job_file), [&](grpc::ClientContext* context) {
        return client.jobs->SubmitJob(context, request, &submitted);
      }));
  if (flags.remote.json) {
    ZT_RETURN_IF_ERROR(PrintJson(submitted));
  } else {
    std::cout << submitted.id() << std::endl;
  }
  if (!flags.watch) return absl::OkStatus();
  return WatchUntilDone(client, submitted.id(), flags.remote.json);
}

}  // namespace zt::cli
