// `zt submit JOBFILE [--watch] [--priority N]`: validate the job here (paths included, so a
// typo fails before it queues), then send it as the file wrote it with absolute paths: the
// coordinator applies the defaults and plans what the file leaves open.
#include <iostream>

#include "absl/strings/str_cat.h"
#include "cli/commands.h"
#include "cli/job_paths.h"
#include "cli/remote_client.h"
#include "worker/status_macros.h"

namespace zt::cli {

absl::Status RunSubmit(const SubmitFlags& flags) {
  ZT_ASSIGN_OR_RETURN(zerotrain::JobSpec job, JobToSubmit(flags.job_file));
  if (flags.has_priority) job.mutable_scheduling()->set_priority(flags.priority);
  ZT_ASSIGN_OR_RETURN(const RemoteClient client, ConnectRemote(flags.remote));
  zerotrain::SubmitJobRequest request;
  *request.mutable_spec() = std::move(job);
  zerotrain::Job submitted;
  auto context = client.Context();
  const grpc::Status status = client.jobs->SubmitJob(context.get(), request, &submitted);
  if (!status.ok()) return client.Error(status, absl::StrCat("SubmitJob ", flags.job_file));
  if (flags.remote.json) {
    ZT_RETURN_IF_ERROR(PrintJson(submitted));
  } else {
    std::cout << submitted.id() << std::endl;
  }
  if (!flags.watch) return absl::OkStatus();
  return WatchUntilDone(client, submitted.id(), flags.remote.json);
}

}  // namespace zt::cli
