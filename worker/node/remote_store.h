// The rendezvous Store of one job attempt, served by the coordinator's RendezvousService.
//
// Every rank of an attempt, on every node, builds one over the same `scope`
// (StartRanks.store_scope); the coordinator keeps the keys in its RocksDB, so the store
// outlives a coordinator restart. Calls that fail with UNAVAILABLE (the coordinator is
// restarting, or its connection broke) are retried with capped exponential backoff until
// `retry.retry_for` has passed since the first failure (worker/node/rpc_retry.h); then the
// UNAVAILABLE comes back,
// naming the key and the coordinator. Wait is split into RPCs of at most `max_wait_rpc` each, so
// a coordinator restart in the middle of a long wait costs one chunk, not the wait.
//
// Add is retried like the rest: when a connection breaks after the coordinator applied an add
// but before its answer arrived, the retry adds again. gRPC reports a call that never left the
// client (the common case: the coordinator is down) the same way, and the counters the engine
// keeps (arrivals at a barrier) are read only by ranks of the same attempt, which a coordinator
// restart mid-add ends anyway if their counts disagree (the barrier times out).
//
// Thread-safe: the ranks of an attempt share one RemoteStore.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "proto/control.grpc.pb.h"
#include "worker/comm/store.h"
#include "worker/node/rpc_retry.h"

namespace zt {

struct RemoteStoreOptions {
  // The coordinator's address, for error messages (the channel already points there).
  std::string coordinator;
  // The bearer token every call carries.
  std::string token;
  // The attempt's namespace (StartRanks.store_scope); must not be empty.
  std::string scope;
  // How long a streak of UNAVAILABLE answers is retried, and the backoff between retries.
  RetryPolicy retry;
  // The longest single StoreWait RPC.
  absl::Duration max_wait_rpc = absl::Seconds(10);
  // Deadline of every other RPC.
  absl::Duration rpc_timeout = absl::Seconds(30);
};

class RemoteStore : public Store {
 public:
  // InvalidArgument naming the field when `scope` or `token` is empty or `channel` is null.
  static absl::StatusOr<std::unique_ptr<RemoteStore>> Create(std::shared_ptr<grpc::Channel> channel,
                                                             RemoteStoreOptions options);

  absl::Status Set(const std::string& key, const std::string& value) override;
  // NotFound naming the key when it was never set.
  absl::StatusOr<std::string> Get(const std::string& key) override;
  absl::StatusOr<bool> Contains(const std::string& key) override;
  // DeadlineExceeded naming the missing keys after `timeout`; UNAVAILABLE when the coordinator
  // stayed unreachable for retry_for (or until the timeout, whichever comes first).
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;

 private:
  RemoteStore(std::shared_ptr<grpc::Channel> channel, RemoteStoreOptions options);

  std::string Describe(const std::string& operation, const std::string& key) const;

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<zerotrain::RendezvousService::Stub> stub_;
  const RemoteStoreOptions options_;
};

}  // namespace zt
