#include "daemon/auth.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace zt {
namespace {

constexpr size_t kTokenBytes = 32;
constexpr char kBearerPrefix[] = "Bearer ";

absl::Status ErrnoStatus(int err, const std::string& what) {
  std::string message = absl::StrCat(what, ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(message);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(message);
  return absl::InternalError(message);
}

absl::StatusOr<std::string> ReadToken(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("opening '", path, "'"));
  absl::Cleanup closer = [fd] { ::close(fd); };
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoStatus(errno, absl::StrCat("stat of '", path, "'"));
  if ((st.st_mode & 077) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "token file '%s' has mode %04o: it must not be accessible to group or others "
        "(chmod 600 '%s')",
        path, st.st_mode & 07777, path));
  }
  std::string content(4 * kTokenBytes, '\0');
  ssize_t n = ::read(fd, content.data(), content.size());
  if (n < 0) return ErrnoStatus(errno, absl::StrCat("reading '", path, "'"));
  content.resize(static_cast<size_t>(n));
  std::string token(absl::StripAsciiWhitespace(content));
  if (token.size() != 2 * kTokenBytes ||
      token.find_first_not_of("0123456789abcdef") != std::string::npos) {
    return absl::DataLossError(absl::StrCat("token file '", path, "' does not hold ",
                                            2 * kTokenBytes, " lowercase hex digits"));
  }
  return token;
}

absl::StatusOr<std::string> CreateToken(const std::string& state_dir, const std::string& path) {
  std::string raw(kTokenBytes, '\0');
  std::random_device device;  // /dev/urandom on Linux
  for (char& c : raw) c = static_cast<char>(device() & 0xff);
  const std::string token = absl::BytesToHexString(raw);
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("creating '", path, "'"));
  absl::Cleanup closer = [fd] { ::close(fd); };
  // The umask cannot widen 0600, but an odd one could narrow it below the owner's read.
  if (::fchmod(fd, 0600) != 0) return ErrnoStatus(errno, absl::StrCat("chmod of '", path, "'"));
  const std::string line = absl::StrCat(token, "\n");
  if (::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
    return ErrnoStatus(errno, absl::StrCat("writing '", path, "'"));
  }
  if (::fsync(fd) != 0) return ErrnoStatus(errno, absl::StrCat("syncing '", path, "'"));
  int dir = ::open(state_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return ErrnoStatus(errno, absl::StrCat("opening '", state_dir, "'"));
  absl::Cleanup dir_closer = [dir] { ::close(dir); };
  if (::fsync(dir) != 0) return ErrnoStatus(errno, absl::StrCat("syncing '", state_dir, "'"));
  return token;
}

}  // namespace

absl::StatusOr<std::string> EnsureToken(const std::string& state_dir) {
  const std::string path = absl::StrCat(state_dir, "/", kTokenFileName);
  absl::StatusOr<std::string> existing = ReadToken(path);
  if (!absl::IsNotFound(existing.status())) return existing;
  absl::StatusOr<std::string> created = CreateToken(state_dir, path);
  // Another process created it between our read and our O_EXCL: take theirs.
  if (!created.ok() && ::access(path.c_str(), F_OK) == 0) return ReadToken(path);
  return created;
}

grpc::Status Authorize(const grpc::ServerContext& context, const std::string& token) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing authorization metadata");
  }
  const std::string expected = absl::StrCat(kBearerPrefix, token);
  const grpc::string_ref& given = it->second;
  // Lengths are public (every token has the same length); the bytes are compared without an
  // early exit so the time does not say where the first difference is.
  unsigned char diff = given.size() == expected.size() ? 0 : 1;
  const size_t n = std::min(given.size(), expected.size());
  for (size_t i = 0; i < n; ++i) {
    diff |= static_cast<unsigned char>(given.data()[i] ^ expected[i]);
  }
  if (diff != 0) return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "wrong token");
  return grpc::Status::OK;
}

}  // namespace zt
