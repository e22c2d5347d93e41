// The checkpoint directory protocol: atomic saves, per-file checksums, the `latest` pointer,
// pruning, and verified loading. Storage only: it moves and checks bytes and knows nothing of
// models (the ranks' safetensors files and the manifest's "state" are the caller's).
//
// Layout (documented in docs/formats.md, "Checkpoint directories"):
//   <dir>/step-00000020/          one directory per saved step (step zero-padded to 8 digits)
//       manifest.json             written last: every file's name, size and CRC32C, the format
//                                 version and the caller's JSON under "state"
//       rank-00000.safetensors …  the files the ranks write
//   <dir>/latest                  "step-00000020": the last save that counts
//   <dir>/.tmp-…                  a save in progress, or the remains of one that died
//
// A save is written under <dir>/.tmp-step-00000020-<random>/, synced, renamed to its step name,
// <dir> synced, and only then does `latest` move (written to a temporary name, synced, renamed,
// <dir> synced). A process killed at any point leaves the previous checkpoint loadable and
// `latest` naming it; what it leaves behind (a `.tmp-` entry, or a step directory newer than
// the one `latest` names) is ignored by loading and removed by Prune().
//
// One process writes a checkpoint directory's entries (Begin, Commit, Prune); inside a save,
// several threads may open and write files at the same time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "nlohmann/json.hpp"

namespace zt {

// The manifest's identity and version: readers refuse other magics and newer versions.
inline constexpr char kCheckpointManifestMagic[] = "zerotrain-checkpoint";
inline constexpr int kCheckpointFormatVersion = 1;
inline constexpr char kCheckpointManifestName[] = "manifest.json";
inline constexpr char kCheckpointLatestName[] = "latest";
inline constexpr char kCheckpointTempPrefix[] = ".tmp-";
// CRC32C (Castagnoli, the iSCSI/ext4 checksum), as 8 lowercase hex digits.
inline constexpr char kCheckpointChecksumAlgorithm[] = "crc32c";

// "step-00000020": the directory name of a step (more digits past 99,999,999). Steps are >= 0.
std::string CheckpointStepDirName(int64_t step);

class CheckpointSave;
struct CheckpointSaveShared;

// Streams one file of a save, computing its checksum as the bytes go by. Used by one thread at a
// time; several writers of one save may run on different threads. It shares the save's state,
// so it may outlive the save object safely; once the save is sealed or aborted, Close() fails.
class CheckpointFileWriter {
 public:
  // Closes the descriptor if Close() was not called; the file then stays incomplete and the
  // save's Commit() refuses to proceed.
  ~CheckpointFileWriter();
  CheckpointFileWriter(const CheckpointFileWriter&) = delete;
  CheckpointFileWriter& operator=(const CheckpointFileWriter&) = delete;

  // Appends bytes. An errno-derived status naming the file and strerror when the write fails
  // (ResourceExhausted for ENOSPC/EFBIG/EDQUOT, PermissionDenied for EACCES, …); after the
  // first failure every later call returns that same error.
  absl::Status Append(absl::Span<const uint8_t> bytes);
  absl::Status Append(std::string_view bytes);

  // Writes what is buffered, fsyncs and closes the file, and records its size and checksum in
  // the save. Same errors as Append(); FailedPrecondition when the save was already committed
  // or aborted, or when called twice.
  absl::Status Close();

  const std::string& name() const { return name_; }
  const std::string& path() const { return path_; }
  // Bytes appended so far.
  int64_t size() const { return size_; }

 private:
  friend class CheckpointSave;
  CheckpointFileWriter() = default;

  absl::Status Flush();
  absl::Status Fail(std::string_view what, int err);

