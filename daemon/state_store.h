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
// Write faults: a write that fails (a full disk: ENOSPC; any I/O error) leaves RocksDB in a
// background-error state in which it refuses every later write. RocksDB's own recovery is
// not enough: DB::Resume() while the disk is still full turns the error fatal, after which
// only a reopen clears it. So the store recovers by itself this way: once a probe file of
// kProbeBytes can be written and synced beside the database (the disk has space again), it
// checks whether RocksDB recovered on its own (a synced write succeeds) and otherwise closes
// and reopens the database, which replays the write-ahead log (nothing acknowledged is lost).
// The next write tries this first, and Writable() does (at most every kRecoverInterval), so a
// coordinator whose disk was full writes again as soon as space is back, without a restart.
// Until then writes fail with Unavailable naming the cause (retry later), and writable() is
// false; reads keep working, except while a reopen fails (Unavailable as well).
//
// Thread-safe (RocksDB is); the caller orders writes that must not interleave. Reads of a
// record that does not parse return DataLoss naming the key.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/control.pb.h"

namespace rocksdb {
class DB;
class Env;
class Status;
class WriteBatch;
}  // namespace rocksdb

namespace zt {

inline constexpr char kStateStoreFormat[] = "zerotrain-state 1";

enum class Durability {
  // Synced to disk before the call returns.
  kSync,
  // In the write-ahead log: survives a crash of the process, not of the machine.
  kWal,
};

struct StateStoreOptions {
  // The RocksDB environment the database does its I/O through; null: the real file system.
  // Tests pass one that fails writes on demand. Outlives the store.
  rocksdb::Env* env = nullptr;
  // Writes are refused (Unavailable, the store unwritable) while the state directory's file
  // system has fewer free bytes: Debian's RocksDB 7.8 is built with assertions, and a write
  // that meets ENOSPC in its write-ahead log aborts the process (WritableFileWriter's
  // "sync_without_flush_called_" assertion), so the store keeps RocksDB away from a full disk.
  // The reserve holds a memtable flush (write buffers are kWriteBufferBytes). 0: no reserve.
  int64_t min_free_bytes = int64_t{16} << 20;
};

class StateStore {
 public:
  // How often Writable() tries to recover while the store cannot write.
  static constexpr absl::Duration kRecoverInterval = absl::Milliseconds(250);
  // The probe that says the disk has space again: more than a flush of the coordinator's
  // memtable needs in practice (jobs and events are kilobytes).
  static constexpr size_t kProbeBytes = size_t{256} << 10;
  // RocksDB's memtable size here: the coordinator's records are kilobytes, and a flush must
  // fit in the free-space reserve.
  static constexpr size_t kWriteBufferBytes = size_t{4} << 20;

  // Opens (creating when missing) the database under `state_dir`/db; `state_dir` must exist.
  // Errors name the directory.
  static absl::StatusOr<std::unique_ptr<StateStore>> Open(const std::string& state_dir,
                                                          const StateStoreOptions& options = {});
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
  // kWal is as safe as kSync when a synced write that records the number (the job's PENDING
  // event) follows before the number is handed out: syncing the log syncs every earlier entry,
  // and a crash before it loses only a number nobody was given. It saves a sync per submit.
  absl::StatusOr<int64_t> NextJobNumber(Durability durability);

  // Syncs the write-ahead log: every kWal write before it becomes as durable as a kSync one.
  // Fails as a write does (Unavailable while the disk refuses, and writable() turns false).
  absl::Status SyncLog();

  // Rendezvous values (written to the WAL, not synced).
  absl::Status KvSet(const std::string& scope, const std::string& key, const std::string& value);
  // Two values of one scope in one atomic write: both land, or neither.
  absl::Status KvSetPair(const std::string& scope, const std::string& key1,
                         const std::string& value1, const std::string& key2,
                         const std::string& value2);
  // nullopt when the key was never set.
  absl::StatusOr<std::optional<std::string>> KvGet(const std::string& scope,
                                                   const std::string& key) const;
  // Deletes every key of every scope that starts with `scope_prefix` (a job's attempts:
  // "<job id>/").
  absl::Status KvDeletePrefix(const std::string& scope_prefix);

  // False from a failed write until the store recovered: what the last attempt found.
  bool writable() const { return writable_.load(); }
  // writable(), after trying to recover first when the store cannot write and the last try
  // is kRecoverInterval old: true when the store writes again.
  bool Writable();
  // Writes that failed since Open.
  int64_t write_errors() const { return write_errors_.load(); }

 private:
  // A shared hold on the database; `db` is null while a reopen has failed.
  struct DbRef {
    std::shared_lock<std::shared_mutex> lock;
    rocksdb::DB* db;
  };

  StateStore(std::unique_ptr<rocksdb::DB> db, std::string dir, std::string db_path,
             const StateStoreOptions& options);
  // Unavailable naming the free bytes and the reserve when the disk is below it.
  absl::Status CheckReserve() const;
  DbRef Db() const;
  absl::Status Closed() const;
  absl::Status Write(const std::string& key, const std::string& value, Durability durability);
  // Every write goes through here: recovers a stopped database first, counts failures.
  absl::Status Commit(rocksdb::WriteBatch& batch, Durability durability, const std::string& what);
  // Commit's recovery and accounting around `apply` (a write or a log sync).
  absl::Status Apply(const std::function<rocksdb::Status(rocksdb::DB*)>& apply,
                     const std::string& what);
  // Recovers when the store cannot write (unless `at_most_every` has not passed since the
  // last try); writable().
  bool TryRecover(absl::Duration at_most_every);
  // Whether a kProbeBytes file can be written and synced in the state directory.
  bool DiskTakesWrites() const;

  const std::string dir_;
  const std::string db_path_;
  rocksdb::Env* const env_;  // null: the default
  const int64_t min_free_bytes_;
  mutable std::shared_mutex db_mu_;
  std::unique_ptr<rocksdb::DB> db_;  // replaced under db_mu_ held exclusively
  std::atomic<bool> writable_{true};
  std::atomic<int64_t> write_errors_{0};
  std::mutex recover_mu_;
  absl::Time last_recover_ = absl::InfinitePast();  // guarded by recover_mu_
};

}  // namespace zt
