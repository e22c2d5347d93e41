// The coordinator's durable state: one RocksDB database under <state-dir>/db.
//
// Key layout (bytewise order; job ids hold no '/', see JobSpec.name):
//   meta/format                    "zerotrain-state 1": the magic and version; other values
//                                  are refused (FailedPrecondition naming the directory)
//   meta/job_counter               decimal: the n of the last job id "<name>-<n>" handed out
//   job/<job id>                   zerotrain::Job
//   event/<job id>/<20-digit seq>  zerotrain::JobEvent, so a prefix scan yields sequence order
//   node/<node id>                 zerotrain::Node with only `info` and `registered_ms` set
//   kv/<scope>/<key>               rendezvous values, raw bytes
//
// Durability: writes that change a job (PutJob, PutJobWithEvent with Durability::kSync) and
// node records are synced before they return, so a coordinator killed at any point loses no
// job and no event it acknowledged. Rendezvous and progress writes go to the WAL without a
// sync (kWal): they survive a process crash, and a later synced write syncs them too.
//
// Thread-safe (RocksDB is); the caller orders writes that must not interleave. Reads of a
// record that does not parse return DataLoss naming the key.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/control.pb.h"

namespace rocksdb {
class DB;
}

namespace zt {

inline constexpr char kStateStoreFormat[] = "zerotrain-state 1";

enum class Durability {
  // Synced to disk before the call returns.
  kSync,
  // In the write-ahead log: survives a crash of the process, not of the machine.
  kWal,
};

class StateStore {
 public:
  // Opens (creating when missing) the database under `state_dir`/db; `state_dir` must exist.
  // Errors name the directory.
  static absl::StatusOr<std::unique_ptr<StateStore>> Open(const std::string& state_dir);
  ~StateStore();
  StateStore(const StateStore&) = delete;
  StateStore& operator=(const StateStore&) = delete;

  // The job record, synced.
  absl::Status PutJob(const zerotrain::Job& job);
  // The job record and one of its events in one atomic batch.
  absl::Status PutJobWithEvent(const zerotrain::Job& job, const zerotrain::JobEvent& event,
                               Durability durability);
  // Every job, by id.
  absl::StatusOr<std::vector<zerotrain::Job>> LoadJobs() const;
  // The job's events by ascending sequence.
  absl::StatusOr<std::vector<zerotrain::JobEvent>> LoadEvents(const std::string& job_id) const;
  // Removes the job record and every event of the job in one synced batch (a job that is not
  // there: OK).
  absl::Status DeleteJob(const std::string& job_id);

  // A node's record (info and registered_ms are kept; the rest is live state), synced.
  absl::Status PutNode(const zerotrain::NodeInfo& info, int64_t registered_ms);
  // Every node record, by id.
  absl::StatusOr<std::vector<zerotrain::Node>> LoadNodes() const;

  // Increments the persisted job counter and returns its new value (1 for the first job).
  absl::StatusOr<int64_t> NextJobNumber();

  // Rendezvous values (written to the WAL, not synced).
  absl::Status KvSet(const std::string& scope, const std::string& key, const std::string& value);
  // nullopt when the key was never set.
  absl::StatusOr<std::optional<std::string>> KvGet(const std::string& scope,
                                                   const std::string& key) const;
  // Deletes every key of every scope that starts with `scope_prefix` (a job's attempts:
  // "<job id>/").
  absl::Status KvDeletePrefix(const std::string& scope_prefix);

 private:
  explicit StateStore(std::unique_ptr<rocksdb::DB> db, std::string dir);
  absl::Status Write(const std::string& key, const std::string& value, Durability durability);

  std::unique_ptr<rocksdb::DB> db_;
  std::string dir_;
};

}  // namespace zt
