#include "worker/checkpoint/checkpoint_directory.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "kernels/status_macros.h"
#include "kernels/crc32c.h"
#include "worker/checkpoint/durable_file.h"

namespace zt {
namespace {

using durable_file::DigestFile;
using durable_file::ErrnoStatus;
using durable_file::FileDigest;
using durable_file::IsDirectory;
using durable_file::IsRegularFile;
using durable_file::JoinPath;
using durable_file::kIoChunkBytes;
using durable_file::ListNames;
using durable_file::ReadSmallFile;
using durable_file::RemoveTree;
using durable_file::SyncDirectory;
using durable_file::WriteAll;
using durable_file::WriteSyncedFile;

std::string RandomSuffix() {
  absl::BitGen gen;
  return absl::StrFormat("%016x", absl::Uniform<uint64_t>(gen));
}

// The step of a directory name "step-" + at least 8 digits, or nullopt.
std::optional<int64_t> ParseStepDirName(std::string_view name) {
  constexpr std::string_view kPrefix = "step-";
  if (name.substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
  const std::string_view digits = name.substr(kPrefix.size());
  if (digits.size() < 8 || digits.size() > 18) return std::nullopt;
  int64_t step = 0;
  for (char ch : digits) {
    if (ch < '0' || ch > '9') return std::nullopt;
    step = step * 10 + (ch - '0');
  }
  if (CheckpointStepDirName(step) != name) return std::nullopt;
  return step;
}

// The temporary paths of this process's open saves, so that Prune() spares them.
std::mutex& LiveTempMutex() {
  static std::mutex mu;
  return mu;
}
std::set<std::string>& LiveTempPaths() {
  static auto* paths = new std::set<std::string>();
  return *paths;
}

// The manifest's checksum covers its compact serialization without the checksum field, so a
// flipped byte that still parses (a digit of a size, a value of the state) is caught too.
constexpr char kManifestChecksumField[] = "manifest_crc32c";

absl::StatusOr<std::string> DumpJson(const nlohmann::json& j, int indent, const std::string& what) {
  try {
    return j.dump(indent);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": cannot serialize: ", e.what()));
  }
}

}  // namespace

std::string CheckpointStepDirName(int64_t step) { return absl::StrFormat("step-%08d", step); }

// ---------------------------------------------------------------------------------------------
// The state a save shares with its writers (which may run on other threads, and outlive it).

struct CheckpointSaveShared {
  struct FileRecord {
    bool closed = false;
    absl::Status error;  // the writer's first failure
    int64_t size = 0;
    uint32_t crc32c = 0;
  };
  std::mutex mu;
  bool accepting = true;  // false once sealed or aborted
  std::map<std::string, FileRecord> files;
};

// ---------------------------------------------------------------------------------------------
// CheckpointFileWriter

CheckpointFileWriter::~CheckpointFileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status CheckpointFileWriter::Fail(std::string_view what, int err) {
  io_status_ = ErrnoStatus(err, absl::string_view(what.data(), what.size()), path_);
  std::lock_guard<std::mutex> lock(shared_->mu);
  shared_->files[name_].error = io_status_;
  return io_status_;
}

absl::Status CheckpointFileWriter::Flush() {
  if (buffer_.empty()) return absl::OkStatus();
  const int err = WriteAll(fd_, buffer_.data(), buffer_.size());
  buffer_.clear();
  if (err != 0) return Fail("write failed", err);
  return absl::OkStatus();
}

absl::Status CheckpointFileWriter::Append(absl::Span<const uint8_t> bytes) {
  ZT_RETURN_IF_ERROR(io_status_);
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat("'", path_, "' is closed"));
  crc_ = Crc32cExtend(crc_, bytes.data(), bytes.size());
  size_ += static_cast<int64_t>(bytes.size());
  // Small appends (headers, biases) gather in the buffer; large ones go straight to the file.
  if (buffer_.size() + bytes.size() <= kIoChunkBytes) {
    buffer_.insert(buffer_.end(), bytes.begin(), bytes.end());
    return absl::OkStatus();
  }
  ZT_RETURN_IF_ERROR(Flush());
  if (bytes.size() < kIoChunkBytes) {
    buffer_.assign(bytes.begin(), bytes.end());
    return absl::OkStatus();
  }
  const int err = WriteAll(fd_, bytes.data(), bytes.size());
  if (err != 0) return Fail("write failed", err);
  return absl::OkStatus();
}

