#include "worker/checkpoint/durable_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "kernels/crc32c.h"

namespace zt::durable_file {

absl::Status ErrnoStatus(int err, absl::string_view what, const std::string& path) {
  const absl::StatusCode code =
      err == EFBIG ? absl::StatusCode::kResourceExhausted : absl::ErrnoToStatusCode(err);
  return absl::Status(code, absl::StrCat(what, " '", path, "': ", std::strerror(err)));
}

int WriteAll(int fd, const uint8_t* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return 0;
}

absl::Status SyncDirectory(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "cannot open directory", path);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return ErrnoStatus(err, "fsync of directory failed", path);
  return absl::OkStatus();
}

absl::Status WriteSyncedFile(const std::string& path, std::string_view content) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, "cannot create", path);
  int err = WriteAll(fd, reinterpret_cast<const uint8_t*>(content.data()), content.size());
  if (err != 0) {
    ::close(fd);
    return ErrnoStatus(err, "write failed", path);
  }
  if (::fsync(fd) != 0) {
    err = errno;
    ::close(fd);
    return ErrnoStatus(err, "fsync failed", path);
  }
  if (::close(fd) != 0) return ErrnoStatus(errno, "close failed", path);
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "cannot open", path);
  absl::Cleanup closer = [fd] { ::close(fd); };
  std::string out;
  char buf[65536];
  while (true) {
    const ssize_t r = ::read(fd, buf, sizeof(buf));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return ErrnoStatus(errno, "read failed", path);
    if (r == 0) return out;
    out.append(buf, static_cast<size_t>(r));
  }
}

absl::StatusOr<FileDigest> DigestFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "cannot open", path);
  absl::Cleanup closer = [fd] { ::close(fd); };
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  std::vector<uint8_t> buf(kIoChunkBytes);
  FileDigest digest;
  while (true) {
    const ssize_t r = ::read(fd, buf.data(), buf.size());
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return ErrnoStatus(errno, "read failed", path);
    if (r == 0) return digest;
    digest.crc32c = Crc32cExtend(digest.crc32c, buf.data(), static_cast<size_t>(r));
    digest.size += r;
  }
}

absl::StatusOr<std::vector<std::string>> ListNames(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return ErrnoStatus(errno, "cannot list checkpoint directory", dir);
  absl::Cleanup closer = [d] { ::closedir(d); };
  std::vector<std::string> names;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  return names;
}

absl::Status RemoveTree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) return ErrnoStatus(ec.value(), "cannot remove", path);
  return absl::OkStatus();
}

std::string JoinPath(const std::string& dir, const std::string& name) {
  return absl::StrCat(dir, "/", name);
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool IsRegularFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace zt::durable_file
