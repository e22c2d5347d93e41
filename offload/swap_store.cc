#include "offload/swap_store.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/crc32c.h"
#include "kernels/status_macros.h"
#include "offload/swap_format.h"
#include "rocksdb/db.h"
#include "rocksdb/options.h"
#include "rocksdb/write_batch.h"

namespace zt::offload {

absl::string_view SwapRoleName(SwapRole role) {
  switch (role) {
    case SwapRole::kMaster:
      return "master";
    case SwapRole::kMomentum:
      return "m";
    case SwapRole::kVariance:
      return "v";
    case SwapRole::kQuantScales:
      return "scales";
    case SwapRole::kParameters:
      return "params";
    case SwapRole::kMomentumCodes:
      return "m_codes";
    case SwapRole::kVarianceCodes:
      return "v_codes";
    case SwapRole::kVarianceScales:
      return "v_scales";
    case SwapRole::kFactorRow:
      return "factor_row";
    case SwapRole::kFactorCol:
      return "factor_col";
    case SwapRole::kFactorFull:
      return "factor_full";
    case SwapRole::kQuantizedBase:
      return "qbase";
  }
  return "unknown";
}

std::string SwapKeyText(const SwapKey& key) {
  return absl::StrCat("job '", key.job, "' unit ", key.unit, " range [", key.range_begin, ", ",
                      key.range_end, ") role ", SwapRoleName(key.role), " generation ",
                      key.generation);
}

namespace {

constexpr uint64_t kAlign = swap_format::kExtentAlignment;

uint64_t RoundUp(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

bool Aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kAlign == 0; }

absl::Status RocksStatus(const rocksdb::Status& s, absl::string_view what,
                         const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " '", path, "': ", s.ToString()));
}

absl::Status CheckKey(const SwapKey& key) {
  if (key.job.empty() || key.job.size() > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("swap key job name must be 1..65535 bytes (got ", key.job.size(), ")"));
  }
  if (key.generation == 0) {
    return absl::InvalidArgumentError(absl::StrCat(SwapKeyText(key), ": generation must be > 0"));
  }
  if (key.range_begin > key.range_end) {
    return absl::InvalidArgumentError(
        absl::StrCat(SwapKeyText(key), ": range begin must not exceed its end"));
  }
  return absl::OkStatus();
}

}  // namespace

SwapStore::SwapStore(SwapStoreOptions options)
    : options_(std::move(options)),
      env_(options_.env != nullptr ? options_.env : DefaultSwapEnv()) {}

absl::StatusOr<std::unique_ptr<SwapStore>> SwapStore::Open(SwapStoreOptions options) {
  if (options.path.empty()) {
    return absl::InvalidArgumentError("swap store: path must name a directory (got \"\")");
  }
  if (options.file_size == 0 || options.file_size % kAlign != 0) {
    return absl::InvalidArgumentError(absl::StrCat("swap store '", options.path, "': file_size ",
                                                   options.file_size,
                                                   " must be a positive multiple of 4096"));
  }
  if (options.file_count == 0 || options.file_count > 999) {
    return absl::InvalidArgumentError(absl::StrCat("swap store '", options.path, "': file_count ",
                                                   options.file_count, " is outside 1..999"));
  }
  if (options.block_size == 0 || options.block_size % kAlign != 0) {
    return absl::InvalidArgumentError(absl::StrCat("swap store '", options.path, "': block_size ",
                                                   options.block_size,
                                                   " must be a positive multiple of 4096"));
  }
  if (options.io_lanes < 1 || options.io_lanes > 64) {
    return absl::InvalidArgumentError(absl::StrCat("swap store '", options.path, "': io_lanes ",
                                                   options.io_lanes, " is outside 1..64"));
  }
  if (options.queue_depth < 1 || options.queue_depth > 4096) {
    return absl::InvalidArgumentError(absl::StrCat("swap store '", options.path, "': queue_depth ",
                                                   options.queue_depth, " is outside 1..4096"));
  }
  if (!options.warn) options.warn = WarnToStderr;
  ZT_RETURN_IF_ERROR(CheckWritableDirectory(options.path, "swap store"));
  std::unique_ptr<SwapStore> store(new SwapStore(std::move(options)));
  SwapOpenReport report;
  {
    absl::MutexLock lock(&store->mu_);
    if (absl::Status s = store->OpenLocked(report); !s.ok()) {
      store->made_by_failed_open_ = std::move(store->made_by_this_open_);
      return s;
    }
    store->made_by_this_open_.clear();
  }
  store->report_ = report;
  return store;
}

