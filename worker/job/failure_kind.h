// Whether a job's failure is worth a restart: the one classification of rank errors that the
// daemon's coordinator (restart or fail the job) and `zt train` (exit 2 or 1) share.
//
// Chosen by the status code alone, never by the message text, so a rank's exit carries its
// code structurally (RankExit.status_code) and the decision cannot drift with wording.
// Stateless and thread-safe.
#pragma once

#include "absl/status/status.h"

namespace zt {

enum class FailureKind {
  // No restart can cure it: the job file, its inputs or their permissions are wrong, or the
  // state on disk contradicts the job. The job fails at once with the reason.
  kPermanent,
  // A restart may succeed: a lost peer or node, a timeout, a full disk or memory that may be
  // freed, an error nobody classified. Restarts stay bounded by scheduling.max_restarts.
  kTransient,
};

// The kind of a failed rank's status code. kOk is not a failure; it maps to kTransient so a
// caller that passes one by mistake never fails a job for good because of it.
FailureKind ClassifyFailure(absl::StatusCode code);

inline bool IsPermanentFailure(const absl::Status& status) {
  return !status.ok() && ClassifyFailure(status.code()) == FailureKind::kPermanent;
}

}  // namespace zt
