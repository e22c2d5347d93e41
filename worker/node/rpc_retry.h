// Retrying control-plane calls through a coordinator restart.
//
// A call is retried while it fails with UNAVAILABLE (the coordinator is down or restarting, or
// the connection broke) or CANCELLED (the server cancelled the call as it shut down; the node's
// own calls are never cancelled by the node), with exponential backoff from initial_backoff
// doubling up to max_backoff, until the streak of failures has lasted `retry_for`, the
// caller's deadline would pass during the next backoff, or `give_up` returns true.
#pragma once

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"

namespace zt {

struct RetryPolicy {
  absl::Duration retry_for = absl::Seconds(120);
  absl::Duration initial_backoff = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Seconds(2);
};

// Whether a failed call may be sent again (see above).
bool IsRetryable(const grpc::Status& status);

// The first status `call` returns that is not retryable, as an absl::Status prefixed with
// `what`; or UNAVAILABLE prefixed with `what` saying how long the coordinator was unreachable.
absl::Status CallRetrying(const RetryPolicy& policy, const std::string& what, absl::Time deadline,
                          const std::function<grpc::Status()>& call,
                          const std::function<bool()>& give_up = nullptr);

}  // namespace zt
