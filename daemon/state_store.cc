#include "daemon/state_store.h"

#include <sys/stat.h>

#include <cstdio>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "rocksdb/db.h"
#include "rocksdb/env.h"
#include "rocksdb/options.h"
#include "rocksdb/write_batch.h"
#include "worker/status_macros.h"

namespace zt {
namespace {

constexpr char kFormatKey[] = "meta/format";
constexpr char kJobCounterKey[] = "meta/job_counter";
constexpr char kJobPrefix[] = "job/";
constexpr char kEventPrefix[] = "event/";
constexpr char kNodePrefix[] = "node/";
constexpr char kKvPrefix[] = "kv/";
// Written by the recovery check (StateStore::TryRecover): the time of the last recovery.
constexpr char kProbeKey[] = "meta/recovered_ms";

int64_t NowMsForProbe() { return absl::ToUnixMillis(absl::Now()); }

std::string EventKey(const std::string& job_id, int64_t sequence) {
  return absl::StrFormat("%s%s/%020d", kEventPrefix, job_id, sequence);
}

std::string KvKey(const std::string& scope, const std::string& key) {
  return absl::StrCat(kKvPrefix, scope, "/", key);
}

absl::Status FromRocks(const rocksdb::Status& status, const std::string& what) {
  if (status.ok()) return absl::OkStatus();
  std::string message = absl::StrCat(what, ": ", status.ToString());
  if (status.IsCorruption()) return absl::DataLossError(message);
  if (status.IsIOError() || status.IsBusy() || status.IsTryAgain()) {
    return absl::UnavailableError(message);
  }
  return absl::InternalError(message);
}

rocksdb::WriteOptions WriteOptionsFor(Durability durability) {
  rocksdb::WriteOptions options;
  options.sync = durability == Durability::kSync;
  return options;
}

// Calls `fn(key, value)` for every record under `prefix`, stopping at its first error.
template <typename Fn>
absl::Status ScanPrefix(rocksdb::DB* db, const std::string& prefix, Fn fn) {
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    ZT_RETURN_IF_ERROR(fn(it->key().ToString(), it->value().ToString()));
  }
  return FromRocks(it->status(), absl::StrCat("scanning '", prefix, "'"));
}

template <typename Message>
absl::Status ParseRecord(const std::string& key, const std::string& value, Message* out) {
  if (!out->ParseFromString(value)) {
    return absl::DataLossError(
        absl::StrCat("state store record '", key, "' does not parse as ", out->GetTypeName()));
  }
  return absl::OkStatus();
}

}  // namespace

static rocksdb::Options DbOptions(rocksdb::Env* env) {
  rocksdb::Options options;
  options.create_if_missing = true;
  options.write_buffer_size = StateStore::kWriteBufferBytes;
  if (env != nullptr) options.env = env;
  return options;
}

StateStore::StateStore(std::unique_ptr<rocksdb::DB> db, std::string dir, std::string db_path,
                       const StateStoreOptions& options)
    : dir_(std::move(dir)),
      db_path_(std::move(db_path)),
      env_(options.env),
      min_free_bytes_(options.min_free_bytes),
      db_(std::move(db)) {}

absl::Status StateStore::CheckReserve() const {
  if (min_free_bytes_ <= 0) return absl::OkStatus();
  rocksdb::Env* env = env_ != nullptr ? env_ : rocksdb::Env::Default();
  uint64_t free_bytes = 0;
  if (!env->GetFreeSpace(dir_, &free_bytes).ok()) return absl::OkStatus();  // unknown: try
  if (free_bytes >= static_cast<uint64_t>(min_free_bytes_)) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(
      "the disk of '", dir_, "' has ", free_bytes, " bytes free, under the ", min_free_bytes_,
      " bytes the state store keeps in reserve (RocksDB must never meet a full disk)"));
}

StateStore::DbRef StateStore::Db() const {
  std::shared_lock<std::shared_mutex> lock(db_mu_);
  rocksdb::DB* db = db_.get();
  return DbRef{std::move(lock), db};
}

