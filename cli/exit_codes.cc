#include "cli/commands.h"
#include "worker/job/failure_kind.h"

namespace zt::cli {

int ExitCodeFor(const absl::Status& status, VerbKind kind) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return 0;
    case absl::StatusCode::kCancelled:
      return 3;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return kind == VerbKind::kRemote ? 4 : 1;
    case absl::StatusCode::kUnauthenticated:
      return 5;
    default:
      // The classification the daemon restarts by: a permanent error is the input's fault.
      return IsPermanentFailure(status) ? 2 : 1;
  }
}

absl::Status JobOutcome(zerotrain::Job::State state, const std::string& job_id,
                        const std::string& reason, int32_t failure_code) {
  const std::string why = reason.empty() ? "" : ": " + reason;
  switch (state) {
    case zerotrain::Job::SUCCEEDED:
      return absl::OkStatus();
    case zerotrain::Job::CANCELLED:
      return absl::CancelledError("job " + job_id + " was CANCELLED" + why);
    case zerotrain::Job::FAILED: {
      const auto code = static_cast<absl::StatusCode>(failure_code);
      if (IsPermanentFailure(absl::Status(code, "x"))) {
        return absl::Status(code, "job " + job_id + " FAILED" + why);
      }
      return absl::AbortedError("job " + job_id + " FAILED" + why);
    }
    default:
      return absl::UnknownError("job " + job_id + " is " + zerotrain::Job::State_Name(state) +
                                ", not finished" + why);
  }
}

}  // namespace zt::cli
