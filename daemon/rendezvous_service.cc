#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/auth.h"
#include "daemon/control_services.h"

namespace zt {

grpc::Status RendezvousServiceImpl::StoreSet(grpc::ServerContext* context,
                                             const zerotrain::StoreSetRequest* request,
                                             zerotrain::StoreSetResponse* /*response*/) {
  RpcTimer timer(shared_->metrics, "StoreSet");
  ZT_AUTHORIZE(context);
  return ToGrpc(
      shared_->coordinator->rendezvous().Set(request->scope(), request->key(), request->value()));
}

grpc::Status RendezvousServiceImpl::StoreGet(grpc::ServerContext* context,
                                             const zerotrain::StoreGetRequest* request,
                                             zerotrain::StoreGetResponse* response) {
  RpcTimer timer(shared_->metrics, "StoreGet");
  ZT_AUTHORIZE(context);
  absl::StatusOr<std::string> value =
      shared_->coordinator->rendezvous().Get(request->scope(), request->key());
  if (!value.ok()) return ToGrpc(value.status());
  response->set_value(*std::move(value));
  return grpc::Status::OK;
}

grpc::Status RendezvousServiceImpl::StoreWait(grpc::ServerContext* context,
                                              const zerotrain::StoreWaitRequest* request,
                                              zerotrain::StoreWaitResponse* /*response*/) {
  RpcTimer timer(shared_->metrics, "StoreWait");
  ZT_AUTHORIZE(context);
  absl::Duration timeout = absl::Milliseconds(request->timeout_ms());
  if (timeout <= absl::ZeroDuration() || timeout > kMaxStoreWait) timeout = kMaxStoreWait;
  const absl::Time deadline = absl::Now() + timeout;
  const std::vector<std::string> keys(request->keys().begin(), request->keys().end());
  while (true) {
    if (context->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
    if (shared_->stopping.load()) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the coordinator is shutting down");
    }
    const absl::Duration slice = std::min(kServiceWaitSlice, deadline - absl::Now());
    absl::StatusOr<std::vector<std::string>> missing = shared_->coordinator->rendezvous().Wait(
        request->scope(), keys, std::max(slice, absl::ZeroDuration()));
    if (!missing.ok()) return ToGrpc(missing.status());
    if (missing->empty()) return grpc::Status::OK;
    if (absl::Now() >= deadline) {
      return grpc::Status(
          grpc::StatusCode::DEADLINE_EXCEEDED,
          absl::StrCat("scope '", request->scope(), "': after ", absl::ToInt64Milliseconds(timeout),
                       " ms these keys are still missing: ", absl::StrJoin(*missing, ", ")));
    }
  }
}

grpc::Status RendezvousServiceImpl::StoreAdd(grpc::ServerContext* context,
                                             const zerotrain::StoreAddRequest* request,
                                             zerotrain::StoreAddResponse* response) {
  RpcTimer timer(shared_->metrics, "StoreAdd");
  ZT_AUTHORIZE(context);
  absl::StatusOr<int64_t> value =
      shared_->coordinator->rendezvous().Add(request->scope(), request->key(), request->delta(),
                                             request->request_id());
  if (!value.ok()) return ToGrpc(value.status());
  response->set_value(*value);
  return grpc::Status::OK;
}

}  // namespace zt