absl::Status CheckpointFileWriter::Append(std::string_view bytes) {
  return Append(
      absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
}

absl::Status CheckpointFileWriter::Close() {
  ZT_RETURN_IF_ERROR(io_status_);
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat("'", path_, "' closed twice"));
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    if (!shared_->accepting) {
      return absl::FailedPreconditionError(
          absl::StrCat("closing '", path_, "': its save was already sealed or aborted"));
    }
  }
  ZT_RETURN_IF_ERROR(Flush());
  if (::fsync(fd_) != 0) return Fail("fsync failed", errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) return Fail("close failed", errno);
  std::lock_guard<std::mutex> lock(shared_->mu);
  CheckpointSaveShared::FileRecord& record = shared_->files[name_];
  record.closed = true;
  record.size = size_;
  record.crc32c = crc_;
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// CheckpointSave

absl::StatusOr<std::unique_ptr<CheckpointSave>> CheckpointSave::Begin(
    const std::string& dir, int64_t step, const CheckpointSaveOptions& options) {
  if (dir.empty()) return absl::InvalidArgumentError("checkpoint dir: must not be empty");
  if (step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint step ", step, " for '", dir, "': must be >= 0"));
  }
  std::unique_ptr<CheckpointSave> save(new CheckpointSave());
  save->shared_ = std::make_shared<CheckpointSaveShared>();
  save->dir_ = dir;
  save->step_ = step;
  save->options_ = options;
  const std::string step_name = CheckpointStepDirName(step);
  save->step_path_ = JoinPath(dir, step_name);

  if (!IsDirectory(dir)) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return ErrnoStatus(ec.value(), "cannot create checkpoint directory", dir);
    const std::filesystem::path parent = std::filesystem::path(dir).parent_path();
    ZT_RETURN_IF_ERROR(SyncDirectory(parent.empty() ? "." : parent.string()));
  }
  if (!options.overwrite && ::access(save->step_path_.c_str(), F_OK) == 0) {
    return absl::AlreadyExistsError(absl::StrCat("checkpoint '", save->step_path_,
                                                 "' already exists (set overwrite to replace it)"));
  }
  save->temp_path_ =
      JoinPath(dir, absl::StrCat(kCheckpointTempPrefix, step_name, "-", RandomSuffix()));
  if (::mkdir(save->temp_path_.c_str(), 0755) != 0) {
    return ErrnoStatus(errno, "cannot create directory", save->temp_path_);
  }
  std::lock_guard<std::mutex> lock(LiveTempMutex());
  LiveTempPaths().insert(save->temp_path_);
  return save;
}

CheckpointSave::~CheckpointSave() {
  if (phase_ == Phase::kOpen || phase_ == Phase::kSealed) {
    // Best effort: a temporary directory that cannot be removed is what Prune() cleans up.
    Abort().IgnoreError();
  }
  std::lock_guard<std::mutex> lock(LiveTempMutex());
  LiveTempPaths().erase(temp_path_);
}

std::string CheckpointSave::TempPath(const std::string& name) const {
  return JoinPath(temp_path_, name);
}

std::string CheckpointSave::current_path() const {
  return phase_ == Phase::kPublished || phase_ == Phase::kCounted ? step_path_ : temp_path_;
}

