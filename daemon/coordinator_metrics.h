// The coordinator's Prometheus metrics (prometheus-cpp), registered in a registry the caller
// owns and exposes (ztd's Exposer):
//   zt_jobs{state}                          gauge: jobs in each Job.State (every state listed)
//   zt_job_restarts_total                   counter: attempts that ended and were requeued
//   zt_nodes_registered, zt_nodes_healthy   gauges
//   zt_rpc_duration_seconds{method}         histogram: control-plane handler latency
//   zt_store_writable                       gauge: 1 while the state store writes, 0 while it
//                                           cannot (a full disk; placement pauses)
//   zt_store_write_errors_total             counter: state store writes that failed
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
  // `write_errors`: the store's count since it opened (the counter advances by the increase).
  void SetStore(bool writable, int64_t write_errors);

 private:
  prometheus::Family<prometheus::Gauge>& jobs_;
  prometheus::Counter& restarts_;
  prometheus::Gauge& nodes_registered_;
  prometheus::Gauge& nodes_healthy_;
  prometheus::Family<prometheus::Histogram>& rpc_duration_;
  prometheus::Gauge& store_writable_;
  prometheus::Counter& store_write_errors_;
  absl::Mutex mu_;
  int64_t store_write_errors_seen_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, prometheus::Histogram*> rpc_by_method_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zt