absl::Status SwapStore::OpenLocked(SwapOpenReport& report) {
  const std::string& path = options_.path;
  bounce_size_ = size_t{options_.queue_depth} * options_.block_size;
  for (uint32_t k = 0; k < options_.io_lanes; ++k) {
    IoLane& lane = lanes_.emplace_back();
    ZT_ASSIGN_OR_RETURN(lane.engine, CreateIoEngine(options_.queue_depth, options_.warn));
    // mmap: page-aligned, and untouched pages cost nothing.
    void* bounce =
        mmap(nullptr, bounce_size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (bounce == MAP_FAILED) {
      return absl::ResourceExhaustedError(absl::StrCat("swap store '", path, "': cannot map ",
                                                       bounce_size_, " bytes of staging buffers"));
    }
    lane.bounce = static_cast<std::byte*>(bounce);
  }
  lane_busy_.assign(lanes_.size(), false);
  report.io_uring = lanes_.front().engine->uses_io_uring();

  rocksdb::Options db_options;
  db_options.create_if_missing = true;
  db_options.paranoid_checks = true;
  db_options.max_open_files = 64;
  db_options.keep_log_file_num = 2;
  const std::string index_path = swap_format::IndexPath(path);
  rocksdb::DB* db = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(db_options, index_path, &db);
  if (!s.ok()) {
    if (s.IsIOError() && s.ToString().find("lock") != std::string::npos) {
      return absl::FailedPreconditionError(absl::StrCat(
          "swap store index '", index_path,
          "' is held by another process: a node has one swap store, shared by its ranks "
          "(RocksDB admits one process per database): ",
          s.ToString()));
    }
    return RocksStatus(s, "cannot open swap store index", index_path);
  }
  db_.reset(db);

  std::string value;
  s = db_->Get(rocksdb::ReadOptions(), swap_format::kMetaKey, &value);
  if (s.IsNotFound()) {
    report.created = true;
    made_by_this_open_.push_back(index_path);
    s = db_->Put(rocksdb::WriteOptions(), swap_format::kMetaKey,
                 swap_format::EncodeMeta(options_.file_size, options_.file_count));
    if (!s.ok()) return RocksStatus(s, "cannot write swap store index", index_path);
  } else if (!s.ok()) {
    return RocksStatus(s, "cannot read swap store index", index_path);
  } else {
    ZT_ASSIGN_OR_RETURN(const swap_format::Meta meta, swap_format::DecodeMeta(value, index_path));
    if (meta.file_size != options_.file_size || meta.file_count != options_.file_count) {
      return absl::FailedPreconditionError(absl::StrCat(
          "swap store '", path, "' was made with ", meta.file_count, " swap files of ",
          meta.file_size, " bytes; asked for ", options_.file_count, " of ", options_.file_size,
          ": remove the directory's content or use the same geometry"));
    }
  }
  s = db_->Get(rocksdb::ReadOptions(), swap_format::kStateKey, &value);
  report.unclean = s.ok() && value == swap_format::kStateOpen;

  bool warned_direct = false;
  report.direct_io = options_.direct_io;
  // A swap file missing under an existing index (removed by hand, a wiped disk) makes the
  // index's word worth nothing: verified like an unclean store.
  bool file_was_missing = false;
  for (uint32_t i = 0; i < options_.file_count; ++i) {
    File file{.path = swap_format::SwapFilePath(path, i)};
    const bool missing = access(file.path.c_str(), F_OK) != 0;
    file_was_missing = file_was_missing || missing;
    ZT_ASSIGN_OR_RETURN(const OpenedFile opened, env_->Open(file.path, options_.direct_io));
    if (missing) made_by_this_open_.push_back(file.path);
    file.fd = opened.fd;
    file.direct = opened.direct;
    files_.push_back(file);
    dirty_.push_back(false);
    if (options_.direct_io && !opened.direct) {
      report.direct_io = false;
      if (!warned_direct) {
        warned_direct = true;
        options_.warn(absl::StrCat("swap store '", path,
                                   "': the filesystem refuses O_DIRECT; using buffered I/O "
                                   "(the page cache then competes with the pinned pool)"));
      }
    }
    ZT_RETURN_IF_ERROR(env_->Preallocate(file.fd, file.path, options_.file_size));
  }

  // A store whose index cannot be trusted is verified; what fails is discarded or refused.
  absl::Status trust = LoadIndexLocked();
  if (trust.ok()) trust = RebuildFreeListLocked();
  if (trust.ok() &&
      (report.unclean || options_.verify_clean_stores || (file_was_missing && !report.created))) {
    trust = VerifyLocked();
    for (const auto& [name, job] : jobs_) report.extents_verified += job.extents.size();
  }
  if (!trust.ok()) {
    const std::string reason =
        absl::StrCat("swap store '", path, "'", report.unclean ? " was not closed cleanly and" : "",
                     " failed verification: ", trust.message());
    if (options_.recovery == RecoveryPolicy::kFail) return absl::DataLossError(reason);
    ZT_RETURN_IF_ERROR(DiscardLocked(reason));
    report.extents_verified = 0;
    report.discarded = true;
    report.discard_reason = reason;
    options_.warn(absl::StrCat(reason,
                               "; discarded its content (swap is scratch: the jobs "
                               "resume from their checkpoints)"));
  }
  ZT_RETURN_IF_ERROR(PutStateLocked(swap_format::kStateOpen));
  opened_ = true;
  return absl::OkStatus();
}

absl::Status SwapStore::PutStateLocked(absl::string_view state) {
  rocksdb::WriteOptions sync;
  sync.sync = true;
  const rocksdb::Status s =
      db_->Put(sync, swap_format::kStateKey, rocksdb::Slice(state.data(), state.size()));
  if (!s.ok())
    return RocksStatus(s, "cannot write swap store index", swap_format::IndexPath(options_.path));
  return absl::OkStatus();
}

absl::Status SwapStore::LoadIndexLocked() {
  jobs_.clear();
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  // Committed generations first: an extent is checked against its job's.
  for (it->Seek(swap_format::kCommittedPrefix);
       it->Valid() && it->key().starts_with(swap_format::kCommittedPrefix); it->Next()) {
    ZT_ASSIGN_OR_RETURN(auto committed,
                        swap_format::DecodeCommitted(it->key().ToString(), it->value().ToString()));
    jobs_[committed.first].committed = committed.second;
  }
  for (it->Seek(swap_format::kExtentPrefix);
       it->Valid() && it->key().starts_with(swap_format::kExtentPrefix); it->Next()) {
    ZT_ASSIGN_OR_RETURN(const SwapKey key, swap_format::DecodeExtentKey(it->key().ToString()));
    ZT_ASSIGN_OR_RETURN(const swap_format::ExtentRecord rec,
                        swap_format::DecodeExtentValue(it->value().ToString(), SwapKeyText(key)));
    auto job = jobs_.find(key.job);
    if (job == jobs_.end() || job->second.committed != key.generation) {
      return absl::DataLossError(absl::StrCat("the index holds ", SwapKeyText(key),
                                              ", which is not its job's committed generation"));
    }
    if (rec.file >= options_.file_count || rec.offset + RoundUp(rec.length) > options_.file_size) {
      return absl::DataLossError(
          absl::StrCat("the index places ", SwapKeyText(key), " outside the swap files"));
    }
    job->second
        .extents[Slot{key.unit, key.range_begin, key.range_end, static_cast<uint8_t>(key.role)}] =
        Extent{.file = rec.file, .offset = rec.offset, .length = rec.length, .crc = rec.crc};
  }
  if (!it->status().ok()) {
    return absl::DataLossError(absl::StrCat("reading the index: ", it->status().ToString()));
  }
  return absl::OkStatus();
}

absl::Status SwapStore::RebuildFreeListLocked() {
  free_.assign(options_.file_count, {});
  for (auto& f : free_) f[0] = options_.file_size;
  for (const auto& [name, job] : jobs_) {
    for (const auto& [slot, e] : job.extents) {
      if (e.length == 0) continue;
      auto& free = free_[e.file];
      const uint64_t end = e.offset + RoundUp(e.length);
      auto it = free.upper_bound(e.offset);
      if (it == free.begin() || std::prev(it)->first + std::prev(it)->second < end) {
        return absl::DataLossError(absl::StrCat("two extents of the index overlap in '",
                                                files_[e.file].path, "' at offset ", e.offset,
                                                " (job '", name, "')"));
      }
      --it;
      const uint64_t begin = it->first, len = it->second;
      free.erase(it);
      if (e.offset > begin) free[begin] = e.offset - begin;
      if (begin + len > end) free[end] = begin + len - end;
    }
  }
  return absl::OkStatus();
}

absl::Status SwapStore::VerifyLocked() {
  std::vector<std::byte> buf;
  for (const auto& [name, job] : jobs_) {
    for (const auto& [slot, e] : job.extents) {
      buf.resize(e.length);
      const SwapKey key{.job = name,
                        .unit = std::get<0>(slot),
                        .range_begin = std::get<1>(slot),
                        .range_end = std::get<2>(slot),
                        .role = static_cast<SwapRole>(std::get<3>(slot)),
                        .generation = job.committed};
      // At open: no other call runs, so the first lane is free.
      ZT_RETURN_IF_ERROR(ReadExtent(lanes_.front(), e, SwapKeyText(key), absl::MakeSpan(buf)));
    }
  }
  return absl::OkStatus();
}

absl::Status SwapStore::DiscardLocked(std::string reason) {
  rocksdb::WriteBatch batch;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (const char* prefix : {swap_format::kExtentPrefix, swap_format::kCommittedPrefix}) {
    for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
      batch.Delete(it->key());
    }
  }
  rocksdb::WriteOptions sync;
  sync.sync = true;
  const rocksdb::Status s = db_->Write(sync, &batch);
  if (!s.ok()) {
    return RocksStatus(s, absl::StrCat(reason, "; and discarding it failed: index"),
                       swap_format::IndexPath(options_.path));
  }
  jobs_.clear();
  free_.assign(options_.file_count, {});
  for (auto& f : free_) f[0] = options_.file_size;
  return absl::OkStatus();
}

