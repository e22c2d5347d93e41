// The coordinator's Prometheus metrics (prometheus-cpp), registered in a registry the caller
// owns and exposes (ztd's Exposer):
//   zt_jobs{state}                          gauge: jobs in each Job.State (every state listed)
//   zt_job_state{job_id, state}             gauge: 1 for each job the coordinator holds, its
//                                           state the label (alerts name the FAILED job)
//   zt_job_restarts_total{job_id}           counter: the job's attempts that ended and were
//                                           requeued (since this coordinator started)
//   zt_nodes_registered, zt_nodes_healthy   gauges
//   zt_node_healthy{node}                   gauge: 1 while the node's heartbeats arrive, 0 once
//                                           declared dead (or not re-registered after a restart)
//   zt_rpc_duration_seconds{method}         histogram: control-plane handler latency
//   zt_store_writable                       gauge: 1 while the state store writes, 0 while it
//                                           cannot (a full disk; placement pauses)
//   zt_store_write_errors_total             counter: state store writes that failed
// The training job is labelled `job_id`: Prometheus owns `job` and `instance`.
// Thread-safe.
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
  // Each job's state, by id; jobs absent lose their series (deleted jobs). O(jobs): for a
  // full resynchronisation; a state change of one job goes through SetJobState.
  void SetJobStates(const std::map<std::string, zerotrain::Job::State>& states);
  // One job's state series (created on first use).
  void SetJobState(const std::string& job_id, zerotrain::Job::State state);
  // Drops a deleted job's series.
  void RemoveJob(const std::string& job_id);
  void AddRestart(const std::string& job_id);
  void SetNodes(int registered, int healthy);
  // Each node's health, by id; nodes absent lose their series. O(nodes), like SetJobStates.
  void SetNodeHealth(const std::map<std::string, bool>& healthy);
  // One node's health series (created on first use).
  void SetNodeHealthy(const std::string& node_id, bool healthy);
  // `method` is the RPC's name ("SubmitJob").
  void ObserveRpc(const std::string& method, double seconds);
  // `write_errors`: the store's count since it opened (the counter advances by the increase).
  void SetStore(bool writable, int64_t write_errors);

 private:
  prometheus::Family<prometheus::Gauge>& jobs_;
  prometheus::Family<prometheus::Gauge>& job_state_;
  prometheus::Family<prometheus::Counter>& restarts_;
  prometheus::Family<prometheus::Gauge>& node_healthy_;
  prometheus::Gauge& nodes_registered_;
  prometheus::Gauge& nodes_healthy_;
  prometheus::Family<prometheus::Histogram>& rpc_duration_;
  prometheus::Gauge& store_writable_;
  prometheus::Counter& store_write_errors_;
  absl::Mutex mu_;
  int64_t store_write_errors_seen_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, prometheus::Histogram*> rpc_by_method_ ABSL_GUARDED_BY(mu_);
  struct JobSeries {
    zerotrain::Job::State state = zerotrain::Job::STATE_UNSPECIFIED;
    prometheus::Gauge* state_gauge = nullptr;
    prometheus::Counter* restarts = nullptr;
  };
  JobSeries& JobSeriesOf(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetJobStateLocked(const std::string& job_id, zerotrain::Job::State state)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetNodeHealthyLocked(const std::string& node_id, bool healthy)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::map<std::string, JobSeries> jobs_by_id_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, prometheus::Gauge*> node_healthy_by_id_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zt