absl::Status CheckpointSave::CheckName(const std::string& name) const {
  auto bad = [&](absl::string_view rule) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint file name '", name, "' in '", temp_path_, "': ", rule));
  };
  if (name.empty()) return bad("must not be empty");
  if (name.size() > 255) return bad("must be at most 255 bytes");
  if (name.find('/') != std::string::npos || name.find('\0') != std::string::npos) {
    return bad("must not contain '/' or NUL");
  }
  if (name[0] == '.') return bad("must not start with '.'");
  if (name == kCheckpointManifestName) return bad("is reserved for the manifest");
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CheckpointFileWriter>> CheckpointSave::OpenFile(
    const std::string& name) {
  ZT_RETURN_IF_ERROR(CheckName(name));
  std::unique_ptr<CheckpointFileWriter> writer(new CheckpointFileWriter());
  writer->shared_ = shared_;
  writer->name_ = name;
  writer->path_ = TempPath(name);
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    if (!shared_->accepting) {
      return absl::FailedPreconditionError(
          absl::StrCat("opening '", writer->path_, "': the save was already sealed or aborted"));
    }
    if (!shared_->files.emplace(name, CheckpointSaveShared::FileRecord{}).second) {
      return absl::AlreadyExistsError(
          absl::StrCat("checkpoint file '", writer->path_, "' was already opened in this save"));
    }
  }
  writer->fd_ = ::open(writer->path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (writer->fd_ < 0) {
    const absl::Status status = ErrnoStatus(errno, "cannot create", writer->path_);
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->files[name].error = status;
    return status;
  }
  writer->buffer_.reserve(kIoChunkBytes);
  return writer;
}

absl::Status CheckpointSave::AdoptFile(const std::string& name) {
  ZT_RETURN_IF_ERROR(CheckName(name));
  const std::string path = TempPath(name);
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    if (!shared_->accepting) {
      return absl::FailedPreconditionError(
          absl::StrCat("adopting '", path, "': the save was already sealed or aborted"));
    }
    if (!shared_->files.emplace(name, CheckpointSaveShared::FileRecord{}).second) {
      return absl::AlreadyExistsError(
          absl::StrCat("checkpoint file '", path, "' was already added to this save"));
    }
  }
  CheckpointSaveShared::FileRecord record;
  const absl::StatusOr<FileDigest> digest = DigestFile(path);
  if (digest.ok()) {
    record.closed = true;
    record.size = digest->size;
    record.crc32c = digest->crc32c;
  } else {
    record.error = digest.status();
  }
  std::lock_guard<std::mutex> lock(shared_->mu);
  shared_->files[name] = record;
  return record.error;
}

absl::Status CheckpointSave::Seal(const nlohmann::json& state) {
  if (phase_ != Phase::kOpen) {
    return absl::FailedPreconditionError(
        absl::StrCat("sealing '", temp_path_, "': already sealed, published or aborted"));
  }
  nlohmann::json files = nlohmann::json::array();
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    for (const auto& [name, record] : shared_->files) {
      if (!record.error.ok()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "sealing '", temp_path_, "': file '", name, "' failed: ", record.error.message()));
      }
      if (!record.closed) {
        return absl::FailedPreconditionError(absl::StrCat("sealing '", temp_path_, "': file '",
                                                          name, "' was opened but not closed"));
      }
      files.push_back(
          {{"name", name}, {"size", record.size}, {"crc32c", Crc32cToHex(record.crc32c)}});
    }
    shared_->accepting = false;
  }
  nlohmann::json manifest = {
      {"magic", kCheckpointManifestMagic},
      {"format_version", kCheckpointFormatVersion},
      {"step", step_},
      {"checksum_algorithm", kCheckpointChecksumAlgorithm},
      {"files", std::move(files)},
      {"state", state},
  };
  const std::string manifest_path = TempPath(kCheckpointManifestName);
  ZT_ASSIGN_OR_RETURN(const std::string compact, DumpJson(manifest, -1, manifest_path));
  manifest[kManifestChecksumField] = Crc32cToHex(Crc32cExtend(0, compact.data(), compact.size()));
  ZT_ASSIGN_OR_RETURN(std::string text, DumpJson(manifest, 2, manifest_path));
  text.push_back('\n');
  ZT_RETURN_IF_ERROR(WriteSyncedFile(manifest_path, text));
  ZT_RETURN_IF_ERROR(SyncDirectory(temp_path_));
  phase_ = Phase::kSealed;
  return absl::OkStatus();
}

