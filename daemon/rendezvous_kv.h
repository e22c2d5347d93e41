// The rendezvous key-value store the RendezvousService serves: one namespace per job attempt
// (scope "<job id>/<attempt>"), kept in the StateStore's kv/ records so that ranks ride out a
// coordinator restart, with a condition variable so that Wait returns as soon as a key lands.
//
// Bounds (InvalidArgument naming the field): scope and key 1–512 bytes, value ≤ 1 MiB, at most
// 256 keys per Wait. Thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/state_store.h"

namespace zt {

inline constexpr size_t kMaxStoreKeyBytes = 512;
inline constexpr size_t kMaxStoreValueBytes = 1 << 20;
inline constexpr size_t kMaxStoreWaitKeys = 256;
inline constexpr size_t kMaxAddRequestIdBytes = 128;

class RendezvousKv {
 public:
  // `store` outlives this object.
  explicit RendezvousKv(StateStore* store) : store_(store) {}

  absl::Status Set(const std::string& scope, const std::string& key, const std::string& value);
  // NotFound naming the key when it was never set.
  absl::StatusOr<std::string> Get(const std::string& scope, const std::string& key);
  // Adds `delta` to the decimal counter at key (absent: 0); returns the new value.
  // InvalidArgument when the present value is not a decimal integer. With a `request_id`
  // (1–128 bytes, the client's for this one addition) a repeat of the call — a retry after a
  // lost reply — adds nothing and returns what the first call returned: the result is kept
  // with the counter, written together with it, for the life of the scope.
  absl::StatusOr<int64_t> Add(const std::string& scope, const std::string& key, int64_t delta,
                              const std::string& request_id = "");
  // Waits up to `timeout` for every key to be set; returns the keys still missing (empty:
  // all set). Callers loop with short timeouts to notice cancellation.
  absl::StatusOr<std::vector<std::string>> Wait(const std::string& scope,
                                                const std::vector<std::string>& keys,
                                                absl::Duration timeout);
  // Forgets every scope of the job (its attempts' scopes start with "<job id>/").
  absl::Status DeleteJobScopes(const std::string& job_id);

 private:
  absl::StatusOr<std::vector<std::string>> Missing(const std::string& scope,
                                                   const std::vector<std::string>& keys)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  StateStore* const store_;
  absl::Mutex mu_;
  absl::CondVar changed_;
};

// InvalidArgument naming `field` unless 1 ≤ size ≤ max.
absl::Status CheckStoreField(const std::string& field, size_t size, size_t max);

}  // namespace zt