  std::shared_ptr<CheckpointSaveShared> shared_;
  std::string name_;
  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;
  uint32_t crc_ = 0;
  absl::Status io_status_;
  std::vector<uint8_t> buffer_;
};

struct CheckpointSaveOptions {
  // Replace a step directory of the same name left by an earlier run (atomically: the old one
  // stays loadable until the new one takes its name). Without it, Commit() refuses.
  bool overwrite = false;
};

// One save in progress: a temporary directory that becomes <dir>/step-XXXXXXXX on Commit().
// Destroyed without a successful Commit(), it removes its temporary directory and touches
// nothing else. OpenFile() and the writers are thread-safe with each other; Commit(), Abort()
// and the phases are called by one thread once every writer is closed.
class CheckpointSave {
 public:
  // Creates <dir> when missing and <dir>/.tmp-step-XXXXXXXX-<random>/. InvalidArgument for a
  // negative step; AlreadyExists naming the step directory when it exists and
  // options.overwrite is false (checked again at Publish()); errno-derived statuses naming the
  // path otherwise.
  static absl::StatusOr<std::unique_ptr<CheckpointSave>> Begin(
      const std::string& dir, int64_t step, const CheckpointSaveOptions& options = {});

  ~CheckpointSave();
  CheckpointSave(const CheckpointSave&) = delete;
  CheckpointSave& operator=(const CheckpointSave&) = delete;

  // Creates file `name` in the save. InvalidArgument naming it when it is empty, longer than
  // 255 bytes, contains '/' or NUL, starts with '.', or is "manifest.json"; AlreadyExists when
  // the save already has a file of that name; FailedPrecondition after Commit()/Abort().
  absl::StatusOr<std::unique_ptr<CheckpointFileWriter>> OpenFile(const std::string& name);

  // Adds a file that the caller wrote itself at TempPath(name) (for writers that need a path,
  // such as SafetensorsWriter) and already synced: reads it back to record its size and
  // checksum. Same name rules as OpenFile(); NotFound naming the path when it is absent.
  absl::Status AdoptFile(const std::string& name);

  // Where file `name` lives until the save is published.
  std::string TempPath(const std::string& name) const;

  // The whole commit: Seal(state), Publish(), MoveLatest(). On success the save counts.
  absl::Status Commit(const nlohmann::json& state);

  // The commit's phases, public so that tests can stop a process between them (a crash after
  // any phase leaves the previous checkpoint as `latest`):
  // 1. Seal: writes manifest.json (every closed file's size and checksum, sorted by name; the
  //    format version; `state` verbatim), fsyncs it and the temporary directory.
  //    FailedPrecondition naming a file that was opened but not closed, or whose writes failed.
  absl::Status Seal(const nlohmann::json& state);
  // 2. Publish: renames the temporary directory to step-XXXXXXXX and fsyncs <dir>.
  //    AlreadyExists naming the step directory (unless options.overwrite).
  absl::Status Publish();
  // 3. MoveLatest: writes <dir>/latest naming the step directory, atomically and synced.
  absl::Status MoveLatest();

  // Removes the temporary directory; nothing else is touched. FailedPrecondition after the
  // save was published. Open writers fail from then on.
  absl::Status Abort();

  const std::string& dir() const { return dir_; }
  int64_t step() const { return step_; }
  // The temporary directory until Publish(), then the step directory.
  std::string current_path() const;

 private:
  CheckpointSave() = default;

  absl::Status CheckName(const std::string& name) const;

  enum class Phase { kOpen, kSealed, kPublished, kCounted, kAborted };

