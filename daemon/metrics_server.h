// ztd's Prometheus endpoint: prometheus-cpp's Exposer (civetweb underneath) configured so
// that idle or slow connections cannot keep a scrape waiting.
//
// civetweb hands each accepted connection to one worker thread, which keeps it until the
// client closes it or a read times out. Its defaults (prometheus-cpp asks for 2 threads;
// request_timeout_ms 30 s) let two idle TCP connections block /metrics for 30 s. Here:
//   - kMetricsThreads workers, so 100 idle connections leave threads for the scrape;
//   - kMetricsRequestTimeoutMs: a connection that has not sent its whole request by then is
//     closed, so even more idle connections than threads delay a scrape by a bounded time
//     (about (idle - threads) / threads × the timeout), never for good;
//   - no keep-alive (civetweb's default): a connection is released after each response.
// Idle workers sleep on a condition variable; their stacks (1 MiB, thread_stack_floor.cc) are
// mapped lazily, so the threads cost address space, not memory.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"

namespace zt {

inline constexpr int kMetricsThreads = 128;
inline constexpr int kMetricsRequestTimeoutMs = 2000;

// Serves `registry` at http://`address`/metrics (host:port; port 0 picks a free one, which
// the Exposer's GetListeningPorts() tells). InvalidArgument naming the address when it cannot
// listen there.
absl::StatusOr<std::unique_ptr<prometheus::Exposer>> ServeMetrics(
    const std::string& address, const std::shared_ptr<prometheus::Registry>& registry);

}  // namespace zt