absl::Status StateStore::Closed() const {
  return absl::UnavailableError(
      absl::StrCat("the state store in '", dir_, "' is closed until its disk takes writes again"));
}

StateStore::~StateStore() = default;

absl::StatusOr<std::unique_ptr<StateStore>> StateStore::Open(
    const std::string& state_dir, const StateStoreOptions& store_options) {
  struct stat st;
  if (::stat(state_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::NotFoundError(
        absl::StrCat("state directory '", state_dir, "' does not exist or is not a directory"));
  }
  rocksdb::DB* raw = nullptr;
  const std::string path = absl::StrCat(state_dir, "/db");
  rocksdb::Status opened = rocksdb::DB::Open(DbOptions(store_options.env), path, &raw);
  if (!opened.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("opening the state store in '", state_dir, "': ", opened.ToString()));
  }
  std::unique_ptr<StateStore> store(
      new StateStore(std::unique_ptr<rocksdb::DB>(raw), state_dir, path, store_options));
  std::string format;
  rocksdb::Status got = raw->Get(rocksdb::ReadOptions(), kFormatKey, &format);
  if (got.IsNotFound()) {
    ZT_RETURN_IF_ERROR(store->Write(kFormatKey, kStateStoreFormat, Durability::kSync));
  } else if (!got.ok()) {
    return FromRocks(got, absl::StrCat("reading '", kFormatKey, "' in '", state_dir, "'"));
  } else if (format != kStateStoreFormat) {
    return absl::FailedPreconditionError(
        absl::StrCat("state directory '", state_dir, "' holds format '", format,
                     "'; this coordinator reads '", kStateStoreFormat, "'"));
  }
  return store;
}

absl::Status StateStore::Write(const std::string& key, const std::string& value,
                               Durability durability) {
  rocksdb::WriteBatch batch;
  batch.Put(key, value);
  return Commit(batch, durability, absl::StrCat("writing '", key, "' in '", dir_, "'"));
}

absl::Status StateStore::Commit(rocksdb::WriteBatch& batch, Durability durability,
                                const std::string& what) {
  return Apply(
      [&](rocksdb::DB* db) { return db->Write(WriteOptionsFor(durability), &batch); }, what);
}

absl::Status StateStore::SyncLog() {
  return Apply([](rocksdb::DB* db) { return db->SyncWAL(); }, "syncing the write-ahead log");
}

absl::Status StateStore::Apply(const std::function<rocksdb::Status(rocksdb::DB*)>& apply,
                               const std::string& what) {
  // A write is the caller's own attempt: it may resume at once, whenever the last try was.
  if (!writable_.load()) TryRecover(absl::ZeroDuration());
  if (absl::Status reserve = CheckReserve(); !reserve.ok()) {
    write_errors_.fetch_add(1);
    writable_.store(false);
    return absl::UnavailableError(
        absl::StrCat(what, ": ", reserve.message(), " (the state store resumes by itself)"));
  }
  DbRef ref = Db();
  if (ref.db == nullptr) {
    write_errors_.fetch_add(1);
    return Closed();
  }
  rocksdb::Status written = apply(ref.db);
  if (written.ok()) return absl::OkStatus();
  write_errors_.fetch_add(1);
  if (!written.IsCorruption()) writable_.store(false);
  absl::Status status = FromRocks(written, what);
  if (written.IsIOError() || written.IsNoSpace()) {
    // Stopped by a background error: name what the operator waits for.
    return absl::UnavailableError(absl::StrCat(
        status.message(), " (the state store cannot write; it resumes by itself once ",
        written.IsNoSpace() ? "the disk has space again)" : "the disk accepts writes again)"));
  }
  return status;
}

bool StateStore::Writable() { return TryRecover(kRecoverInterval); }

