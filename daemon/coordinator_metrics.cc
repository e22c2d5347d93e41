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
      restarts_(prometheus::BuildCounter()
                    .Name("zt_job_restarts_total")
                    .Help("Job attempts that ended with a failure or preemption and were requeued")
                    .Register(registry)
                    .Add({})),
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

void CoordinatorMetrics::AddRestart() { restarts_.Increment(); }

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
