// The operating-system seam of the swap store: every file open, preallocation, read, write and
// sync it does goes through a SwapEnv, so tests can swap in a fault-injecting one (as LevelDB's
// fault_injection_test does) that fails with ENOSPC, loses unsynced writes, or "crashes" at a
// stage of a generation's commit.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "offload/io_engine.h"

namespace zt::offload {

// The stages of SwapStore::Commit, in order. A crash before kIndexCommitted must leave the
// previous generation visible; one at or after it, the new one.
enum class CommitStage {
  kDataWritten,     // the generation's extents are written, not yet synced
  kDataDurable,     // they are synced; the index still names the previous generation
  kIndexCommitted,  // the index names the new generation (one synced RocksDB WriteBatch)
};
absl::string_view CommitStageName(CommitStage stage);

struct OpenedFile {
  int fd = -1;
  bool direct = false;  // opened with O_DIRECT
};

// Thread-compatible: the store calls it under its own lock. The default instance is stateless.
class SwapEnv {
 public:
  virtual ~SwapEnv() = default;
  // Opens `path` read-write, creating it (mode 0600). With `want_direct`, tries O_DIRECT first
  // and opens buffered where the filesystem refuses it (EINVAL: tmpfs on older kernels).
  virtual absl::StatusOr<OpenedFile> Open(const std::string& path, bool want_direct);
  virtual void Close(int fd);
  // Reserves [0, size) of the file's blocks (fallocate), so a full disk shows at open and not
  // mid-step. ResourceExhausted naming the path and the bytes when the filesystem is full.
  virtual absl::Status Preallocate(int fd, const std::string& path, uint64_t size);
  virtual absl::Status Run(IoEngine& engine, absl::Span<const IoOp> ops);
  virtual absl::Status SyncData(IoEngine& engine, int fd, const std::string& path);
  // Called by SwapStore::Commit as it passes each stage. A non-OK status aborts the commit
  // there, as a killed process would stop: the store then refuses every further call.
  virtual absl::Status AtCommitStage(CommitStage stage, absl::string_view job, uint64_t generation);
};

// OK when `path` is an existing directory this process may create files in; else NotFound,
// InvalidArgument (not a directory) or PermissionDenied, each naming `what` and the path.
absl::Status CheckWritableDirectory(const std::string& path, absl::string_view what);

// The real operating system. Never null; lives for the whole process.
SwapEnv* DefaultSwapEnv();

}  // namespace zt::offload