SwapStore::~SwapStore() {
  absl::MutexLock lock(&mu_);
  // A commit that stopped part-way, or an open that failed before the store was judged, leaves
  // the state as it was ("open" after a crash), so the next open verifies.
  if (opened_ && broken_.ok()) PutStateLocked(swap_format::kStateClean).IgnoreError();
  db_.reset();
  for (const File& f : files_) env_->Close(f.fd);
  for (IoLane& lane : lanes_) {
    if (lane.bounce != nullptr) munmap(lane.bounce, bounce_size_);
  }
  // A store a failed commit stopped stays, as a crashed one does, for the next open to verify.
  if (options_.remove_when_closed && opened_ && broken_.ok()) RemoveFilesLocked();
  std::error_code ec;
  for (const std::string& made : made_by_failed_open_) std::filesystem::remove_all(made, ec);
}

void SwapStore::RemoveFilesLocked() {
  std::error_code ec;
  for (uint32_t i = 0; i < options_.file_count; ++i) {
    std::filesystem::remove(swap_format::SwapFilePath(options_.path, i), ec);
  }
  std::filesystem::remove_all(swap_format::IndexPath(options_.path), ec);
  // Only when nothing else is left in it: the directory may hold what the store did not make.
  std::filesystem::remove(options_.path, ec);
}

