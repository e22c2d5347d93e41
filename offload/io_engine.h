// Batches of positioned reads and writes on file descriptors, kept `queue_depth` deep: the
// io_uring engine the swap store and the bandwidth probe drive, and a pread/pwrite engine for
// kernels or sandboxes that refuse io_uring_setup (seccomp filters in some containers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "offload/pinned_pool.h"

namespace zt::offload {

// One transfer of [offset, offset + length) of `fd` to or from `buf`. With O_DIRECT, `buf`,
// `offset` and `length` must be multiples of the device's logical block (the store uses 4096).
struct IoOp {
  enum class Kind { kRead, kWrite };
  Kind kind = Kind::kRead;
  int fd = -1;
  std::byte* buf = nullptr;
  size_t length = 0;
  uint64_t offset = 0;
  const std::string* path = nullptr;  // for error messages; not owned
};

// "<what> '<path>': <strerror>" with the status code for `err`: ENOSPC, EDQUOT and EFBIG are
// ResourceExhausted (capacity), ENOENT NotFound, EACCES/EPERM/EROFS PermissionDenied, EIO DataLoss.
absl::Status IoErrnoStatus(int err, absl::string_view what, const std::string& path);

// Not thread-safe: one caller at a time (the swap store serializes its I/O).
class IoEngine {
 public:
  virtual ~IoEngine() = default;
  // Runs every op to completion, short transfers resumed; the first error names the op's path,
  // offset and length. A read that meets the end of the file is DataLoss (the extent is torn).
  virtual absl::Status Run(absl::Span<const IoOp> ops) = 0;
  // Makes the data written to `fd` durable (fdatasync semantics).
  virtual absl::Status SyncData(int fd, const std::string& path) = 0;
  virtual bool uses_io_uring() const = 0;
};

// io_uring with `queue_depth` entries, or, where io_uring_setup is refused, pread/pwrite with one
// warning naming why. `queue_depth` must be in 1..4096.
absl::StatusOr<std::unique_ptr<IoEngine>> CreateIoEngine(unsigned queue_depth,
                                                         const WarningSink& warn);

}  // namespace zt::offload