absl::Status CheckpointSave::Publish() {
  if (phase_ != Phase::kSealed) {
    return absl::FailedPreconditionError(
        absl::StrCat("publishing '", temp_path_, "': Seal() must succeed first"));
  }
  if (::rename(temp_path_.c_str(), step_path_.c_str()) != 0) {
    const int err = errno;
    const bool exists = err == EEXIST || err == ENOTEMPTY;
    if (!exists)
      return ErrnoStatus(err, absl::StrCat("cannot rename to '", step_path_, "'"), temp_path_);
    if (!options_.overwrite) {
      return absl::AlreadyExistsError(absl::StrCat(
          "checkpoint '", step_path_, "' already exists (set overwrite to replace it)"));
    }
    // Swap the two names in one step, so `latest` never names a missing directory; the old
    // checkpoint then sits under the temporary name and goes with it.
    if (::renameat2(AT_FDCWD, temp_path_.c_str(), AT_FDCWD, step_path_.c_str(), RENAME_EXCHANGE) !=
        0) {
      return ErrnoStatus(errno, absl::StrCat("cannot exchange with '", step_path_, "'"),
                         temp_path_);
    }
    ZT_RETURN_IF_ERROR(SyncDirectory(dir_));
    phase_ = Phase::kPublished;
    // Best effort: the new checkpoint is in place; an old one left under the temporary name is
    // what Prune() removes.
    RemoveTree(temp_path_).IgnoreError();
    return absl::OkStatus();
  }
  ZT_RETURN_IF_ERROR(SyncDirectory(dir_));
  phase_ = Phase::kPublished;
  return absl::OkStatus();
}

absl::Status CheckpointSave::MoveLatest() {
  if (phase_ != Phase::kPublished) {
    return absl::FailedPreconditionError(
        absl::StrCat("moving latest to '", step_path_, "': Publish() must succeed first"));
  }
  const std::string tmp = JoinPath(
      dir_, absl::StrCat(kCheckpointTempPrefix, kCheckpointLatestName, "-", RandomSuffix()));
  const std::string latest = JoinPath(dir_, kCheckpointLatestName);
  absl::Status status = WriteSyncedFile(tmp, CheckpointStepDirName(step_) + "\n");
  if (status.ok() && ::rename(tmp.c_str(), latest.c_str()) != 0) {
    status = ErrnoStatus(errno, absl::StrCat("cannot rename to '", latest, "'"), tmp);
  }
  if (!status.ok()) {
    ::unlink(tmp.c_str());
    return status;
  }
  ZT_RETURN_IF_ERROR(SyncDirectory(dir_));
  phase_ = Phase::kCounted;
  return absl::OkStatus();
}

absl::Status CheckpointSave::Commit(const nlohmann::json& state) {
  ZT_RETURN_IF_ERROR(Seal(state));
  ZT_RETURN_IF_ERROR(Publish());
  return MoveLatest();
}

absl::Status CheckpointSave::Abort() {
  if (phase_ == Phase::kPublished || phase_ == Phase::kCounted) {
    return absl::FailedPreconditionError(
        absl::StrCat("aborting '", step_path_, "': already published"));
  }
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->accepting = false;
  }
  if (phase_ == Phase::kAborted) return absl::OkStatus();
  phase_ = Phase::kAborted;
  return RemoveTree(temp_path_);
}

// ---------------------------------------------------------------------------------------------
// Finding and pruning

