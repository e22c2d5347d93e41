#include "daemon/metrics_server.h"

#include <exception>
#include <vector>

#include "absl/strings/str_cat.h"

namespace zt {

absl::StatusOr<std::unique_ptr<prometheus::Exposer>> ServeMetrics(
    const std::string& address, const std::shared_ptr<prometheus::Registry>& registry) {
  // civetweb's option names (docs/UserManual.md of civetweb 1.15).
  std::vector<std::string> options = {
      "listening_ports",    address,
      "num_threads",        absl::StrCat(kMetricsThreads),
      "request_timeout_ms", absl::StrCat(kMetricsRequestTimeoutMs),
      "enable_keep_alive",  "no",
  };
  try {
    auto exposer = std::make_unique<prometheus::Exposer>(std::move(options));
    exposer->RegisterCollectable(registry);
    return exposer;
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-addr ", address, ": cannot listen: ", e.what()));
  }
}

}  // namespace zt
