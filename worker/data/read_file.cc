#include "worker/data/read_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"

namespace zt {

absl::StatusOr<std::string> ReadFileToString(const std::string& path, std::string_view what) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return absl::ErrnoToStatus(errno, absl::StrCat("opening ", std::string(what), " '", path, "'"));
  absl::Cleanup close_fd = [fd] { ::close(fd); };
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("stat of ", std::string(what), " '", path, "'"));
  }
  if (S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(what), " '", path, "' is a directory, not a file"));
  }
  // Sized from fstat so a regular file is read in place; reads past that size go through a
  // small buffer, so a file that grows (or a pipe that reports no size) still reads whole
  // without doubling the allocation at the end of every regular file.
  std::string data(static_cast<size_t>(st.st_size), '\0');
  size_t used = 0;
  char spill[65536];
  while (true) {
    const bool in_place = used < data.size();
    ssize_t n = in_place ? ::read(fd, data.data() + used, data.size() - used)
                         : ::read(fd, spill, sizeof(spill));
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::ErrnoToStatus(errno,
                                 absl::StrCat("reading ", std::string(what), " '", path, "'"));
    }
    if (n == 0) break;
    if (!in_place) data.append(spill, static_cast<size_t>(n));
    used += static_cast<size_t>(n);
  }
  data.resize(used);
  return data;
}

}  // namespace zt