absl::StatusOr<std::string> FindLatest(const std::string& dir) {
  const std::string latest = JoinPath(dir, kCheckpointLatestName);
  absl::StatusOr<std::string> content = ReadSmallFile(latest);
  if (!content.ok()) {
    if (absl::IsNotFound(content.status())) {
      return absl::NotFoundError(absl::StrCat("no checkpoint: '", latest, "' does not exist"));
    }
    return content.status();
  }
  std::string name = *std::move(content);
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ' || name.back() == '\r')) {
    name.pop_back();
  }
  if (!ParseStepDirName(name).has_value()) {
    return absl::DataLossError(absl::StrCat("'", latest, "' does not name a step directory (",
                                            "expected step-NNNNNNNN, got '", name.substr(0, 64),
                                            "')"));
  }
  const std::string step_dir = JoinPath(dir, name);
  if (!IsDirectory(step_dir)) {
    return absl::NotFoundError(
        absl::StrCat("'", latest, "' names '", step_dir, "', which does not exist"));
  }
  return step_dir;
}

absl::StatusOr<std::vector<CheckpointEntry>> ListComplete(const std::string& dir) {
  ZT_ASSIGN_OR_RETURN(const std::vector<std::string> names, ListNames(dir));
  std::vector<CheckpointEntry> out;
  for (const std::string& name : names) {
    const std::optional<int64_t> step = ParseStepDirName(name);
    const std::string path = JoinPath(dir, name);
    if (step.has_value() && IsDirectory(path) &&
        IsRegularFile(JoinPath(path, kCheckpointManifestName))) {
      out.push_back({*step, path});
    }
  }
  std::sort(out.begin(), out.end(),
            [](const CheckpointEntry& a, const CheckpointEntry& b) { return a.step < b.step; });
  return out;
}

namespace {

// Removes step directory `path` of `dir` crash-safely: renamed to a `.tmp-` name first (one
// atomic step after which no reader sees it as a checkpoint), then deleted. A process killed
// in between, or half-way through the deletion, leaves only a `.tmp-` entry, which
// RemoveCheckpointLeftovers() deletes; never a half-deleted step directory.
absl::Status RemoveStepDirectory(const std::string& dir, const std::string& path) {
  const std::string aside =
      JoinPath(dir, absl::StrCat(kCheckpointTempPrefix, "pruned-",
                                 std::filesystem::path(path).filename().string()));
  if (IsDirectory(aside)) ZT_RETURN_IF_ERROR(RemoveTree(aside));
  if (std::rename(path.c_str(), aside.c_str()) != 0) {
    return ErrnoStatus(errno, "cannot move aside the pruned step directory", path);
  }
  ZT_RETURN_IF_ERROR(SyncDirectory(dir));
  return RemoveTree(aside);
}

}  // namespace

absl::Status RemoveCheckpointLeftovers(const std::string& dir) {
  ZT_ASSIGN_OR_RETURN(const std::vector<std::string> names, ListNames(dir));
  std::vector<std::string> stale;
  {
    std::lock_guard<std::mutex> lock(LiveTempMutex());
    for (const std::string& name : names) {
      const std::string path = JoinPath(dir, name);
      const bool temp =
          name.rfind(kCheckpointTempPrefix, 0) == 0 && LiveTempPaths().count(path) == 0;
      // A step directory without a manifest was never published (Publish renames sealed
      // directories only): the remains of a deletion that an older version did in place.
      const bool unpublished = ParseStepDirName(name).has_value() && IsDirectory(path) &&
                               !IsRegularFile(JoinPath(path, kCheckpointManifestName));
      if (temp || unpublished) stale.push_back(path);
    }
  }
  for (const std::string& path : stale) ZT_RETURN_IF_ERROR(RemoveTree(path));
  if (!stale.empty()) ZT_RETURN_IF_ERROR(SyncDirectory(dir));
  return absl::OkStatus();
}

