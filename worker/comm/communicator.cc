#include "worker/comm/communicator.h"

#include "absl/strings/str_cat.h"
#include "worker/comm/comm_handle_state.h"

namespace zt {

const char* CommKindName(CommKind kind) {
  switch (kind) {
    case CommKind::kAllReduce:
      return "AllReduce";
    case CommKind::kReduceScatter:
      return "ReduceScatter";
    case CommKind::kAllGather:
      return "AllGather";
    case CommKind::kBroadcast:
      return "Broadcast";
    case CommKind::kSend:
      return "Send";
    case CommKind::kRecv:
      return "Recv";
    case CommKind::kBarrier:
      return "Barrier";
  }
  return "?";
}

absl::Status CheckRankAndSize(const char* options_type, int rank, int size) {
  if (size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(options_type, ".size is ", size, ", must be >= 1"));
  }
  if (rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat(options_type, ".rank is ", rank, ", must be in 0..", size - 1));
  }
  return absl::OkStatus();
}

absl::Status CommHandle::Wait() const {
  if (!state_) return absl::FailedPreconditionError("CommHandle::Wait on an empty handle");
  std::unique_lock<std::mutex> lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->done; });
  return state_->status;
}

bool CommHandle::Done() const {
  if (!state_) return false;
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->done;
}

}  // namespace zt