absl::Status SwapStore::CheckUsableLocked() const {
  if (!broken_.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("swap store '", options_.path,
                     "' stopped after a failed commit (reopen it to verify): ", broken_.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<SwapStore::Extent> SwapStore::AllocateLocked(uint64_t length, const SwapKey& key) {
  const uint64_t need = RoundUp(length);
  if (need == 0) return Extent{};
  uint64_t total_free = 0, largest = 0;
  auto home = placement_.find(key.job);
  const uint32_t first = home == placement_.end() ? 0 : home->second;
  for (uint32_t k = 0; k < free_.size(); ++k) {
    const uint32_t f = static_cast<uint32_t>((first + k) % free_.size());
    for (auto it = free_[f].begin(); it != free_[f].end(); ++it) {
      total_free += it->second;
      largest = std::max(largest, it->second);
      if (it->second >= need) {
        const uint64_t offset = it->first, len = it->second;
        free_[f].erase(it);
        if (len > need) free_[f][offset + need] = len - need;
        return Extent{.file = f, .offset = offset, .length = length};
      }
    }
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("swap store '", options_.path, "' is full: ", SwapKeyText(key), " needs ", need,
                   " bytes, the largest free extent is ", largest, " (", total_free,
                   " bytes free in ", options_.file_count, " swap files of ", options_.file_size,
                   " bytes); give the store more or larger swap files"));
}

void SwapStore::FreeLocked(const Extent& e) {
  if (e.length == 0) return;
  if (pins_.contains({e.file, e.offset})) {
    freed_while_pinned_.push_back(e);  // a read is moving its bytes: reused once it ends
    return;
  }
  auto& free = free_[e.file];
  uint64_t begin = e.offset, len = RoundUp(e.length);
  auto next = free.lower_bound(begin);
  if (next != free.end() && begin + len == next->first) {
    len += next->second;
    next = free.erase(next);
  }
  if (next != free.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == begin) {
      begin = prev->first;
      len += prev->second;
      free.erase(prev);
    }
  }
  free[begin] = len;
}

absl::Status SwapStore::WriteExtent(IoLane& lane, const Extent& e,
                                    absl::Span<const std::byte> data) {
  const File& file = files_[e.file];
  const uint64_t padded = RoundUp(e.length);
  std::vector<IoOp> ops;
  size_t bounce_used = 0;
  for (uint64_t pos = 0; pos < padded; pos += options_.block_size) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(options_.block_size, padded - pos));
    std::byte* src = const_cast<std::byte*>(data.data()) + pos;
    if (pos + chunk > e.length || !Aligned(src)) {
      // The tail and unaligned callers' data go through an aligned staging block, zero-padded.
      if (bounce_used == options_.queue_depth) {
        ZT_RETURN_IF_ERROR(env_->Run(*lane.engine, ops));
        ops.clear();
        bounce_used = 0;
      }
      std::byte* slot = lane.bounce + bounce_used++ * size_t{options_.block_size};
      const size_t have = static_cast<size_t>(std::min<uint64_t>(chunk, e.length - pos));
      std::memcpy(slot, src, have);
      std::memset(slot + have, 0, chunk - have);
      src = slot;
    }
    ops.push_back(IoOp{.kind = IoOp::Kind::kWrite,
                       .fd = file.fd,
                       .buf = src,
                       .length = chunk,
                       .offset = e.offset + pos,
                       .path = &file.path});
  }
  return env_->Run(*lane.engine, ops);
}

