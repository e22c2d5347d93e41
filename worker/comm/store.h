// Rendezvous key-value stores: how the ranks of a communicator find each other.
//
// A Store maps string keys to byte strings. Ranks publish their transport addresses and their
// arrival at each collective under agreed keys and wait for the others' keys. Every Store is
// thread-safe. Keys are never deleted: a store lives as long as one job's communicators.
//
// InProcessStore serves the ranks (threads) of one node process. FileStore serves ranks in
// different processes that share a filesystem. The coordinator serves the same interface over
// gRPC (daemon/). GlooStoreAdapter lets Gloo contexts rendezvous through any of them.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gloo/rendezvous/store.h"

namespace zt {

class Store {
 public:
  virtual ~Store() = default;

  // Sets `key` to `value`, replacing any earlier value.
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  // The value of `key`; NotFound when it was never set. Never blocks on other ranks.
  virtual absl::StatusOr<std::string> Get(const std::string& key) = 0;
  // Whether `key` has been set.
  virtual absl::StatusOr<bool> Contains(const std::string& key) = 0;
  // Returns when every key is set; DeadlineExceeded naming the keys still missing after
  // `timeout`.
  virtual absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) = 0;
  // Adds `delta` to the counter at `key` (absent counts as 0) and returns the new value.
  // Counters are stored as decimal text; InvalidArgument if `key` holds anything else.
  virtual absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) = 0;
};

// A map guarded by a mutex; waiters sleep on a condition variable.
class InProcessStore : public Store {
 public:
  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key) override;
  absl::StatusOr<bool> Contains(const std::string& key) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  absl::flat_hash_map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

// One file per key in `directory` (created if absent), written to a temporary name and
// renamed, so a reader sees a whole value or none. Add holds an flock(2) on
// `directory`/.add.lock across its read-modify-write, so counters are exact across processes
// on filesystems that honour flock. Wait polls every `poll_interval`.
class FileStore : public Store {
 public:
  static absl::StatusOr<std::unique_ptr<FileStore>> Create(
      const std::string& directory, absl::Duration poll_interval = absl::Milliseconds(5));

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key) override;
  absl::StatusOr<bool> Contains(const std::string& key) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;

 private:
  FileStore(std::string directory, absl::Duration poll_interval)
      : directory_(std::move(directory)), poll_interval_(poll_interval) {}
  // Keys may hold '/' and other characters a file name cannot: they are hex-escaped.
  std::string PathOf(const std::string& key) const;

  const std::string directory_;
  const absl::Duration poll_interval_;
};

// Gloo's rendezvous interface over a Store. Keys get `prefix` prepended so several
// communicators share one store. Gloo expects failures as exceptions: errors are thrown as
// gloo::IoException, which the communicator catches and turns back into a status.
class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(zt::Store* store, std::string prefix, absl::Duration timeout)
      : store_(store), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  // Waits up to the adapter's timeout for `key`, as Gloo's own stores do.
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  std::vector<std::string> Prefixed(const std::vector<std::string>& keys) const;

  zt::Store* const store_;
  const std::string prefix_;
  const absl::Duration timeout_;
};

}  // namespace zt
