// `zt watch JOB` (and `zt submit --watch`): the job's event stream until it finishes.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/commands.h"
#include "cli/output_format.h"
#include "cli/remote_client.h"
#include "cli/remote_format.h"
#include "cli/terminal_pictures.h"
#include "worker/status_macros.h"

namespace zt::cli {
namespace {

// A coordinator restart takes seconds; longer than this and the batch script decides (exit 4).
constexpr auto kReconnectFor = std::chrono::seconds(60);

bool Finished(zerotrain::Job::State s) {
  return s == zerotrain::Job::SUCCEEDED || s == zerotrain::Job::FAILED ||
         s == zerotrain::Job::CANCELLED;
}

// How many recent losses the live sparkline shows.
constexpr size_t kRecentLosses = 64;

// The live block on a terminal: the pictures and the progress line, redrawn in place and
// erased before any other line.
class LiveLine {
 public:
  explicit LiveLine(bool tty) : tty_(tty) {}
  ~LiveLine() { Clear(); }

  bool tty() const { return tty_; }
  // `block`: lines separated by '\n', each narrower than the terminal, the last without one.
  void Show(const std::string& block) {
    Erase();
    std::cerr << block << std::flush;
    lines_ = 1 + static_cast<int>(std::count(block.begin(), block.end(), '\n'));
  }
  void Clear() {
    Erase();
    std::cerr << std::flush;
  }

 private:
  void Erase() {
    if (lines_ == 0) return;
    if (lines_ > 1) std::cerr << "\033[" << lines_ - 1 << "A";
    std::cerr << "\r\033[J";
    lines_ = 0;
  }

  bool tty_;
  int lines_ = 0;  // shown now
};

}  // namespace

absl::Status WatchUntilDone(const RemoteClient& client, const std::string& job_id, bool json) {
  LiveLine live(!json && isatty(STDERR_FILENO) == 1);
  int64_t after = 0;
  std::vector<double> losses;  // the last kRecentLosses, oldest first
  zerotrain::Job::State state = zerotrain::Job::STATE_UNSPECIFIED;
  auto unavailable_since = std::chrono::steady_clock::time_point::max();
  while (true) {
    std::unique_ptr<grpc::ClientContext> context = client.Context(std::chrono::milliseconds(0));
    zerotrain::WatchJobRequest request;
    request.set_job_id(job_id);
    request.set_after_sequence(after);
    auto reader = client.jobs->WatchJob(context.get(), request);
    zerotrain::JobEvent event;
    while (reader->Read(&event)) {
      unavailable_since = std::chrono::steady_clock::time_point::max();
      if (event.has_progress()) {
        losses.push_back(event.progress().loss());
        if (losses.size() > kRecentLosses) losses.erase(losses.begin());
      }
      after = event.sequence();
      const bool state_changed = event.state() != state;
      state = event.state();
      if (json) {
        ZT_ASSIGN_OR_RETURN(const std::string line, ToJson(event, /*indent=*/false));
        std::cout << line << std::endl;
      } else if (event.has_progress() && !state_changed) {
        if (live.tty()) {
          const int width = TerminalColumns(STDERR_FILENO) - 1;
          live.Show(FormatTrainingPictures(losses, event.progress(), width) +
                    FormatProgressLine(event.progress(), width));
        } else {
          std::cerr << FormatEventLine(event) << "\n";
        }
      } else {
        live.Clear();
        std::cerr << FormatEventLine(event) << "\n";
      }
    }
    const grpc::Status status = reader->Finish();
    if (Finished(state)) break;
    const bool retry = status.ok() || status.error_code() == grpc::StatusCode::UNAVAILABLE;
    if (!retry) return client.Error(status, absl::StrCat("WatchJob ", job_id));
    const auto now = std::chrono::steady_clock::now();
    if (unavailable_since == std::chrono::steady_clock::time_point::max()) {
      unavailable_since = now;
      live.Clear();
      if (!json) std::cerr << "coordinator " << client.address << " unavailable; reconnecting\n";
    }
    if (now - unavailable_since > kReconnectFor) {
      return client.Error(
          status.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "stream ended early") : status,
          absl::StrCat("WatchJob ", job_id, " (reconnecting for 60 s)"));
    }
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  live.Clear();
  // The failure reason is on the job, not on the last event.
  std::string reason;
  int32_t failure_code = 0;
  if (state == zerotrain::Job::FAILED) {
    zerotrain::GetJobRequest request;
    request.set_job_id(job_id);
    zerotrain::Job job;
    auto context = client.Context();
    if (client.jobs->GetJob(context.get(), request, &job).ok()) {
      reason = job.failure_reason();
      failure_code = job.failure_code();
    }
  }
  if (!json) std::cout << job_id << " " << JobStateName(state) << "\n";
  return JobOutcome(state, job_id, reason, failure_code);
}

absl::Status RunWatch(const JobFlags& flags) {
  ZT_ASSIGN_OR_RETURN(const RemoteClient client, ConnectRemote(flags.remote));
  return WatchUntilDone(client, flags.job_id, flags.remote.json);
}

}  // namespace zt::cli
