// One rank's part in saving checkpoints (docs/formats.md, "Checkpoint directories").
//
// The ranks coordinate through the job's rendezvous store, never through collectives, so a
// save running in the background cannot change the order in which a step issues its
// collectives:
//   1. rank 0 begins the save (a temporary directory) and publishes "checkpoint/<step>/path"
//      (or the reason it could not);
//   2. every rank writes rank-NNNNN.safetensors there (worker/checkpoint/rank_state.h) and publishes
//      "checkpoint/<step>/rank/<r>" = "ok" or the error;
//   3. rank 0 waits for every rank, adopts their files, commits the manifest, moves `latest`
//      and prunes to keep_last. A failure anywhere leaves the previous checkpoint as it was.
// With checkpoint.async the rank's state is first copied into the plan's
// "checkpoint.staging" buffer, and steps 1–3 run on a background thread while training goes
// on; at most one save is in flight (the next save, and Finish(), wait for it).
// Where the host cannot read the arenas (a GPU rank), every save copies the state into that
// staging buffer through the rank's copy engine first (the plan gives GPU jobs one), on the
// rank's thread: the background thread only ever reads the host copy.
// Not thread-safe: the rank's thread calls it.
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"
#include "proto/job.pb.h"
#include "worker/checkpoint/checkpoint_owner.h"
#include "worker/comm/store.h"
#include "worker/plan/arena.h"
#include "worker/plan/memory_plan.h"
#include "worker/checkpoint/rank_state.h"

namespace zt {

class CheckpointWriter {
 public:
  // `store`, `plan` and `arenas` must outlive the writer. `replace_existing`: a resumed run's
  // saves replace the saves of its abandoned future. Rank 0 claims checkpoint.dir for `owner`
  // before its first save (ClaimCheckpointDirectory; `take_over`: an explicit continuation of
  // another job's checkpoints).
  // Copies a device tensor's bytes to host memory (RankDevice::Download); waits.
  using Download = std::function<absl::Status(void* host, const Tensor& device)>;
  // `download`: null when the host reads the arenas directly (CPU ranks; a staged copy is a
  // memcpy), else how the state reaches the host.
  // `swapped`: where the bytes of the plan's kNvme buffers come from (the swap store's
  // committed generation, offload.optimizer NVME), called on the rank's thread only; null when
  // the plan has none.
  CheckpointWriter(const zerotrain::JobSpec& job, int rank, Store* store, const MemoryPlan& plan,
                   const Arenas& arenas, bool replace_existing, CheckpointOwner owner,
                   bool take_over, Download download = nullptr, BufferSource swapped = nullptr);
  ~CheckpointWriter();

  // Saves the rank's state as of now as step `step`; `state` is the manifest's (rank 0's).
  // Synchronous: returns this save's outcome. Async: copies the state, starts the write and
  // returns the outcome of the previous save (the one it had to wait for), if any.
  // FailedPrecondition when the state must be downloaded and the plan has no staging for it.
  absl::Status Save(int64_t step, nlohmann::json state);
  // Waits for the save in flight; its outcome.
  absl::Status Finish();

 private:
  // The bytes of a swapped buffer, from `swapped_`.
  absl::StatusOr<const void*> Swapped(const BufferSpec& b) const;
  // Steps 1–3 for `step`, the state's bytes coming from `source`.
  absl::Status Write(int64_t step, const nlohmann::json& state, bool from_staging);

  zerotrain::JobSpec job_;
  int rank_;
  Store* store_;
  const MemoryPlan& plan_;
  const Arenas& arenas_;
  bool replace_existing_;
  CheckpointOwner owner_;
  bool take_over_;
  bool claimed_ = false;
  bool weights_only_;  // checkpoint.save_optimizer false
  Download download_;
  BufferSource swapped_;
  std::optional<Tensor> staging_;
  std::future<absl::Status> in_flight_;
};

}  // namespace zt
