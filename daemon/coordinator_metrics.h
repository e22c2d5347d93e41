// The coordinator's Prometheus metrics (prometheus-cpp), registered in a registry the caller
// owns and exposes (ztd's Exposer):
//   zt_jobs{state}                          gauge: jobs in each Job.State (every state listed)
//   zt_job_restarts_total                   counter: attempts that ended and were requeued
//   zt_nodes_registered, zt_nodes_healthy   gauges
//   zt_rpc_duration_seconds{method}         histogram: control-plane handler latency
// Thread-safe (prometheus-cpp metrics are).
#pragma once

#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "proto/control.pb.h"

namespace zt {

class CoordinatorMetrics {
 public:
  // `registry` outlives this object.
  explicit CoordinatorMetrics(prometheus::Registry& registry);

  // Every state's count (states absent from `counts` are set to 0).
  void SetJobs(const std::map<zerotrain::Job::State, int>& counts);
  void AddRestart();
  void SetNodes(int registered, int healthy);
  // `method` is the RPC's name ("SubmitJob").
  void ObserveRpc(const std::string& method, double seconds);

 private:
  prometheus::Family<prometheus::Gauge>& jobs_;
  prometheus::Counter& restarts_;
  prometheus::Gauge& nodes_registered_;
  prometheus::Gauge& nodes_healthy_;
  prometheus::Family<prometheus::Histogram>& rpc_duration_;
  absl::Mutex mu_;
  std::map<std::string, prometheus::Histogram*> rpc_by_method_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zt