bool StateStore::DiskTakesWrites() const {
  rocksdb::Env* env = env_ != nullptr ? env_ : rocksdb::Env::Default();
  const std::string probe = absl::StrCat(dir_, "/.store-probe");
  std::unique_ptr<rocksdb::WritableFile> file;
  rocksdb::Status s = env->NewWritableFile(probe, &file, rocksdb::EnvOptions());
  if (s.ok()) s = file->Append(std::string(kProbeBytes, '\0'));
  if (s.ok()) s = file->Sync();
  if (file != nullptr) (void)file->Close();
  (void)env->DeleteFile(probe);
  return s.ok();
}

bool StateStore::TryRecover(absl::Duration at_most_every) {
  if (writable_.load()) return true;
  std::lock_guard<std::mutex> lock(recover_mu_);
  if (writable_.load()) return true;
  const absl::Time now = absl::Now();
  if (now - last_recover_ < at_most_every) return false;
  last_recover_ = now;
  if (!CheckReserve().ok() || !DiskTakesWrites()) return false;
  {
    // RocksDB may have recovered on its own (its SstFileManager retries flushes).
    DbRef ref = Db();
    rocksdb::WriteOptions sync;
    sync.sync = true;
    if (ref.db != nullptr && ref.db->Put(sync, kProbeKey, absl::StrCat(NowMsForProbe())).ok()) {
      writable_.store(true);
      return true;
    }
  }
  std::unique_lock<std::shared_mutex> exclusive(db_mu_);
  db_.reset();
  rocksdb::DB* raw = nullptr;
  const rocksdb::Status opened = rocksdb::DB::Open(DbOptions(env_), db_path_, &raw);
  if (!opened.ok()) {
    std::fprintf(stderr, "state store: reopening '%s': %s\n", db_path_.c_str(),
                 opened.ToString().c_str());
    return false;
  }
  db_.reset(raw);
  writable_.store(true);
  return true;
}

absl::Status StateStore::PutJob(const zerotrain::Job& job) {
  return Write(absl::StrCat(kJobPrefix, job.id()), job.SerializeAsString(), Durability::kSync);
}

absl::Status StateStore::PutJobWithEvent(const zerotrain::Job& job,
                                         const zerotrain::JobEvent& event, Durability durability) {
  rocksdb::WriteBatch batch;
  batch.Put(absl::StrCat(kJobPrefix, job.id()), job.SerializeAsString());
  batch.Put(EventKey(job.id(), event.sequence()), event.SerializeAsString());
  return Commit(batch, durability,
                absl::StrCat("writing job '", job.id(), "' event ", event.sequence()));
}

absl::StatusOr<std::vector<zerotrain::Job>> StateStore::LoadJobs() const {
  std::vector<zerotrain::Job> jobs;
  DbRef ref = Db();
  if (ref.db == nullptr) return Closed();
  ZT_RETURN_IF_ERROR(
      ScanPrefix(ref.db, kJobPrefix, [&](const std::string& key, const std::string& value) {
        ZT_RETURN_IF_ERROR(ParseRecord(key, value, &jobs.emplace_back()));
        return absl::OkStatus();
      }));
  return jobs;
}

absl::StatusOr<std::vector<zerotrain::JobEvent>> StateStore::LoadEvents(
    const std::string& job_id) const {
  std::vector<zerotrain::JobEvent> events;
  DbRef ref = Db();
  if (ref.db == nullptr) return Closed();
  ZT_RETURN_IF_ERROR(ScanPrefix(ref.db, absl::StrCat(kEventPrefix, job_id, "/"),
                                [&](const std::string& key, const std::string& value) {
                                  ZT_RETURN_IF_ERROR(
                                      ParseRecord(key, value, &events.emplace_back()));
                                  return absl::OkStatus();
                                }));
  return events;
}

absl::Status StateStore::DeleteJob(const std::string& job_id) {
  rocksdb::WriteBatch batch;
  batch.Delete(absl::StrCat(kJobPrefix, job_id));
  ZT_RETURN_IF_ERROR(ScanPrefix(db_.get(), absl::StrCat(kEventPrefix, job_id, "/"),
                                [&](const std::string& key, const std::string&) {
                                  batch.Delete(key);
                                  return absl::OkStatus();
                                }));
  return FromRocks(db_->Write(WriteOptionsFor(Durability::kSync), &batch),
                   absl::StrCat("deleting job '", job_id, "'"));
}

