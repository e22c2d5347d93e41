#include "worker/node/rpc_retry.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "worker/node/control_channel.h"

namespace zt {

bool IsRetryable(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::UNAVAILABLE ||
         status.error_code() == grpc::StatusCode::CANCELLED;
}

absl::Status CallRetrying(const RetryPolicy& policy, const std::string& what, absl::Time deadline,
                          const std::function<grpc::Status()>& call,
                          const std::function<bool()>& give_up) {
  absl::Duration backoff = policy.initial_backoff;
  const absl::Time streak_start = absl::Now();
  while (true) {
    const grpc::Status status = call();
    if (!IsRetryable(status)) return FromGrpc(status, what);
    const absl::Time now = absl::Now();
    if (now - streak_start >= policy.retry_for || now + backoff >= deadline ||
        (give_up && give_up())) {
      return absl::UnavailableError(absl::StrCat(what, ": coordinator unreachable for ",
                                                 absl::FormatDuration(now - streak_start), ": ",
                                                 status.error_message()));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(absl::ToInt64Microseconds(backoff)));
    backoff = std::min(backoff * 2, policy.max_backoff);
  }
}

}  // namespace zt
