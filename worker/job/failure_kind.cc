#include "worker/job/failure_kind.h"

namespace zt {

FailureKind ClassifyFailure(absl::StatusCode code) {
  switch (code) {
    // The job file is wrong (validation, a file that is not a token shard, a token beyond
    // the vocabulary): the same spec fails the same way on every node.
    case absl::StatusCode::kInvalidArgument:
    // A data file, model.init_from or a checkpoint named by the job is missing on the node;
    // the node's pre-start check makes this certain before the gang starts.
    case absl::StatusCode::kNotFound:
    // State that an operator must fix: a checkpoint written for another configuration, an
    // engine that cannot run what the job asks.
    case absl::StatusCode::kFailedPrecondition:
    // A path outside the allowed roots, a file or directory the daemon may not read or write.
    case absl::StatusCode::kPermissionDenied:
    // A value past what the inputs hold (a step or an index beyond the data or checkpoint).
    case absl::StatusCode::kOutOfRange:
    // This build does not implement what the job asks; another attempt runs the same build.
    case absl::StatusCode::kUnimplemented:
    // Something the job would create is already there and is not its own.
    case absl::StatusCode::kAlreadyExists:
    // Corrupt bytes on disk (a truncated token shard, a checksum mismatch in a checkpoint): a
    // restart reads the same bytes. Resume's fallback to an older step happens inside the
    // attempt (resume_fallback), not by restarting it.
    case absl::StatusCode::kDataLoss:
      return FailureKind::kPermanent;

    // A peer, the coordinator or a device could not be reached: node loss, a network blip.
    case absl::StatusCode::kUnavailable:
    // A communicator was aborted because another rank failed or the attempt was stopped.
    case absl::StatusCode::kAborted:
    // A collective timed out waiting for a peer that died or stalled.
    case absl::StatusCode::kDeadlineExceeded:
    // Memory, pinned memory or disk space is full. The planner checked that the job fits, so
    // at run time this is pressure from outside the plan (another process, a full disk) that
    // may be gone on the next attempt, possibly on another node.
    case absl::StatusCode::kResourceExhausted:
    // The node's token, not the job, is wrong (rendezvous calls): a node with the right one,
    // or this one after its operator fixes it, can run the job.
    case absl::StatusCode::kUnauthenticated:
    // A call was cancelled under the rank (a stream torn down by a restarting coordinator).
    case absl::StatusCode::kCancelled:
    // Errors nobody classified (an errno without a closer code, a library's internal error,
    // a communicator's internal failure): retrying is the safe default, and the restart
    // budget bounds what a deterministic bug costs.
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kOk:
      return FailureKind::kTransient;
  }
  // A code this build does not know (a newer peer's): treated as unclassified.
  return FailureKind::kTransient;
}

}  // namespace zt
