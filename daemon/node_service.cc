#include <optional>

#include "daemon/auth.h"
#include "daemon/control_services.h"

namespace zt {

grpc::Status NodeServiceImpl::Register(grpc::ServerContext* context,
                                       const zerotrain::RegisterRequest* request,
                                       zerotrain::RegisterResponse* response) {
  RpcTimer timer(shared_->metrics, "Register");
  ZT_AUTHORIZE(context);
  absl::StatusOr<zerotrain::RegisterResponse> result = shared_->coordinator->Register(*request);
  if (!result.ok()) return ToGrpc(result.status());
  *response = *std::move(result);
  return grpc::Status::OK;
}

grpc::Status NodeServiceImpl::Heartbeat(grpc::ServerContext* context,
                                        const zerotrain::HeartbeatRequest* request,
                                        zerotrain::HeartbeatResponse* response) {
  RpcTimer timer(shared_->metrics, "Heartbeat");
  ZT_AUTHORIZE(context);
  absl::StatusOr<zerotrain::HeartbeatResponse> result = shared_->coordinator->Heartbeat(*request);
  if (!result.ok()) return ToGrpc(result.status());
  *response = *std::move(result);
  return grpc::Status::OK;
}

grpc::Status NodeServiceImpl::Assignments(grpc::ServerContext* context,
                                          const zerotrain::AssignmentsRequest* request,
                                          grpc::ServerWriter<zerotrain::Assignment>* writer) {
  RpcTimer timer(shared_->metrics, "Assignments");
  ZT_AUTHORIZE(context);
  while (true) {
    if (context->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
    if (shared_->stopping.load()) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the coordinator is shutting down");
    }
    absl::StatusOr<std::optional<zerotrain::Assignment>> next =
        shared_->coordinator->NextAssignment(request->node_id(), kServiceWaitSlice);
    if (!next.ok()) return ToGrpc(next.status());
    if (!next->has_value()) continue;
    if (!writer->Write(**next)) {
      // The node went away between the pop and the write: it gets it when it reconnects.
      shared_->coordinator->ReturnAssignment(request->node_id(), **std::move(next));
      return grpc::Status(grpc::StatusCode::CANCELLED, "the node went away");
    }
  }
}

grpc::Status NodeServiceImpl::ReportRank(grpc::ServerContext* context,
                                         const zerotrain::RankReport* request,
                                         zerotrain::RankReportResponse* response) {
  RpcTimer timer(shared_->metrics, "ReportRank");
  ZT_AUTHORIZE(context);
  absl::StatusOr<zerotrain::RankReportResponse> result = shared_->coordinator->ReportRank(*request);
  if (!result.ok()) return ToGrpc(result.status());
  *response = *std::move(result);
  return grpc::Status::OK;
}

}  // namespace zt