absl::Status SwapStore::ReadExtent(IoLane& lane, const Extent& e, const std::string& what,
                                   absl::Span<std::byte> out) {
  const File& file = files_[e.file];
  const uint64_t padded = RoundUp(e.length);
  std::vector<IoOp> ops;
  // (staging block, destination, bytes) copied out after each wave.
  std::vector<std::tuple<std::byte*, std::byte*, size_t>> copies;
  size_t bounce_used = 0;
  auto run_wave = [&]() -> absl::Status {
    ZT_RETURN_IF_ERROR(env_->Run(*lane.engine, ops));
    for (const auto& [from, to, n] : copies) std::memcpy(to, from, n);
    ops.clear();
    copies.clear();
    bounce_used = 0;
    return absl::OkStatus();
  };
  for (uint64_t pos = 0; pos < padded; pos += options_.block_size) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(options_.block_size, padded - pos));
    std::byte* dst = out.data() + pos;
    if (pos + chunk > e.length || !Aligned(dst)) {
      if (bounce_used == options_.queue_depth) ZT_RETURN_IF_ERROR(run_wave());
      std::byte* slot = lane.bounce + bounce_used++ * size_t{options_.block_size};
      copies.emplace_back(slot, dst,
                          static_cast<size_t>(std::min<uint64_t>(chunk, e.length - pos)));
      dst = slot;
    }
    ops.push_back(IoOp{.kind = IoOp::Kind::kRead,
                       .fd = file.fd,
                       .buf = dst,
                       .length = chunk,
                       .offset = e.offset + pos,
                       .path = &file.path});
  }
  ZT_RETURN_IF_ERROR(run_wave());
  const uint32_t crc = Crc32cExtend(0, out.data(), e.length);
  if (crc != e.crc) {
    return absl::DataLossError(
        absl::StrCat("swap extent of ", what, " in '", file.path, "' at offset ", e.offset, " (",
                     e.length, " bytes): CRC32C ", Crc32cToHex(crc), " does not match the index's ",
                     Crc32cToHex(e.crc), ": the extent is torn or stale"));
  }
  return absl::OkStatus();
}

size_t SwapStore::AcquireLaneLocked() {
  mu_.Await(absl::Condition(
      +[](std::vector<bool>* busy) {
        return std::find(busy->begin(), busy->end(), false) != busy->end();
      },
      &lane_busy_));
  const size_t lane = static_cast<size_t>(std::find(lane_busy_.begin(), lane_busy_.end(), false) -
                                          lane_busy_.begin());
  lane_busy_[lane] = true;
  return lane;
}

void SwapStore::ReleaseLaneLocked(size_t lane) { lane_busy_[lane] = false; }

void SwapStore::PinLocked(const Extent& e) {
  if (e.length > 0) ++pins_[{e.file, e.offset}];
}