  std::shared_ptr<CheckpointSaveShared> shared_;
  std::string dir_;
  std::string temp_path_;
  std::string step_path_;
  int64_t step_ = 0;
  CheckpointSaveOptions options_;
  Phase phase_ = Phase::kOpen;
};

// Same as CheckpointSave::Begin().
inline absl::StatusOr<std::unique_ptr<CheckpointSave>> BeginSave(
    const std::string& dir, int64_t step, const CheckpointSaveOptions& options = {}) {
  return CheckpointSave::Begin(dir, step, options);
}

// A step directory that has a manifest.
struct CheckpointEntry {
  int64_t step = 0;
  std::string path;
};

// The step directory `latest` names. NotFound naming the path when `latest` is missing or
// names a missing directory; DataLoss naming `latest` when its content is not a step name.
absl::StatusOr<std::string> FindLatest(const std::string& dir);

// Every step-XXXXXXXX directory of `dir` that holds a manifest.json, by ascending step. Does not
// open the manifests. NotFound naming `dir` when it does not exist.
absl::StatusOr<std::vector<CheckpointEntry>> ListComplete(const std::string& dir);

// Deletes, in `dir`: the oldest complete step directories beyond the newest `keep_last` up to
// the one `latest` names (never that one); complete step directories newer than it (a save
// that died between Publish() and MoveLatest(): loading ignores them); then the leftovers
// (RemoveCheckpointLeftovers). Without a valid `latest`, only the leftovers. A step directory
// is renamed to a `.tmp-` name before it is deleted, so a process killed while pruning leaves
// a leftover, never a half-deleted step.
// Call it after a successful Commit(), never while another process saves into `dir`.
// InvalidArgument for keep_last < 1; errno-derived statuses naming the path that could not be
// removed.
absl::Status Prune(const std::string& dir, int keep_last);

// Deletes what killed processes left in `dir`: every `.tmp-` entry that no save of this
// process has open (saves and prunings that died), and step directories without a manifest
// (never published; loading ignores them). Called by Prune() and by a job's first save.
// Errno-derived statuses naming the path that could not be removed.
absl::Status RemoveCheckpointLeftovers(const std::string& dir);

// One file a manifest lists.
struct CheckpointFileInfo {
  std::string name;
  int64_t size = 0;
  uint32_t crc32c = 0;
};

// An opened checkpoint: its manifest, parsed and checked. Immutable; safe to share between
// threads (every read opens its own descriptor).
class Checkpoint {
 public:
  const std::string& path() const { return path_; }
  int64_t step() const { return step_; }
  // The caller's JSON given to Commit().
  const nlohmann::json& state() const { return state_; }
  // Sorted by name.
  const std::vector<CheckpointFileInfo>& files() const { return files_; }
  // The file called `name`, or nullptr.
  const CheckpointFileInfo* Find(std::string_view name) const;

  // Reads file `name` whole and compares it with the manifest. DataLoss naming the file and
  // saying "missing", "truncated: N of M bytes", "has N bytes, the manifest lists M" or
  // "checksum mismatch"; NotFound when the manifest lists no such file.
  absl::Status Verify(std::string_view name) const;
  // Verify() of every file, stopping at the first failure.
  absl::Status VerifyAll() const;

  // Reads dst.size() bytes of file `name` from `offset`, without checksum verification (a rank
  // reads only the ranges it needs; VerifyAll() checks whole files). NotFound when the manifest
  // lists no such file; OutOfRange naming the file when [offset, offset + size) leaves the
  // size the manifest lists; DataLoss naming it when the file is missing or shorter on disk.
  absl::Status ReadRange(std::string_view name, int64_t offset, absl::Span<uint8_t> dst) const;

 private:
  friend absl::StatusOr<std::unique_ptr<Checkpoint>> OpenCheckpoint(const std::string&);
  Checkpoint() = default;

  std::string FilePath(std::string_view name) const;

  std::string path_;
  int64_t step_ = 0;
  nlohmann::json state_;
  std::vector<CheckpointFileInfo> files_;
};

// Reads and checks <step_dir>/manifest.json. NotFound naming it when absent; DataLoss naming it
// when it does not parse, has the wrong structure, or its own checksum does not match;
// FailedPrecondition naming it for a newer format version or an unknown checksum algorithm.
absl::StatusOr<std::unique_ptr<Checkpoint>> OpenCheckpoint(const std::string& step_dir);

// What FindLoadable() may do when the checkpoint `latest` names does not verify.
enum class CheckpointFallback {
  kNone,           // return that checkpoint's error
  kOlderVerified,  // try older complete checkpoints, newest first
};

struct LoadableCheckpoint {
  std::unique_ptr<Checkpoint> checkpoint;
  // Empty when `latest` loaded; otherwise what was skipped and why, for a person to read.
  std::string note;
};

// The checkpoint `latest` names, opened and verified. With kOlderVerified, when that fails, the
// newest complete checkpoint older than it (or, when `latest` is missing or unreadable, the
// newest of all) that verifies, with a note of what was skipped and why. With kNone, the error
// of `latest`; with kOlderVerified and nothing loadable, NotFound naming `dir` and listing the
// failures.
absl::StatusOr<LoadableCheckpoint> FindLoadable(const std::string& dir,
                                                CheckpointFallback fallback);

}  // namespace zt
