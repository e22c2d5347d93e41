#include "worker/node/remote_store.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/node/control_channel.h"

namespace zt {
namespace {

std::chrono::milliseconds ToChrono(absl::Duration d) {
  return std::chrono::milliseconds(std::max<int64_t>(1, absl::ToInt64Milliseconds(d)));
}

// Slack on a StoreWait RPC's deadline beyond the wait it asks the server for, so the server's
// DEADLINE_EXCEEDED (which names the missing keys) arrives before the client gives up.
constexpr absl::Duration kWaitSlack = absl::Seconds(5);

// 128 random bits as 32 hex digits: unique among every client's additions to a scope.
std::string AddRequestId() {
  thread_local std::mt19937_64 rng(std::random_device{}());
  const uint64_t high = rng(), low = rng();
  return absl::StrCat(absl::Hex(high, absl::kZeroPad16), absl::Hex(low, absl::kZeroPad16));
}

}  // namespace

absl::StatusOr<std::unique_ptr<RemoteStore>> RemoteStore::Create(
    std::shared_ptr<grpc::Channel> channel, RemoteStoreOptions options) {
  if (channel == nullptr) return absl::InvalidArgumentError("RemoteStore: channel is null");
  if (options.scope.empty()) {
    return absl::InvalidArgumentError("RemoteStore: scope is empty (StartRanks.store_scope)");
  }
  if (options.token.empty()) return absl::InvalidArgumentError("RemoteStore: token is empty");
  if (options.max_wait_rpc <= absl::ZeroDuration() ||
      options.retry.initial_backoff <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "RemoteStore: max_wait_rpc and retry.initial_backoff must be positive");
  }
  return std::unique_ptr<RemoteStore>(new RemoteStore(std::move(channel), std::move(options)));
}

RemoteStore::RemoteStore(std::shared_ptr<grpc::Channel> channel, RemoteStoreOptions options)
    : channel_(std::move(channel)),
      stub_(zerotrain::RendezvousService::NewStub(channel_)),
      options_(std::move(options)) {}

std::string RemoteStore::Describe(const std::string& operation, const std::string& key) const {
  return absl::StrCat("rendezvous ", operation, " '", key, "' (scope '", options_.scope,
                      "', coordinator ", options_.coordinator, ")");
}

absl::Status RemoteStore::Set(const std::string& key, const std::string& value) {
  zerotrain::StoreSetRequest request;
  request.set_scope(options_.scope);
  request.set_key(key);
  request.set_value(value);
  return CallRetrying(options_.retry, Describe("set", key), absl::InfiniteFuture(), [&] {
    zerotrain::StoreSetResponse response;
    auto context = AuthorizedContext(options_.token, ToChrono(options_.rpc_timeout));
    return stub_->StoreSet(context.get(), request, &response);
  });
}

absl::StatusOr<std::string> RemoteStore::Get(const std::string& key) {
  zerotrain::StoreGetRequest request;
  request.set_scope(options_.scope);
  request.set_key(key);
  zerotrain::StoreGetResponse response;
  absl::Status status =
      CallRetrying(options_.retry, Describe("get", key), absl::InfiniteFuture(), [&] {
        auto context = AuthorizedContext(options_.token, ToChrono(options_.rpc_timeout));
        return stub_->StoreGet(context.get(), request, &response);
      });
  if (!status.ok()) return status;
  return std::move(*response.mutable_value());
}

absl::StatusOr<bool> RemoteStore::Contains(const std::string& key) {
  absl::StatusOr<std::string> value = Get(key);
  if (value.ok()) return true;
  if (absl::IsNotFound(value.status())) return false;
  return value.status();
}

absl::Status RemoteStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + std::max(timeout, absl::ZeroDuration());
  const std::string what = Describe("wait", absl::StrJoin(keys, "', '"));
  zerotrain::StoreWaitRequest request;
  request.set_scope(options_.scope);
  for (const std::string& key : keys) request.add_keys(key);
  while (true) {
    const absl::Duration chunk =
        std::clamp(deadline - absl::Now(), absl::ZeroDuration(), options_.max_wait_rpc);
    request.set_timeout_ms(absl::ToInt64Milliseconds(chunk));
    absl::Status status = CallRetrying(options_.retry, what, deadline, [&] {
      zerotrain::StoreWaitResponse response;
      auto context = AuthorizedContext(options_.token, ToChrono(chunk + kWaitSlack));
      return stub_->StoreWait(context.get(), request, &response);
    });
    if (!absl::IsDeadlineExceeded(status) || absl::Now() >= deadline) return status;
  }
}

absl::StatusOr<int64_t> RemoteStore::Add(const std::string& key, int64_t delta) {
  zerotrain::StoreAddRequest request;
  request.set_scope(options_.scope);
  request.set_key(key);
  request.set_delta(delta);
  // One id for this addition, sent again on every retry: the coordinator adds once.
  request.set_request_id(AddRequestId());
  zerotrain::StoreAddResponse response;
  absl::Status status =
      CallRetrying(options_.retry, Describe("add", key), absl::InfiniteFuture(), [&] {
        auto context = AuthorizedContext(options_.token, ToChrono(options_.rpc_timeout));
        return stub_->StoreAdd(context.get(), request, &response);
      });
  if (!status.ok()) return status;
  return response.value();
}

}  // namespace zt