absl::Status Prune(const std::string& dir, int keep_last) {
  if (keep_last < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint keep_last ", keep_last, " for '", dir, "': must be >= 1"));
  }
  ZT_ASSIGN_OR_RETURN(const std::vector<CheckpointEntry> complete, ListComplete(dir));
  // Without a valid `latest` nothing is known to count: only leftovers go.
  absl::StatusOr<std::string> latest = FindLatest(dir);
  if (latest.ok()) {
    const std::optional<int64_t> latest_step =
        ParseStepDirName(std::filesystem::path(*latest).filename().string());
    std::vector<const CheckpointEntry*> counted;
    for (const CheckpointEntry& entry : complete) {
      if (entry.step > *latest_step) {
        // Renamed into place but `latest` never moved: a save that died before it counted.
        // Loading ignores it, and left here it would block the resumed run's save of that step.
        ZT_RETURN_IF_ERROR(RemoveStepDirectory(dir, entry.path));
      } else {
        counted.push_back(&entry);
      }
    }
    const size_t keep = static_cast<size_t>(keep_last);
    for (size_t i = 0; i + keep < counted.size(); ++i) {
      if (counted[i]->path == *latest) continue;
      ZT_RETURN_IF_ERROR(RemoveStepDirectory(dir, counted[i]->path));
    }
  }
  return RemoveCheckpointLeftovers(dir);
}

// ---------------------------------------------------------------------------------------------
// Loading

absl::StatusOr<std::unique_ptr<Checkpoint>> OpenCheckpoint(const std::string& step_dir) {
  const std::string path = JoinPath(step_dir, kCheckpointManifestName);
  absl::StatusOr<std::string> text = ReadSmallFile(path);
  if (!text.ok()) {
    if (absl::IsNotFound(text.status())) {
      return absl::NotFoundError(absl::StrCat("checkpoint manifest '", path, "' is missing"));
    }
    return text.status();
  }
  auto corrupt = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat("checkpoint manifest '", path, "': ", why));
  };
  nlohmann::json manifest = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (manifest.is_discarded()) return corrupt("not valid JSON");
  if (!manifest.is_object()) return corrupt("not a JSON object");

  auto field = [&](const char* key) -> const nlohmann::json* {
    auto it = manifest.find(key);
    return it == manifest.end() ? nullptr : &*it;
  };
  const nlohmann::json* magic = field("magic");
  if (magic == nullptr || !magic->is_string() || *magic != kCheckpointManifestMagic) {
    return corrupt(absl::StrCat("\"magic\" must be \"", kCheckpointManifestMagic, "\""));
  }
  const nlohmann::json* version = field("format_version");
  if (version == nullptr || !version->is_number_integer() || version->get<int64_t>() < 1) {
    return corrupt("\"format_version\" must be a positive integer");
  }
  if (version->get<int64_t>() > kCheckpointFormatVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint manifest '", path, "': format version ", version->get<int64_t>(),
                     " is newer than this build reads (", kCheckpointFormatVersion, ")"));
  }
  const nlohmann::json* stored_crc = field(kManifestChecksumField);
  if (stored_crc == nullptr || !stored_crc->is_string()) {
    return corrupt(absl::StrCat("\"", kManifestChecksumField, "\" must be a string"));
  }
  const std::optional<uint32_t> expected_crc = Crc32cFromHex(stored_crc->get<std::string>());
  if (!expected_crc.has_value()) {
    return corrupt(absl::StrCat("\"", kManifestChecksumField, "\" must be 8 lowercase hex digits"));
  }
  manifest.erase(kManifestChecksumField);
  ZT_ASSIGN_OR_RETURN(const std::string compact, DumpJson(manifest, -1, path));
  if (Crc32cExtend(0, compact.data(), compact.size()) != *expected_crc) {
    return corrupt("checksum mismatch");
  }
  const nlohmann::json* algorithm = field("checksum_algorithm");
  if (algorithm == nullptr || !algorithm->is_string()) {
    return corrupt("\"checksum_algorithm\" must be a string");
  }
  if (*algorithm != kCheckpointChecksumAlgorithm) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint manifest '", path, "': checksum algorithm ", algorithm->dump(),
                     " is unknown (this build reads \"", kCheckpointChecksumAlgorithm, "\")"));
  }
  const nlohmann::json* step = field("step");
  if (step == nullptr || !step->is_number_integer() || step->get<int64_t>() < 0) {
    return corrupt("\"step\" must be an integer >= 0");
  }
  const nlohmann::json* files = field("files");
  if (files == nullptr || !files->is_array()) return corrupt("\"files\" must be an array");
  const nlohmann::json* state = field("state");
  if (state == nullptr) return corrupt("\"state\" is missing");

  std::unique_ptr<Checkpoint> checkpoint(new Checkpoint());
  checkpoint->path_ = step_dir;
  checkpoint->step_ = step->get<int64_t>();
  checkpoint->state_ = *state;
  for (size_t i = 0; i < files->size(); ++i) {
    const nlohmann::json& f = (*files)[i];
    const std::string where = absl::StrCat("\"files\"[", i, "]");
    if (!f.is_object()) return corrupt(absl::StrCat(where, " must be an object"));
    auto name = f.find("name");
    auto size = f.find("size");
    auto crc = f.find("crc32c");
    if (name == f.end() || !name->is_string() || name->get<std::string>().empty() ||
        name->get<std::string>().find('/') != std::string::npos) {
      return corrupt(absl::StrCat(where, ".name must be a file name"));
    }
    if (size == f.end() || !size->is_number_integer() || size->get<int64_t>() < 0) {
      return corrupt(absl::StrCat(where, ".size must be an integer >= 0"));
    }
    std::optional<uint32_t> crc_value;
    if (crc != f.end() && crc->is_string()) crc_value = Crc32cFromHex(crc->get<std::string>());
    if (!crc_value.has_value()) {
      return corrupt(absl::StrCat(where, ".crc32c must be 8 lowercase hex digits"));
    }
    checkpoint->files_.push_back({name->get<std::string>(), size->get<int64_t>(), *crc_value});
  }
  std::sort(
      checkpoint->files_.begin(), checkpoint->files_.end(),
      [](const CheckpointFileInfo& a, const CheckpointFileInfo& b) { return a.name < b.name; });
  for (size_t i = 1; i < checkpoint->files_.size(); ++i) {
    if (checkpoint->files_[i].name == checkpoint->files_[i - 1].name) {
      return corrupt(absl::StrCat("file '", checkpoint->files_[i].name, "' is listed twice"));
    }
  }
  return checkpoint;
}

