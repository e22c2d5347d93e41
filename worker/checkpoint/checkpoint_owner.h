// Which job a checkpoint directory belongs to: `<dir>/owner`, written before the job's first
// save, so that no other job resumes from, interleaves its saves with, or prunes the
// checkpoints of another (docs/formats.md, "Checkpoint directories").
//
// A daemon job's identity is its job id; a `zt train` run's is "local:" + the job's name.
// Continuing another job's checkpoints is explicit (`zt train --resume`, `zt resume DIR --job
// FILE`): such a run takes the directory over and rewrites the record.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace zt {

inline constexpr char kCheckpointOwnerName[] = "owner";

struct CheckpointOwner {
  // The job id (daemon jobs) or "local:<name>" (`zt train`).
  std::string job_id;
  // JobSpec.name, for messages.
  std::string job_name;
  // When the record was written (Unix ms); 0 when unknown.
  int64_t claimed_unix_ms = 0;
};

// The owner of a `zt train` run of the job named `name`.
CheckpointOwner LocalRunOwner(const std::string& name);

// `<dir>/owner`; nullopt when the directory or the record does not exist. DataLoss naming the
// file when it is not a record (truncated, hand-edited).
absl::StatusOr<std::optional<CheckpointOwner>> ReadCheckpointOwner(const std::string& dir);

// Writes `<dir>/owner` (creating `dir`), atomically: a temporary file, synced, renamed over
// the record, the directory synced. Errno-derived statuses naming the path.
absl::Status WriteCheckpointOwner(const std::string& dir, const CheckpointOwner& owner);

// "job 12-train (name train)": how messages name an owner.
std::string DescribeOwner(const CheckpointOwner& owner);

// Whether `dir` holds checkpoints: a complete step directory or a `latest` pointer.
bool HoldsCheckpoints(const std::string& dir);

// The checks a job makes before it writes into `dir` (its checkpoint.dir): OK when `dir`
// holds no checkpoints, or they are `me`'s, or `take_over` (an explicit continuation).
// FailedPrecondition naming `dir`, its owner and the ways to continue explicitly when it holds
// another job's checkpoints or checkpoints no record claims.
absl::Status CheckCheckpointOwnership(const std::string& dir, const std::string& me,
                                      bool take_over);

// CheckCheckpointOwnership, then the record written for `me` unless it already names it.
absl::Status ClaimCheckpointDirectory(const std::string& dir, const CheckpointOwner& me,
                                      bool take_over);

}  // namespace zt
