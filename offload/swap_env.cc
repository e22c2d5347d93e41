#include "offload/swap_env.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace zt::offload {

absl::string_view CommitStageName(CommitStage stage) {
  switch (stage) {
    case CommitStage::kDataWritten:
      return "data written";
    case CommitStage::kDataDurable:
      return "data durable";
    case CommitStage::kIndexCommitted:
      return "index committed";
  }
  return "unknown stage";
}

absl::StatusOr<OpenedFile> SwapEnv::Open(const std::string& path, bool want_direct) {
  constexpr int kFlags = O_RDWR | O_CREAT | O_CLOEXEC;
  if (want_direct) {
    const int fd = open(path.c_str(), kFlags | O_DIRECT, 0600);
    if (fd >= 0) return OpenedFile{.fd = fd, .direct = true};
    if (errno != EINVAL) return IoErrnoStatus(errno, "cannot open swap file", path);
  }
  const int fd = open(path.c_str(), kFlags, 0600);
  if (fd < 0) return IoErrnoStatus(errno, "cannot open swap file", path);
  return OpenedFile{.fd = fd, .direct = false};
}

void SwapEnv::Close(int fd) { close(fd); }

absl::Status SwapEnv::Preallocate(int fd, const std::string& path, uint64_t size) {
  const int err = posix_fallocate(fd, 0, static_cast<off_t>(size));
  if (err == 0) return absl::OkStatus();
  if (err == ENOSPC || err == EDQUOT || err == EFBIG) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot preallocate swap file '", path,
                                                     "': ", std::strerror(err), " (needs ", size,
                                                     " bytes)"));
  }
  return IoErrnoStatus(err, "cannot preallocate swap file", path);
}

absl::Status SwapEnv::Run(IoEngine& engine, absl::Span<const IoOp> ops) { return engine.Run(ops); }

absl::Status SwapEnv::SyncData(IoEngine& engine, int fd, const std::string& path) {
  return engine.SyncData(fd, path);
}

absl::Status SwapEnv::AtCommitStage(CommitStage, absl::string_view, uint64_t) {
  return absl::OkStatus();
}

absl::Status CheckWritableDirectory(const std::string& path, absl::string_view what) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT) {
      return absl::NotFoundError(
          absl::StrCat(what, " directory '", path, "' does not exist; create it first"));
    }
    return IoErrnoStatus(err, absl::StrCat(what, " directory"), path);
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " path '", path, "' is not a directory"));
  }
  // access() also reports a read-only mount (EROFS), which stops even root.
  if (access(path.c_str(), W_OK | X_OK) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat(what, " directory '", path, "' is not writable: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

SwapEnv* DefaultSwapEnv() {
  static SwapEnv* env = new SwapEnv();
  return env;
}

}  // namespace zt::offload