void SwapStore::UnpinLocked(const Extent& e) {
  if (e.length == 0) return;
  auto it = pins_.find({e.file, e.offset});
  if (--it->second > 0) return;
  pins_.erase(it);
  for (auto f = freed_while_pinned_.begin(); f != freed_while_pinned_.end(); ++f) {
    if (f->file == e.file && f->offset == e.offset) {
      const Extent freed = *f;
      freed_while_pinned_.erase(f);
      FreeLocked(freed);
      return;
    }
  }
}

absl::Status SwapStore::Write(const SwapKey& key, absl::Span<const std::byte> data) {
  ZT_RETURN_IF_ERROR(CheckKey(key));
  Extent e;
  size_t lane = 0;
  {
    absl::MutexLock lock(&mu_);
    ZT_RETURN_IF_ERROR(CheckUsableLocked());
    JobState* job = &jobs_[key.job];
    // A commit of the job between its checks and its switch decides what its generation holds.
    mu_.Await(absl::Condition(
        +[](JobState* j) { return !j->committing; }, job));
    if (key.generation <= job->committed) {
      return absl::FailedPreconditionError(absl::StrCat(
          "write of ", SwapKeyText(key), ": the job's committed generation is ", job->committed,
          "; a step writes a newer generation, never over the committed one"));
    }
    if (job->staged != 0 && job->staged != key.generation) {
      return absl::FailedPreconditionError(
          absl::StrCat("write of ", SwapKeyText(key), ": generation ", job->staged,
                       " is staged and not committed; commit it first"));
    }
    ZT_ASSIGN_OR_RETURN(e, AllocateLocked(data.size(), key));
    job->staged = key.generation;  // claimed: another generation's write is refused meanwhile
    ++job->writes_in_flight;
    lane = AcquireLaneLocked();
  }
  e.crc = Crc32cExtend(0, data.data(), data.size());
  const absl::Status written = WriteExtent(lanes_[lane], e, data);
  absl::MutexLock lock(&mu_);
  ReleaseLaneLocked(lane);
  JobState& job = jobs_[key.job];
  --job.writes_in_flight;
  if (!written.ok()) {
    FreeLocked(e);
    if (job.staged_extents.empty() && job.writes_in_flight == 0) job.staged = 0;
    return absl::Status(written.code(),
                        absl::StrCat("write of ", SwapKeyText(key), ": ", written.message()));
  }
  // Dirty once written, not before: a commit that syncs meanwhile would clear a mark made
  // ahead of the bytes it did not sync.
  dirty_[e.file] = true;
  bytes_written_ += e.length;
  const Slot slot{key.unit, key.range_begin, key.range_end, static_cast<uint8_t>(key.role)};
  auto [it, inserted] = job.staged_extents.try_emplace(slot, e);
  if (!inserted) {
    FreeLocked(it->second);
    it->second = e;
  }
  return absl::OkStatus();
}

absl::Status SwapStore::BreakCommit(absl::string_view job, uint64_t generation,
                                    const absl::Status& s) {
  absl::MutexLock lock(&mu_);
  broken_ = absl::Status(s.code(), absl::StrCat("commit of job '", job, "' generation ", generation,
                                                ": ", s.message()));
  return broken_;
}

absl::Status SwapStore::Commit(absl::string_view job_name, uint64_t generation) {
  absl::MutexLock commit(&commit_mu_);
  {
    absl::MutexLock lock(&mu_);
    ZT_RETURN_IF_ERROR(CheckUsableLocked());
    JobState* job = &jobs_[std::string(job_name)];
    // The generation's writes still moving finish first (a caller that queued them before
    // this commit meant them in it).
    mu_.Await(absl::Condition(
        +[](JobState* j) { return j->writes_in_flight == 0; }, job));
    ZT_RETURN_IF_ERROR(CheckUsableLocked());
    if (generation <= job->committed) {
      return absl::FailedPreconditionError(
          absl::StrCat("commit of job '", job_name, "' generation ", generation,
                       ": not newer than the committed generation ", job->committed));
    }
    if (job->staged != 0 && job->staged != generation) {
      return absl::FailedPreconditionError(
          absl::StrCat("commit of job '", job_name, "' generation ", generation,
                       ": the staged generation is ", job->staged));
    }
    job->committing = true;
  }
  const absl::Status s = CommitDataAndIndex(job_name, generation);
  absl::MutexLock lock(&mu_);
  jobs_[std::string(job_name)].committing = false;
  return s;
}

