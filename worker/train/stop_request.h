// A request, from outside the step loop, that a running job stop at its next step boundary.
//
// A node daemon holds one per job attempt and hands it to every local rank's Trainer
// (TrainOptions::stop). Cancel asks for kStop; a preemption (SIGTERM/SIGUSR1 under Slurm)
// asks for kCheckpointThenStop. The ranks agree on the request inside the step's existing
// totals all-gather (worker/shard/sharding_engine.h Combine), so every rank of the job — on
// every node — stops after the same step, and a checkpoint requested by any rank is written
// by all. Thread-safe: Request from any thread, kind() from the ranks.
#pragma once

#include <atomic>

namespace zt {

enum class StopKind : int {
  kNone = 0,
  kStop = 1,
  kCheckpointThenStop = 2,
};

class StopRequest {
 public:
  // Raises the request to `kind`; a weaker request never lowers a stronger one.
  void Request(StopKind kind) {
    int current = kind_.load();
    while (current < static_cast<int>(kind) &&
           !kind_.compare_exchange_weak(current, static_cast<int>(kind))) {
    }
  }
  StopKind kind() const { return static_cast<StopKind>(kind_.load()); }

 private:
  std::atomic<int> kind_{0};
};

}  // namespace zt