absl::Status StateStore::PutNode(const zerotrain::NodeInfo& info, int64_t registered_ms) {
  zerotrain::Node record;
  *record.mutable_info() = info;
  record.set_registered_ms(registered_ms);
  return Write(absl::StrCat(kNodePrefix, info.id()), record.SerializeAsString(), Durability::kSync);
}

absl::StatusOr<std::vector<zerotrain::Node>> StateStore::LoadNodes() const {
  std::vector<zerotrain::Node> nodes;
  DbRef ref = Db();
  if (ref.db == nullptr) return Closed();
  ZT_RETURN_IF_ERROR(
      ScanPrefix(ref.db, kNodePrefix, [&](const std::string& key, const std::string& value) {
        ZT_RETURN_IF_ERROR(ParseRecord(key, value, &nodes.emplace_back()));
        return absl::OkStatus();
      }));
  return nodes;
}

absl::StatusOr<int64_t> StateStore::NextJobNumber(Durability durability) {
  std::string text;
  int64_t last = 0;
  rocksdb::Status got;
  {
    DbRef ref = Db();
    if (ref.db == nullptr) return Closed();
    got = ref.db->Get(rocksdb::ReadOptions(), kJobCounterKey, &text);
  }
  if (got.ok()) {
    if (!absl::SimpleAtoi(text, &last) || last < 0) {
      return absl::DataLossError(absl::StrCat("state store record '", kJobCounterKey, "' is '",
                                              text, "', not a non-negative decimal"));
    }
  } else if (!got.IsNotFound()) {
    return FromRocks(got, absl::StrCat("reading '", kJobCounterKey, "'"));
  }
  ZT_RETURN_IF_ERROR(Write(kJobCounterKey, absl::StrCat(last + 1), durability));
  return last + 1;
}

absl::Status StateStore::KvSet(const std::string& scope, const std::string& key,
                               const std::string& value) {
  return Write(KvKey(scope, key), value, Durability::kWal);
}

absl::Status StateStore::KvSetPair(const std::string& scope, const std::string& key1,
                                   const std::string& value1, const std::string& key2,
                                   const std::string& value2) {
  rocksdb::WriteBatch batch;
  batch.Put(KvKey(scope, key1), value1);
  batch.Put(KvKey(scope, key2), value2);
  return Commit(batch, Durability::kWal,
                absl::StrCat("writing '", KvKey(scope, key1), "' in '", dir_, "'"));
}

absl::StatusOr<std::optional<std::string>> StateStore::KvGet(const std::string& scope,
                                                             const std::string& key) const {
  std::string value;
  const std::string full = KvKey(scope, key);
  rocksdb::Status got;
  {
    DbRef ref = Db();
    if (ref.db == nullptr) return Closed();
    got = ref.db->Get(rocksdb::ReadOptions(), full, &value);
  }
  if (got.IsNotFound()) return std::optional<std::string>();
  ZT_RETURN_IF_ERROR(FromRocks(got, absl::StrCat("reading '", full, "'")));
  return std::optional<std::string>(std::move(value));
}

absl::Status StateStore::KvDeletePrefix(const std::string& scope_prefix) {
  const std::string prefix = absl::StrCat(kKvPrefix, scope_prefix);
  rocksdb::WriteBatch batch;
  {
    DbRef ref = Db();
    if (ref.db == nullptr) return Closed();
    ZT_RETURN_IF_ERROR(ScanPrefix(ref.db, prefix, [&](const std::string& key, const std::string&) {
      batch.Delete(key);
      return absl::OkStatus();
    }));
  }
  return Commit(batch, Durability::kWal, absl::StrCat("deleting '", prefix, "'"));
}

}  // namespace zt
