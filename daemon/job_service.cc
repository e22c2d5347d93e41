#include <vector>

#include "daemon/auth.h"
#include "daemon/control_services.h"

namespace zt {

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl::StatusCode and grpc::StatusCode share their numbering (both are google.rpc.Code).
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

namespace {

// The handler's reply: the value into `response`, or the error.
template <typename T>
grpc::Status Reply(absl::StatusOr<T> result, T* response) {
  if (!result.ok()) return ToGrpc(result.status());
  *response = *std::move(result);
  return grpc::Status::OK;
}

}  // namespace

grpc::Status JobServiceImpl::SubmitJob(grpc::ServerContext* context,
                                       const zerotrain::SubmitJobRequest* request,
                                       zerotrain::Job* response) {
  RpcTimer timer(shared_->metrics, "SubmitJob");
  ZT_AUTHORIZE(context);
  return Reply(shared_->coordinator->Submit(request->spec(), request->request_id()), response);
}

grpc::Status JobServiceImpl::GetJob(grpc::ServerContext* context,
                                    const zerotrain::GetJobRequest* request,
                                    zerotrain::Job* response) {
  RpcTimer timer(shared_->metrics, "GetJob");
  ZT_AUTHORIZE(context);
  return Reply(shared_->coordinator->GetJob(request->job_id()), response);
}

grpc::Status JobServiceImpl::ListJobs(grpc::ServerContext* context,
                                      const zerotrain::ListJobsRequest* request,
                                      zerotrain::ListJobsResponse* response) {
  RpcTimer timer(shared_->metrics, "ListJobs");
  ZT_AUTHORIZE(context);
  return Reply(shared_->coordinator->ListJobs(*request), response);
}

grpc::Status JobServiceImpl::DeleteJob(grpc::ServerContext* context,
                                       const zerotrain::DeleteJobRequest* request,
                                       zerotrain::DeleteJobResponse* /*response*/) {
  RpcTimer timer(shared_->metrics, "DeleteJob");
  ZT_AUTHORIZE(context);
  return ToGrpc(shared_->coordinator->DeleteJob(request->job_id()));
}

grpc::Status JobServiceImpl::CancelJob(grpc::ServerContext* context,
                                       const zerotrain::CancelJobRequest* request,
                                       zerotrain::Job* response) {
  RpcTimer timer(shared_->metrics, "CancelJob");
  ZT_AUTHORIZE(context);
  return Reply(shared_->coordinator->Cancel(request->job_id()), response);
}

grpc::Status JobServiceImpl::WatchJob(grpc::ServerContext* context,
                                      const zerotrain::WatchJobRequest* request,
                                      grpc::ServerWriter<zerotrain::JobEvent>* writer) {
  RpcTimer timer(shared_->metrics, "WatchJob");
  ZT_AUTHORIZE(context);
  int64_t after = request->after_sequence();
  while (true) {
    if (context->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
    if (shared_->stopping.load()) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the coordinator is shutting down");
    }
    absl::StatusOr<Coordinator::EventBatch> batch =
        shared_->coordinator->WaitForEvents(request->job_id(), after, kServiceWaitSlice);
    if (!batch.ok()) return ToGrpc(batch.status());
    for (const zerotrain::JobEvent& event : batch->events) {
      if (!writer->Write(event)) {
        return grpc::Status(grpc::StatusCode::CANCELLED, "the watcher went away");
      }
      after = event.sequence();
    }
    if (batch->finished) return grpc::Status::OK;
  }
}

grpc::Status JobServiceImpl::ResumeJob(grpc::ServerContext* context,
                                       const zerotrain::ResumeJobRequest* request,
                                       zerotrain::Job* response) {
  RpcTimer timer(shared_->metrics, "ResumeJob");
  ZT_AUTHORIZE(context);
  return Reply(shared_->coordinator->Resume(*request), response);
}

grpc::Status JobServiceImpl::EstimateJob(grpc::ServerContext* context,
                                         const zerotrain::EstimateJobRequest* request,
                                         zerotrain::EstimateJobResponse* response) {
  RpcTimer timer(shared_->metrics, "EstimateJob");
  ZT_AUTHORIZE(context);
  absl::StatusOr<zerotrain::ShardingPlan> plan = shared_->coordinator->Estimate(*request);
  if (!plan.ok()) return ToGrpc(plan.status());
  *response->mutable_plan() = *std::move(plan);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::ListNodes(grpc::ServerContext* context,
                                       const zerotrain::ListNodesRequest* /*request*/,
                                       zerotrain::ListNodesResponse* response) {
  RpcTimer timer(shared_->metrics, "ListNodes");
  ZT_AUTHORIZE(context);
  for (zerotrain::Node& node : shared_->coordinator->ListNodes()) {
    *response->add_nodes() = std::move(node);
  }
  return grpc::Status::OK;
}

}  // namespace zt
