#include "daemon/rendezvous_kv.h"

#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "worker/status_macros.h"

namespace zt {
namespace {

absl::Status CheckScopeAndKey(const std::string& scope, const std::string& key) {
  ZT_RETURN_IF_ERROR(CheckStoreField("scope", scope.size(), kMaxStoreKeyBytes));
  return CheckStoreField("key", key.size(), kMaxStoreKeyBytes);
}

}  // namespace

absl::Status CheckStoreField(const std::string& field, size_t size, size_t max) {
  if (size == 0) return absl::InvalidArgumentError(absl::StrCat(field, " must not be empty"));
  if (size > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " has ", size, " bytes; at most ", max, " are allowed"));
  }
  return absl::OkStatus();
}

absl::Status RendezvousKv::Set(const std::string& scope, const std::string& key,
                               const std::string& value) {
  ZT_RETURN_IF_ERROR(CheckScopeAndKey(scope, key));
  if (value.size() > kMaxStoreValueBytes) {
    return absl::InvalidArgumentError(absl::StrCat("value has ", value.size(), " bytes; at most ",
                                                   kMaxStoreValueBytes, " are allowed"));
  }
  absl::MutexLock lock(&mu_);
  ZT_RETURN_IF_ERROR(store_->KvSet(scope, key, value));
  changed_.SignalAll();
  return absl::OkStatus();
}

absl::StatusOr<std::string> RendezvousKv::Get(const std::string& scope, const std::string& key) {
  ZT_RETURN_IF_ERROR(CheckScopeAndKey(scope, key));
  ZT_ASSIGN_OR_RETURN(std::optional<std::string> value, store_->KvGet(scope, key));
  if (!value.has_value()) {
    return absl::NotFoundError(absl::StrCat("key '", key, "' of scope '", scope, "' is not set"));
  }
  return *std::move(value);
}

absl::StatusOr<int64_t> RendezvousKv::Add(const std::string& scope, const std::string& key,
                                          int64_t delta, const std::string& request_id) {
  ZT_RETURN_IF_ERROR(CheckScopeAndKey(scope, key));
  if (!request_id.empty()) {
    ZT_RETURN_IF_ERROR(CheckStoreField("request_id", request_id.size(), kMaxAddRequestIdBytes));
  }
  // The results of identified additions live beside the keys under a prefix no key of a
  // client's can have (keys are checked to be at most 512 bytes; this one is longer).
  const std::string done_key =
      request_id.empty() ? "" : absl::StrCat(std::string(kMaxStoreKeyBytes, '#'), request_id);
  absl::MutexLock lock(&mu_);
  if (!done_key.empty()) {
    ZT_ASSIGN_OR_RETURN(std::optional<std::string> done, store_->KvGet(scope, done_key));
    int64_t result = 0;
    if (done.has_value() && absl::SimpleAtoi(*done, &result)) return result;
  }
  ZT_ASSIGN_OR_RETURN(std::optional<std::string> value, store_->KvGet(scope, key));
  int64_t current = 0;
  if (value.has_value() && !absl::SimpleAtoi(*value, &current)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key '", key, "' of scope '", scope, "' holds a value that is not a decimal counter"));
  }
  const int64_t next = current + delta;
  ZT_RETURN_IF_ERROR(done_key.empty() ? store_->KvSet(scope, key, absl::StrCat(next))
                                      : store_->KvSetPair(scope, key, absl::StrCat(next), done_key,
                                                          absl::StrCat(next)));
  changed_.SignalAll();
  return next;
}

absl::StatusOr<std::vector<std::string>> RendezvousKv::Missing(
    const std::string& scope, const std::vector<std::string>& keys) {
  std::vector<std::string> missing;
  for (const std::string& key : keys) {
    ZT_ASSIGN_OR_RETURN(std::optional<std::string> value, store_->KvGet(scope, key));
    if (!value.has_value()) missing.push_back(key);
  }
  return missing;
}

absl::StatusOr<std::vector<std::string>> RendezvousKv::Wait(const std::string& scope,
                                                            const std::vector<std::string>& keys,
                                                            absl::Duration timeout) {
  ZT_RETURN_IF_ERROR(CheckStoreField("scope", scope.size(), kMaxStoreKeyBytes));
  if (keys.size() > kMaxStoreWaitKeys) {
    return absl::InvalidArgumentError(absl::StrCat("keys has ", keys.size(), " entries; at most ",
                                                   kMaxStoreWaitKeys, " are allowed"));
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    ZT_RETURN_IF_ERROR(
        CheckStoreField(absl::StrCat("keys[", i, "]"), keys[i].size(), kMaxStoreKeyBytes));
  }
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  while (true) {
    ZT_ASSIGN_OR_RETURN(std::vector<std::string> missing, Missing(scope, keys));
    if (missing.empty() || absl::Now() >= deadline) return missing;
    changed_.WaitWithDeadline(&mu_, deadline);
  }
}

absl::Status RendezvousKv::DeleteJobScopes(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  return store_->KvDeletePrefix(absl::StrCat(job_id, "/"));
}

}  // namespace zt