const CheckpointFileInfo* Checkpoint::Find(std::string_view name) const {
  auto it =
      std::lower_bound(files_.begin(), files_.end(), name,
                       [](const CheckpointFileInfo& f, std::string_view n) { return f.name < n; });
  return it != files_.end() && it->name == name ? &*it : nullptr;
}

std::string Checkpoint::FilePath(std::string_view name) const {
  return JoinPath(path_, std::string(name));
}

absl::Status Checkpoint::Verify(std::string_view name) const {
  const CheckpointFileInfo* info = Find(name);
  const std::string path = FilePath(name);
  if (info == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint '", path_, "' lists no file '", std::string(name), "'"));
  }
  const absl::StatusOr<FileDigest> digest = DigestFile(path);
  if (absl::IsNotFound(digest.status())) {
    return absl::DataLossError(absl::StrCat("'", path, "': missing"));
  }
  ZT_RETURN_IF_ERROR(digest.status());
  const int64_t size = digest->size;
  const uint32_t crc = digest->crc32c;
  if (size < info->size) {
    return absl::DataLossError(
        absl::StrCat("'", path, "': truncated: ", size, " of ", info->size, " bytes"));
  }
  if (size > info->size) {
    return absl::DataLossError(
        absl::StrCat("'", path, "': has ", size, " bytes, the manifest lists ", info->size));
  }
  if (crc != info->crc32c) {
    return absl::DataLossError(absl::StrCat("'", path, "': checksum mismatch (crc32c ",
                                            Crc32cToHex(crc), ", manifest ",
                                            Crc32cToHex(info->crc32c), ")"));
  }
  return absl::OkStatus();
}