absl::Status SwapStore::CommitDataAndIndex(absl::string_view job_name, uint64_t generation) {
  // From here a failure leaves the disk in a state only a reopen may judge.
  if (auto s = env_->AtCommitStage(CommitStage::kDataWritten, job_name, generation); !s.ok()) {
    return BreakCommit(job_name, generation, s);
  }
  // Every file written since its last sync, this job's writes among them. The marks are
  // cleared before syncing: a write that lands meanwhile marks its file again for the next
  // commit, and commits run one at a time, so a later one never passes a sync still running.
  std::vector<size_t> to_sync;
  size_t lane = 0;
  {
    absl::MutexLock lock(&mu_);
    for (size_t f = 0; f < files_.size(); ++f) {
      if (!dirty_[f]) continue;
      to_sync.push_back(f);
      dirty_[f] = false;
    }
    lane = AcquireLaneLocked();
  }
  absl::Status synced;
  for (const size_t f : to_sync) {
    synced = env_->SyncData(*lanes_[lane].engine, files_[f].fd, files_[f].path);
    if (!synced.ok()) break;
  }
  {
    absl::MutexLock lock(&mu_);
    ReleaseLaneLocked(lane);
  }
  if (!synced.ok()) return BreakCommit(job_name, generation, synced);
  if (auto s = env_->AtCommitStage(CommitStage::kDataDurable, job_name, generation); !s.ok()) {
    return BreakCommit(job_name, generation, s);
  }
  // The next generation's map, built under the lock (no write of the job runs: `committing`),
  // written to the index outside it (reads go on meanwhile) and switched to under it.
  std::map<Slot, Extent> next;
  std::vector<Extent> replaced;
  rocksdb::WriteBatch batch;
  {
    absl::MutexLock lock(&mu_);
    const JobState& job = jobs_[std::string(job_name)];
    next = job.extents;
    for (const auto& [slot, e] : job.staged_extents) {
      auto [it, inserted] = next.try_emplace(slot, e);
      if (!inserted) {
        replaced.push_back(it->second);
        it->second = e;
      }
    }
    SwapKey key{.job = std::string(job_name)};
    auto set_slot = [&key](const Slot& slot) {
      key.unit = std::get<0>(slot);
      key.range_begin = std::get<1>(slot);
      key.range_end = std::get<2>(slot);
      key.role = static_cast<SwapRole>(std::get<3>(slot));
    };
    for (const auto& [slot, e] : job.extents) {
      set_slot(slot);
      key.generation = job.committed;
      batch.Delete(swap_format::EncodeExtentKey(key));
    }
    for (const auto& [slot, e] : next) {
      set_slot(slot);
      key.generation = generation;
      batch.Put(swap_format::EncodeExtentKey(key),
                swap_format::EncodeExtentValue(
                    {.file = e.file, .offset = e.offset, .length = e.length, .crc = e.crc}));
    }
  }
  batch.Put(swap_format::EncodeCommittedKey(job_name), swap_format::EncodeGeneration(generation));
  rocksdb::WriteOptions sync;
  sync.sync = true;
  if (const rocksdb::Status s = db_->Write(sync, &batch); !s.ok()) {
    return BreakCommit(
        job_name, generation,
        RocksStatus(s, "cannot write swap store index", swap_format::IndexPath(options_.path)));
  }
  {
    absl::MutexLock lock(&mu_);
    JobState& job = jobs_[std::string(job_name)];
    job.extents = std::move(next);
    job.committed = generation;
    job.staged = 0;
    job.staged_extents.clear();
    for (const Extent& e : replaced) FreeLocked(e);
  }
  if (auto s = env_->AtCommitStage(CommitStage::kIndexCommitted, job_name, generation); !s.ok()) {
    return BreakCommit(job_name, generation, s);
  }
  return absl::OkStatus();
}

absl::StatusOr<const SwapStore::Extent*> SwapStore::FindLocked(const SwapKey& key) {
  ZT_RETURN_IF_ERROR(CheckKey(key));
  ZT_RETURN_IF_ERROR(CheckUsableLocked());
  auto job = jobs_.find(key.job);
  const Slot slot{key.unit, key.range_begin, key.range_end, static_cast<uint8_t>(key.role)};
  if (job != jobs_.end()) {
    const JobState& js = job->second;
    const std::map<Slot, Extent>* extents = key.generation == js.staged      ? &js.staged_extents
                                            : key.generation == js.committed ? &js.extents
                                                                             : nullptr;
    if (extents != nullptr) {
      if (auto it = extents->find(slot); it != extents->end()) return &it->second;
    }
    return absl::NotFoundError(absl::StrCat(SwapKeyText(key), " is not in swap store '",
                                            options_.path, "' (committed generation ", js.committed,
                                            ", staged generation ", js.staged, ")"));
  }
  return absl::NotFoundError(
      absl::StrCat(SwapKeyText(key), " is not in swap store '", options_.path, "' (no such job)"));
}

