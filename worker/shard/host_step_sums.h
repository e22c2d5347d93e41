// offload.delayed_update with an Adafactor whose factored statistics are summed across ranks
// (ShardedAdafactor: the ZeRO shard group; TensorParallelAdafactor: the tensor-parallel group;
// worker/optim/optimizer.h, Optimizer::ShardGroup): the sums the host step issues, each over a
// Gloo context of its own on the same ranks.
//
// Why contexts of their own: the delayed host step of step t runs on a thread of its own
// (worker/optim/delayed_host_step.h) beside step t+1's forward and backward, whose collectives
// go through the rank's communicators (RankCommunicators). A communicator is one thread's at a
// time and runs its queue in issue order, so a statistics sum issued there from the host
// thread would land among the next step's reductions in an order that differs from rank to
// rank, and the ranks would pair different operations. A second context over the same group,
// rendezvoused under its own prefix, keeps each stream in one thread's order: the compute
// thread's in the rank's communicators, the host thread's here (the host steps run one at a
// time, in step order, on every rank). The other way out — summing on the compute thread
// before the hand-over — would split Adafactor's kernel (kernels/adafactor.h) into a
// statistics pass and an update pass; a second context costs a few sockets and no numerics.
//
// The buffers summed are host memory (the host step's scratch), so plain Gloo serves every
// device kind. Their bytes and seconds count in the rank's communication (`stats`, which the
// trainer adds to its communicators'): a communicator's counters are read under its lock, so
// the compute thread may read them while the host thread issues (a delayed sum then counts in
// the step that reads it first).
#pragma once

#include <functional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/job.pb.h"
#include "worker/comm/communicator.h"
#include "worker/comm/store.h"
#include "worker/parallel/parallel_layout.h"

namespace zt {

struct HostStepSums {
  // Sum n floats in place across the ZeRO shard group / the tensor-parallel group; null when
  // the job's Adafactor does not sum there. Each owns its communicator; call from one thread
  // at a time (the one that runs the host step).
  std::function<absl::Status(float* data, int64_t n)> shard_group;
  std::function<absl::Status(float* data, int64_t n)> tensor;
  // The two contexts' counters together (zero when neither is connected); any thread.
  std::function<CommStats()> stats = [] { return CommStats{}; };
};

// Connects the sums `job` needs on this rank: none without a summed Adafactor, or without
// offload.delayed_update unless `device_memory_apart` — the rank's device memory is not the
// host's (a GPU) and offload.optimizer puts the host step on the host: the rank's communicators
// then take device buffers only (NCCL, or the staged one), and the host step's scratch is
// host memory, so its sums go here in every step, delayed or not. Every rank of each group must
// call it at the same point of its start-up (after ConnectRank); blocks until the group's peers
// have connected or parallel.comm_timeout_s passes. `store` must outlive the result.
absl::StatusOr<HostStepSums> ConnectHostStepSums(const zerotrain::JobSpec& job,
                                                 const ParallelLayout& layout, Store* store,
                                                 bool device_memory_apart = false);

}  // namespace zt
