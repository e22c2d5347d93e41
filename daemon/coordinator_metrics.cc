#include "daemon/coordinator_metrics.h"

#include "prometheus/histogram.h"

namespace zt {
namespace {

// Control-plane calls take from ~100 µs (a heartbeat) to seconds (a submit that plans a
// large model); long-polls (WatchJob, Assignments, StoreWait) reach the buckets' top.
const prometheus::Histogram::BucketBoundaries& RpcBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30};
  return *buckets;
}

}  // namespace

CoordinatorMetrics::CoordinatorMetrics(prometheus::Registry& registry)
    : jobs_(prometheus::BuildGauge()
                .Name("zt_jobs")
                .Help("Jobs known to the coordinator, by state")
                .Register(registry)),
      job_state_(prometheus::BuildGauge()
                     .Name("zt_job_state")
                     .Help("1 for each job the coordinator holds, labelled with its state")
                     .Register(registry)),
      restarts_(prometheus::BuildCounter()
                    .Name("zt_job_restarts_total")
                    .Help("The job's attempts that ended with a failure or preemption and were "
                          "requeued")
                    .Register(registry)),
      node_healthy_(prometheus::BuildGauge()
                        .Name("zt_node_healthy")
                        .Help("1 while the node's heartbeats arrive; 0 once it is declared dead "
                              "or has not registered again since the coordinator started")
                        .Register(registry)),
      nodes_registered_(prometheus::BuildGauge()
                            .Name("zt_nodes_registered")
                            .Help("Nodes the coordinator has a record of")
                            .Register(registry)
                            .Add({})),
      nodes_healthy_(prometheus::BuildGauge()
                         .Name("zt_nodes_healthy")
                         .Help("Registered nodes whose heartbeats arrive")
                         .Register(registry)
                         .Add({})),
      rpc_duration_(prometheus::BuildHistogram()
                        .Name("zt_rpc_duration_seconds")
                        .Help("Control-plane RPC handler latency, by method")
                        .Register(registry)),
      store_writable_(prometheus::BuildGauge()
                          .Name("zt_store_writable")
                          .Help("1 while the coordinator's state store writes; 0 while it cannot "
                                "(a full disk: placement pauses until it writes again)")
                          .Register(registry)
                          .Add({})),
      store_write_errors_(prometheus::BuildCounter()
                              .Name("zt_store_write_errors_total")
                              .Help("Writes to the coordinator's state store that failed")
                              .Register(registry)
                              .Add({})) {
  SetJobs({});
  store_writable_.Set(1);
}

void CoordinatorMetrics::SetJobs(const std::map<zerotrain::Job::State, int>& counts) {
  const google::protobuf::EnumDescriptor* states = zerotrain::Job::State_descriptor();
  for (int i = 0; i < states->value_count(); ++i) {
    const auto state = static_cast<zerotrain::Job::State>(states->value(i)->number());
    if (state == zerotrain::Job::STATE_UNSPECIFIED) continue;
    auto it = counts.find(state);
    jobs_.Add({{"state", states->value(i)->name()}}).Set(it == counts.end() ? 0 : it->second);
  }
}

CoordinatorMetrics::JobSeries& CoordinatorMetrics::JobSeriesOf(const std::string& job_id) {
  JobSeries& series = jobs_by_id_[job_id];
  if (series.restarts == nullptr) series.restarts = &restarts_.Add({{"job_id", job_id}});
  return series;
}

void CoordinatorMetrics::SetJobStates(const std::map<std::string, zerotrain::Job::State>& states) {
  absl::MutexLock lock(&mu_);
  for (auto it = jobs_by_id_.begin(); it != jobs_by_id_.end();) {
    if (states.contains(it->first)) {
      ++it;
      continue;
    }
    if (it->second.state_gauge != nullptr) job_state_.Remove(it->second.state_gauge);
    restarts_.Remove(it->second.restarts);
    it = jobs_by_id_.erase(it);
  }
  for (const auto& [job_id, state] : states) SetJobStateLocked(job_id, state);
}

void CoordinatorMetrics::SetJobState(const std::string& job_id, zerotrain::Job::State state) {
  absl::MutexLock lock(&mu_);
  SetJobStateLocked(job_id, state);
}

void CoordinatorMetrics::SetJobStateLocked(const std::string& job_id,
                                           zerotrain::Job::State state) {
  JobSeries& series = JobSeriesOf(job_id);
  if (series.state == state && series.state_gauge != nullptr) return;
  if (series.state_gauge != nullptr) job_state_.Remove(series.state_gauge);
  series.state = state;
  series.state_gauge =
      &job_state_.Add({{"job_id", job_id}, {"state", zerotrain::Job::State_Name(state)}});
  series.state_gauge->Set(1);
}

void CoordinatorMetrics::RemoveJob(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_by_id_.find(job_id);
  if (it == jobs_by_id_.end()) return;
  if (it->second.state_gauge != nullptr) job_state_.Remove(it->second.state_gauge);
  restarts_.Remove(it->second.restarts);
  jobs_by_id_.erase(it);
}

void CoordinatorMetrics::AddRestart(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  JobSeriesOf(job_id).restarts->Increment();
}

void CoordinatorMetrics::SetNodeHealth(const std::map<std::string, bool>& healthy) {
  absl::MutexLock lock(&mu_);
  for (auto it = node_healthy_by_id_.begin(); it != node_healthy_by_id_.end();) {
    if (healthy.contains(it->first)) {
      ++it;
      continue;
    }
    node_healthy_.Remove(it->second);
    it = node_healthy_by_id_.erase(it);
  }
  for (const auto& [node, up] : healthy) SetNodeHealthyLocked(node, up);
}

void CoordinatorMetrics::SetNodeHealthy(const std::string& node_id, bool healthy) {
  absl::MutexLock lock(&mu_);
  SetNodeHealthyLocked(node_id, healthy);
}

void CoordinatorMetrics::SetNodeHealthyLocked(const std::string& node_id, bool healthy) {
  prometheus::Gauge*& gauge = node_healthy_by_id_[node_id];
  if (gauge == nullptr) gauge = &node_healthy_.Add({{"node", node_id}});
  gauge->Set(healthy ? 1 : 0);
}

void CoordinatorMetrics::SetNodes(int registered, int healthy) {
  nodes_registered_.Set(registered);
  nodes_healthy_.Set(healthy);
}

void CoordinatorMetrics::SetStore(bool writable, int64_t write_errors) {
  store_writable_.Set(writable ? 1 : 0);
  absl::MutexLock lock(&mu_);
  if (write_errors > store_write_errors_seen_) {
    store_write_errors_.Increment(static_cast<double>(write_errors - store_write_errors_seen_));
    store_write_errors_seen_ = write_errors;
  }
}

void CoordinatorMetrics::ObserveRpc(const std::string& method, double seconds) {
  prometheus::Histogram* histogram;
  {
    absl::MutexLock lock(&mu_);
    auto [it, inserted] = rpc_by_method_.try_emplace(method, nullptr);
    if (inserted) it->second = &rpc_duration_.Add({{"method", method}}, RpcBuckets());
    histogram = it->second;
  }
  histogram->Observe(seconds);
}

}  // namespace zt
