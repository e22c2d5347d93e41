#include "worker/checkpoint/checkpoint_owner.h"

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "kernels/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/checkpoint/checkpoint_directory.h"
#include "worker/checkpoint/durable_file.h"

namespace zt {
namespace {

std::string OwnerPath(const std::string& dir) {
  return (std::filesystem::path(dir) / kCheckpointOwnerName).string();
}

}  // namespace

CheckpointOwner LocalRunOwner(const std::string& name) {
  return {.job_id = absl::StrCat("local:", name), .job_name = name};
}

absl::StatusOr<std::optional<CheckpointOwner>> ReadCheckpointOwner(const std::string& dir) {
  const std::string path = OwnerPath(dir);
  std::error_code ec;
  // Also false when a component of `dir` is not a directory: then nothing is there to own.
  if (!std::filesystem::exists(path, ec)) return std::nullopt;
  ZT_ASSIGN_OR_RETURN(const std::string text, durable_file::ReadSmallFile(path));
  const nlohmann::json record = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto corrupt = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint owner record '", path, "': ", why,
        " (it names the job whose checkpoints these are; restore it, or move the directory)"));
  };
  if (!record.is_object()) return corrupt("not a JSON object");
  const auto id = record.find("job_id");
  if (id == record.end() || !id->is_string() || id->get<std::string>().empty()) {
    return corrupt("\"job_id\" must be a non-empty string");
  }
  CheckpointOwner owner{.job_id = id->get<std::string>()};
  if (const auto name = record.find("job_name"); name != record.end() && name->is_string()) {
    owner.job_name = name->get<std::string>();
  }
  if (const auto ms = record.find("claimed_unix_ms");
      ms != record.end() && ms->is_number_integer()) {
    owner.claimed_unix_ms = ms->get<int64_t>();
  }
  return owner;
}

absl::Status WriteCheckpointOwner(const std::string& dir, const CheckpointOwner& owner) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create checkpoint.dir '", dir, "': ", ec.message()));
  }
  const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
  const nlohmann::json record = {
      {"job_id", owner.job_id},
      {"job_name", owner.job_name},
      {"claimed_unix_ms", owner.claimed_unix_ms > 0 ? owner.claimed_unix_ms : now_ms}};
  const std::string path = OwnerPath(dir);
  // A temporary name that loading and pruning treat as a leftover (kCheckpointTempPrefix).
  const std::string tmp =
      (std::filesystem::path(dir) / absl::StrCat(kCheckpointTempPrefix, kCheckpointOwnerName))
          .string();
  std::filesystem::remove(tmp, ec);
  ZT_RETURN_IF_ERROR(durable_file::WriteSyncedFile(tmp, record.dump() + "\n"));
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return durable_file::ErrnoStatus(errno, "cannot rename the owner record to", path);
  }
  return durable_file::SyncDirectory(dir);
}

std::string DescribeOwner(const CheckpointOwner& owner) {
  return owner.job_name.empty() ? absl::StrCat("job ", owner.job_id)
                                : absl::StrCat("job ", owner.job_id, " (", owner.job_name, ")");
}

bool HoldsCheckpoints(const std::string& dir) {
  std::error_code ec;
  if (std::filesystem::exists(std::filesystem::path(dir) / kCheckpointLatestName, ec)) {
    return true;
  }
  absl::StatusOr<std::vector<CheckpointEntry>> complete = ListComplete(dir);
  return complete.ok() && !complete->empty();
}

absl::Status CheckCheckpointOwnership(const std::string& dir, const std::string& me,
                                      bool take_over) {
  if (dir.empty() || take_over) return absl::OkStatus();
  ZT_ASSIGN_OR_RETURN(const std::optional<CheckpointOwner> owner, ReadCheckpointOwner(dir));
  if (owner && owner->job_id == me) return absl::OkStatus();
  if (!HoldsCheckpoints(dir)) return absl::OkStatus();
  const std::string how =
      "continue them explicitly (zt train JOB --resume; on a daemon, zt resume DIR --job JOB), "
      "start from their weights (model.init_from: the directory), or choose another "
      "checkpoint.dir";
  if (owner) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint.dir: '", dir, "' holds the checkpoints of ", DescribeOwner(*owner),
                     " (", OwnerPath(dir), "); ", how));
  }
  return absl::FailedPreconditionError(absl::StrCat("checkpoint.dir: '", dir,
                                                    "' holds checkpoints that no job claims (no ",
                                                    OwnerPath(dir), "); ", how));
}

absl::Status ClaimCheckpointDirectory(const std::string& dir, const CheckpointOwner& me,
                                      bool take_over) {
  if (dir.empty()) return absl::OkStatus();
  ZT_RETURN_IF_ERROR(CheckCheckpointOwnership(dir, me.job_id, take_over));
  ZT_ASSIGN_OR_RETURN(const std::optional<CheckpointOwner> owner, ReadCheckpointOwner(dir));
  if (owner && owner->job_id == me.job_id) return absl::OkStatus();
  return WriteCheckpointOwner(dir, me);
}

}  // namespace zt
