// The POSIX file operations the checkpoint directory protocol is built from: complete writes,
// fsync of files and directories, whole-file digests, listing and removal. Every error is an
// absl::Status that names the path and carries strerror.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zt::durable_file {

// Reads and writes go in chunks of this size.
inline constexpr size_t kIoChunkBytes = size_t{1} << 20;

// "<what> '<path>': <strerror>", with Abseil's code for `err`, except that EFBIG (a file-size
// limit, RLIMIT_FSIZE) is ResourceExhausted like ENOSPC: a capacity problem, not a bad argument.
absl::Status ErrnoStatus(int err, absl::string_view what, const std::string& path);

// Writes all of [p, p + n) to `fd`, retrying short writes and EINTR. 0, or the errno.
int WriteAll(int fd, const uint8_t* p, size_t n);

// fsync of a directory, which makes the entries created, renamed or removed in it durable.
absl::Status SyncDirectory(const std::string& path);

// Creates `path` (it must not exist), writes `content`, fsyncs and closes it.
absl::Status WriteSyncedFile(const std::string& path, std::string_view content);

// The whole content of a file. NotFound when it does not exist.
absl::StatusOr<std::string> ReadSmallFile(const std::string& path);

struct FileDigest {
  int64_t size = 0;
  uint32_t crc32c = 0;
};
// Reads a whole file for its size and CRC32C. NotFound when it does not exist.
absl::StatusOr<FileDigest> DigestFile(const std::string& path);

// The names in a directory, "." and ".." left out, in no particular order.
absl::StatusOr<std::vector<std::string>> ListNames(const std::string& dir);

// Removes a file or a directory tree; OK when it does not exist.
absl::Status RemoveTree(const std::string& path);

std::string JoinPath(const std::string& dir, const std::string& name);
bool IsDirectory(const std::string& path);
bool IsRegularFile(const std::string& path);

}  // namespace zt::durable_file