absl::Status Checkpoint::VerifyAll() const {
  for (const CheckpointFileInfo& f : files_) ZT_RETURN_IF_ERROR(Verify(f.name));
  return absl::OkStatus();
}

absl::Status Checkpoint::ReadRange(std::string_view name, int64_t offset,
                                   absl::Span<uint8_t> dst) const {
  const CheckpointFileInfo* info = Find(name);
  const std::string path = FilePath(name);
  if (info == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("checkpoint '", path_, "' lists no file '", std::string(name), "'"));
  }
  const int64_t length = static_cast<int64_t>(dst.size());
  if (offset < 0 || offset > info->size || length > info->size - offset) {
    return absl::OutOfRangeError(absl::StrCat("reading '", path, "': bytes [", offset, ", ",
                                              offset + length, ") are outside [0, ", info->size,
                                              ")"));
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return absl::DataLossError(absl::StrCat("'", path, "': missing"));
    return ErrnoStatus(errno, "cannot open", path);
  }
  int64_t done = 0;
  while (done < length) {
    const ssize_t r = ::pread(fd, dst.data() + done, static_cast<size_t>(length - done),
                              static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const int err = errno;
      ::close(fd);
      return ErrnoStatus(err, "read failed", path);
    }
    if (r == 0) {
      struct stat st;
      const int64_t on_disk = ::fstat(fd, &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
      ::close(fd);
      return absl::DataLossError(
          absl::StrCat("'", path, "': truncated: ", on_disk, " of ", info->size, " bytes"));
    }
    done += r;
  }
  ::close(fd);
  return absl::OkStatus();
}

absl::StatusOr<LoadableCheckpoint> FindLoadable(const std::string& dir,
                                                CheckpointFallback fallback) {
  auto open_verified =
      [](const std::string& step_dir) -> absl::StatusOr<std::unique_ptr<Checkpoint>> {
    ZT_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> checkpoint, OpenCheckpoint(step_dir));
    ZT_RETURN_IF_ERROR(checkpoint->VerifyAll());
    return checkpoint;
  };

  std::vector<std::string> skipped;
  std::optional<int64_t> latest_step;
  absl::StatusOr<std::string> latest = FindLatest(dir);
  if (latest.ok()) {
    latest_step = ParseStepDirName(std::filesystem::path(*latest).filename().string());
    absl::StatusOr<std::unique_ptr<Checkpoint>> checkpoint = open_verified(*latest);
    if (checkpoint.ok()) return LoadableCheckpoint{*std::move(checkpoint), ""};
    if (fallback == CheckpointFallback::kNone) return checkpoint.status();
    skipped.push_back(
        absl::StrCat("skipped '", *latest, "' (latest): ", checkpoint.status().ToString()));
  } else {
    if (fallback == CheckpointFallback::kNone) return latest.status();
    skipped.push_back(absl::StrCat("no usable latest: ", latest.status().ToString()));
  }

  ZT_ASSIGN_OR_RETURN(const std::vector<CheckpointEntry> complete, ListComplete(dir));
  for (auto it = complete.rbegin(); it != complete.rend(); ++it) {
    // A step directory newer than `latest` is a save that died before it counted.
    if (latest_step.has_value() && it->step >= *latest_step) continue;
    absl::StatusOr<std::unique_ptr<Checkpoint>> checkpoint = open_verified(it->path);
    if (checkpoint.ok()) {
      skipped.push_back(absl::StrCat("loaded '", it->path, "' instead"));
      return LoadableCheckpoint{*std::move(checkpoint), absl::StrJoin(skipped, "; ")};
    }
    skipped.push_back(absl::StrCat("skipped '", it->path, "': ", checkpoint.status().ToString()));
  }
  return absl::NotFoundError(
      absl::StrCat("no loadable checkpoint in '", dir, "': ", absl::StrJoin(skipped, "; ")));
}

}  // namespace zt
