// The control plane's three sync gRPC services (proto/control.proto) over one Coordinator.
// Every handler first checks the bearer token (daemon/auth.h), then calls the coordinator;
// absl::Status codes map 1:1 onto grpc::StatusCode. Streaming handlers (WatchJob,
// Assignments) and StoreWait wait in slices of at most kServiceWaitSlice, so a cancelled
// client, ServiceShared::stopping or a coordinator Shutdown() ends them within one slice.
// Thread-safe: gRPC runs handlers on many threads.
#pragma once

#include <atomic>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "daemon/auth.h"
#include "daemon/coordinator.h"
#include "daemon/coordinator_metrics.h"
#include "grpcpp/grpcpp.h"
#include "proto/control.grpc.pb.h"

namespace zt {

inline constexpr absl::Duration kServiceWaitSlice = absl::Milliseconds(250);
// StoreWait's timeout_ms is capped at this (0 or negative: the cap).
inline constexpr absl::Duration kMaxStoreWait = absl::Minutes(10);

// What the three services share. Outlives the server.
struct ServiceShared {
  Coordinator* coordinator = nullptr;
  std::string token;
  // May be null.
  CoordinatorMetrics* metrics = nullptr;
  // Set before the server shuts down: long-running handlers return UNAVAILABLE.
  std::atomic<bool> stopping{false};
};

// The same code and message.
grpc::Status ToGrpc(const absl::Status& status);

// Records the handler's duration in zt_rpc_duration_seconds{method} when it goes out of scope.
class RpcTimer {
 public:
  RpcTimer(CoordinatorMetrics* metrics, const char* method)
      : metrics_(metrics), method_(method), start_(absl::Now()) {}
  ~RpcTimer() {
    if (metrics_ != nullptr) {
      metrics_->ObserveRpc(method_, absl::ToDoubleSeconds(absl::Now() - start_));
    }
  }
  RpcTimer(const RpcTimer&) = delete;
  RpcTimer& operator=(const RpcTimer&) = delete;

 private:
  CoordinatorMetrics* metrics_;
  const char* method_;
  absl::Time start_;
};

// Returns the Authorize() failure from the enclosing handler (which has `shared_`).
#define ZT_AUTHORIZE(context)                                      \
  do {                                                             \
    grpc::Status zt_auth_ = Authorize(*(context), shared_->token); \
    if (!zt_auth_.ok()) return zt_auth_;                           \
  } while (false)

class JobServiceImpl final : public zerotrain::JobService::Service {
 public:
  explicit JobServiceImpl(ServiceShared* shared) : shared_(shared) {}
  grpc::Status SubmitJob(grpc::ServerContext* context, const zerotrain::SubmitJobRequest* request,
                         zerotrain::Job* response) override;
  grpc::Status GetJob(grpc::ServerContext* context, const zerotrain::GetJobRequest* request,
                      zerotrain::Job* response) override;
  grpc::Status ListJobs(grpc::ServerContext* context, const zerotrain::ListJobsRequest* request,
                        zerotrain::ListJobsResponse* response) override;
  grpc::Status CancelJob(grpc::ServerContext* context, const zerotrain::CancelJobRequest* request,
                         zerotrain::Job* response) override;
  grpc::Status DeleteJob(grpc::ServerContext* context, const zerotrain::DeleteJobRequest* request,
                         zerotrain::DeleteJobResponse* response) override;
  grpc::Status WatchJob(grpc::ServerContext* context, const zerotrain::WatchJobRequest* request,
                        grpc::ServerWriter<zerotrain::JobEvent>* writer) override;
  grpc::Status ResumeJob(grpc::ServerContext* context, const zerotrain::ResumeJobRequest* request,
                         zerotrain::Job* response) override;
  grpc::Status EstimateJob(grpc::ServerContext* context,
                           const zerotrain::EstimateJobRequest* request,
                           zerotrain::EstimateJobResponse* response) override;
  grpc::Status ListNodes(grpc::ServerContext* context, const zerotrain::ListNodesRequest* request,
                         zerotrain::ListNodesResponse* response) override;

 private:
  ServiceShared* const shared_;
};

class NodeServiceImpl final : public zerotrain::NodeService::Service {
 public:
  explicit NodeServiceImpl(ServiceShared* shared) : shared_(shared) {}
  grpc::Status Register(grpc::ServerContext* context, const zerotrain::RegisterRequest* request,
                        zerotrain::RegisterResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context, const zerotrain::HeartbeatRequest* request,
                         zerotrain::HeartbeatResponse* response) override;
  // Streams the node's assignments until the client goes away or the server stops.
  grpc::Status Assignments(grpc::ServerContext* context,
                           const zerotrain::AssignmentsRequest* request,
                           grpc::ServerWriter<zerotrain::Assignment>* writer) override;
  grpc::Status ReportRank(grpc::ServerContext* context, const zerotrain::RankReport* request,
                          zerotrain::RankReportResponse* response) override;

 private:
  ServiceShared* const shared_;
};

// Rendezvous over the coordinator's RendezvousKv (bounds in daemon/rendezvous_kv.h). Scopes
// are not checked against live attempts: a job's scopes are deleted when it finishes.
class RendezvousServiceImpl final : public zerotrain::RendezvousService::Service {
 public:
  explicit RendezvousServiceImpl(ServiceShared* shared) : shared_(shared) {}
  grpc::Status StoreSet(grpc::ServerContext* context, const zerotrain::StoreSetRequest* request,
                        zerotrain::StoreSetResponse* response) override;
  grpc::Status StoreGet(grpc::ServerContext* context, const zerotrain::StoreGetRequest* request,
                        zerotrain::StoreGetResponse* response) override;
  grpc::Status StoreWait(grpc::ServerContext* context, const zerotrain::StoreWaitRequest* request,
                         zerotrain::StoreWaitResponse* response) override;
  grpc::Status StoreAdd(grpc::ServerContext* context, const zerotrain::StoreAddRequest* request,
                        zerotrain::StoreAddResponse* response) override;

 private:
  ServiceShared* const shared_;
};

}  // namespace zt