absl::StatusOr<size_t> SwapStore::Length(const SwapKey& key) {
  absl::MutexLock lock(&mu_);
  ZT_ASSIGN_OR_RETURN(const Extent* e, FindLocked(key));
  return static_cast<size_t>(e->length);
}

absl::StatusOr<size_t> SwapStore::Read(const SwapKey& key, absl::Span<std::byte> out) {
  Extent e;
  size_t lane = 0;
  {
    absl::MutexLock lock(&mu_);
    ZT_ASSIGN_OR_RETURN(const Extent* found, FindLocked(key));
    e = *found;  // by value: a commit meanwhile rebuilds the maps
    if (out.size() < e.length) {
      return absl::InvalidArgumentError(absl::StrCat("read of ", SwapKeyText(key), ": ", out.size(),
                                                     " bytes given for an extent of ", e.length));
    }
    PinLocked(e);
    lane = AcquireLaneLocked();
  }
  const absl::Status read = ReadExtent(lanes_[lane], e, SwapKeyText(key), out);
  absl::MutexLock lock(&mu_);
  ReleaseLaneLocked(lane);
  UnpinLocked(e);
  if (!read.ok()) return read;
  bytes_read_ += e.length;
  return static_cast<size_t>(e.length);
}

uint64_t SwapStore::CommittedGeneration(absl::string_view job) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job);
  return it == jobs_.end() ? 0 : it->second.committed;
}

absl::Status SwapStore::SetPlacement(absl::string_view job, uint32_t first_file) {
  if (first_file >= options_.file_count) {
    return absl::InvalidArgumentError(absl::StrCat("swap store '", options_.path, "': file ",
                                                   first_file, " for job '", job, "' (it has ",
                                                   options_.file_count, ")"));
  }
  absl::MutexLock lock(&mu_);
  placement_[std::string(job)] = first_file;
  return absl::OkStatus();
}

absl::Status SwapStore::DropJob(absl::string_view job_name) {
  absl::MutexLock commit(&commit_mu_);  // no commit of it is running
  absl::MutexLock lock(&mu_);
  ZT_RETURN_IF_ERROR(CheckUsableLocked());
  auto job = jobs_.find(job_name);
  if (job == jobs_.end()) return absl::OkStatus();
  mu_.Await(absl::Condition(
      +[](JobState* j) { return j->writes_in_flight == 0; }, &job->second));
  rocksdb::WriteBatch batch;
  SwapKey key{.job = std::string(job_name), .generation = job->second.committed};
  for (const auto& [slot, e] : job->second.extents) {
    key.unit = std::get<0>(slot);
    key.range_begin = std::get<1>(slot);
    key.range_end = std::get<2>(slot);
    key.role = static_cast<SwapRole>(std::get<3>(slot));
    batch.Delete(swap_format::EncodeExtentKey(key));
  }
  batch.Delete(swap_format::EncodeCommittedKey(job_name));
  rocksdb::WriteOptions sync;
  sync.sync = true;
  if (const rocksdb::Status s = db_->Write(sync, &batch); !s.ok()) {
    return RocksStatus(s, "cannot write swap store index", swap_format::IndexPath(options_.path));
  }
  for (const auto& [slot, e] : job->second.extents) FreeLocked(e);
  for (const auto& [slot, e] : job->second.staged_extents) FreeLocked(e);
  jobs_.erase(job);
  return absl::OkStatus();
}

SwapStoreStats SwapStore::stats() {
  absl::MutexLock lock(&mu_);
  SwapStoreStats st;
  st.capacity_bytes = options_.file_size * options_.file_count;
  for (const auto& f : free_) {
    for (const auto& [off, len] : f) st.free_bytes += len;
  }
  for (const auto& [name, job] : jobs_) {
    st.committed_extents += job.extents.size();
    st.staged_extents += job.staged_extents.size();
  }
  st.bytes_written = bytes_written_;
  st.bytes_read = bytes_read_;
  return st;
}

}  // namespace zt::offload
