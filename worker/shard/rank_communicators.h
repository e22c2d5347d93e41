// The communicators one rank of a job needs, connected through the job's rendezvous store.
//
// "world" spans the N ranks; "shard.<g>" the G ranks of shard group g (the world itself when
// G = N); "replica.<m>" the N/G ranks that are member m of their group (none when there is
// one group). Every rank connects them in that order, so ranks never wait on a group whose
// members are still connecting to another.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "proto/job.pb.h"
#include "worker/comm/communicator.h"
#include "worker/comm/store.h"
#include "worker/plan/arena.h"
#include "worker/shard/sharding_engine.h"

namespace zt {

struct RankCommunicators {
  std::unique_ptr<Communicator> world, shard_group, replicas;

  ShardComms view() const {
    return {.world = world.get(),
            .shard_group = shard_group ? shard_group.get() : world.get(),
            .replicas = replicas.get()};
  }
};

// Blocks until every peer of each group has connected, or parallel.comm_timeout_s passes
// (DeadlineExceeded naming the ranks that never arrived). `store` must outlive the result.
// The communicators that reduce 16-bit gradients convert through the plan's
// "comm.convert.*" buffers, taken from `arenas` (which must outlive the result).
absl::StatusOr<RankCommunicators> ConnectRank(const zerotrain::JobSpec& job, int rank, Store* store,
                                              const Arenas& arenas);

}  // namespace zt
