#include "worker/node/job_inputs_check.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/status_macros.h"
#include "worker/data/token_shard.h"
#include "worker/job/data_paths.h"

namespace zt {
namespace {

// The status with "<label>: " before its message, its code kept.
absl::Status Labelled(const absl::Status& status, const std::string& label) {
  return absl::Status(status.code(), absl::StrCat(label, ": ", status.message()));
}

absl::Status CheckDataField(const google::protobuf::RepeatedPtrField<std::string>& entries,
                            const std::string& field, const AllowedRoots& roots) {
  for (int i = 0; i < entries.size(); ++i) {
    const std::string label = absl::StrCat(field, "[", i, "]");
    ZT_ASSIGN_OR_RETURN(const std::vector<std::string> files,
                        ExpandDataEntry(entries.Get(i), label));
    for (const std::string& file : files) {
      ZT_RETURN_IF_ERROR(roots.Check(label, file));
      // One file open at a time: a corpus of 100,000 shards is checked within any fd limit.
      absl::StatusOr<TokenShardHeader> header = ReadTokenShardHeader(file);
      if (!header.ok()) return Labelled(header.status(), label);
    }
  }
  return absl::OkStatus();
}

absl::Status CheckCheckpointDir(const std::string& dir) {
  if (dir.empty()) return absl::OkStatus();
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir)) {
    if (ec) {
      return absl::ErrnoToStatus(ec.value(),
                                 absl::StrCat("checkpoint.dir '", dir, "': cannot create it"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint.dir '", dir, "' exists and is not a directory"));
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return absl::PermissionDeniedError(absl::StrCat(
        "checkpoint.dir '", dir, "' is not writable by the node daemon: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckJobInputsOnNode(const zerotrain::JobSpec& spec, const AllowedRoots& roots) {
  ZT_RETURN_IF_ERROR(CheckDataField(spec.data().train(), "data.train", roots));
  ZT_RETURN_IF_ERROR(CheckDataField(spec.data().val(), "data.val", roots));
  return CheckCheckpointDir(spec.checkpoint().dir());
}

}  // namespace zt
