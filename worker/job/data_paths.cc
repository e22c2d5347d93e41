#include "worker/job/data_paths.h"

#include <glob.h>

#include <algorithm>
#include <cerrno>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"

namespace zt {
namespace {

// glob(3) reports why it stopped through a callback without a user argument: the errno of the
// failing directory lands here, one per thread, so concurrent expansions do not mix them up.
thread_local int glob_errno = 0;

int RecordGlobError(const char* /*path*/, int error) {
  glob_errno = error;
  return 1;  // stop: an unreadable directory makes the expansion fail, not shrink
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ExpandDataEntry(const std::string& entry,
                                                         absl::string_view label) {
  if (!IsDataPattern(entry)) return std::vector<std::string>{entry};
  if (IsDataPattern(DataPatternDirectory(entry))) {
    return absl::InvalidArgumentError(absl::StrCat(
        label, ": pattern '", entry,
        "' has a wildcard in its directory part; only the file name may be a pattern (the "
        "directory is what the allowed roots are checked against)"));
  }
  glob_t matches{};
  absl::Cleanup free_matches = [&matches] { globfree(&matches); };
  // GLOB_NOSORT: glob sorts by the locale's collation; the byte order below is the same on
  // every machine. GLOB_MARK ends directories with '/', so they can be left out. GLOB_ERR: an
  // unreadable directory is an error, not a silently shorter list.
  glob_errno = 0;
  const int rc =
      ::glob(entry.c_str(), GLOB_NOSORT | GLOB_MARK | GLOB_ERR, &RecordGlobError, &matches);
  if (rc == GLOB_NOSPACE) {
    return absl::ResourceExhaustedError(
        absl::StrCat(label, ": pattern '", entry, "': out of memory expanding it"));
  }
  if (rc == GLOB_ABORTED) {
    return absl::ErrnoToStatus(
        glob_errno != 0 ? glob_errno : EIO,
        absl::StrCat(label, ": pattern '", entry, "': cannot read its directory '",
                     DataPatternDirectory(entry), "'"));
  }
  std::vector<std::string> files;
  for (size_t i = 0; rc == 0 && i < matches.gl_pathc; ++i) {
    std::string path = matches.gl_pathv[i];
    if (!path.empty() && path.back() == '/') continue;
    files.push_back(std::move(path));
  }
  if (files.empty()) {
    return absl::NotFoundError(absl::StrCat(label, ": pattern '", entry, "' matches no file"));
  }
  std::sort(files.begin(), files.end());
  return files;
}

namespace {

template <typename Entries>
absl::StatusOr<std::vector<std::string>> Expand(const Entries& entries, absl::string_view field) {
  std::vector<std::string> out;
  int i = 0;
  for (const std::string& entry : entries) {
    absl::StatusOr<std::vector<std::string>> files =
        ExpandDataEntry(entry, absl::StrCat(field, "[", i, "]"));
    if (!files.ok()) return files.status();
    out.insert(out.end(), std::make_move_iterator(files->begin()),
               std::make_move_iterator(files->end()));
    ++i;
  }
  return out;
}

}  // namespace

bool IsDataPattern(absl::string_view entry) {
  return entry.find_first_of("*?[") != absl::string_view::npos;
}

std::string DataPatternDirectory(absl::string_view entry) {
  const size_t slash = entry.rfind('/');
  if (slash == absl::string_view::npos) return ".";
  if (slash == 0) return "/";
  return std::string(entry.substr(0, slash));
}

absl::StatusOr<std::vector<std::string>> ExpandDataPaths(
    const google::protobuf::RepeatedPtrField<std::string>& entries, absl::string_view field) {
  return Expand(entries, field);
}

absl::StatusOr<std::vector<std::string>> ExpandDataPaths(const std::vector<std::string>& entries,
                                                         absl::string_view field) {
  return Expand(entries, field);
}

}  // namespace zt
