#include "worker/node/secret_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace zt {
namespace {

absl::Status ErrnoStatus(int err, const std::string& what) {
  std::string message = absl::StrCat(what, ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(message);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(message);
  if (err == ENOSPC) return absl::ResourceExhaustedError(message);
  return absl::UnavailableError(message);
}

}  // namespace

absl::Status CheckOwnerOnlyMode(int fd, const std::string& path, const std::string& what) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoStatus(errno, absl::StrCat("stat of '", path, "'"));
  if ((st.st_mode & 077) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s '%s' has mode %04o: it must not be accessible to group or others, or they can "
        "act as you (chmod 600 '%s')",
        what, path, st.st_mode & 07777, path));
  }
  return absl::OkStatus();
}

absl::Status CheckOwnerOnlyFile(const std::string& path, const std::string& what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoStatus(errno, absl::StrCat("opening ", what, " '", path, "'"));
  }
  absl::Cleanup closer = [fd] { ::close(fd); };
  return CheckOwnerOnlyMode(fd, path, what);
}

std::optional<std::string> TokenFileFor(const std::string& token_file_flag) {
  if (!token_file_flag.empty()) return token_file_flag;
  if (const char* env = std::getenv("ZT_TOKEN"); env != nullptr && *env != '\0') {
    return std::nullopt;
  }
  if (const char* dir = std::getenv("ZT_STATE_DIR"); dir != nullptr && *dir != '\0') {
    return absl::StrCat(dir, "/token");
  }
  return std::nullopt;
}

absl::Status CheckTokenFile(const std::string& token_file_flag) {
  const std::optional<std::string> path = TokenFileFor(token_file_flag);
  return path ? CheckOwnerOnlyFile(*path, "token file") : absl::OkStatus();
}

absl::Status WriteOwnerOnlyFileAtomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  ::unlink(tmp.c_str());  // a stale one from a crash
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("creating '", tmp, "'"));
  {
    absl::Cleanup closer = [fd] { ::close(fd); };
    // The umask cannot widen 0600; an odd one could narrow it below the owner's read.
    if (::fchmod(fd, 0600) != 0) return ErrnoStatus(errno, absl::StrCat("chmod of '", tmp, "'"));
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ErrnoStatus(errno, absl::StrCat("writing '", tmp, "'"));
      done += static_cast<size_t>(n);
    }
    if (::fsync(fd) != 0) return ErrnoStatus(errno, absl::StrCat("syncing '", tmp, "'"));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return ErrnoStatus(errno, absl::StrCat("renaming '", tmp, "' to '", path, "'"));
  }
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return ErrnoStatus(errno, absl::StrCat("opening '", dir, "'"));
  absl::Cleanup dir_closer = [dfd] { ::close(dfd); };
  if (::fsync(dfd) != 0) return ErrnoStatus(errno, absl::StrCat("syncing '", dir, "'"));
  return absl::OkStatus();
}

}  // namespace zt
