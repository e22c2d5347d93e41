#include "worker/shard/rank_communicators.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/status_macros.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/model/param_layout.h"
#include "worker/plan/memory_plan.h"

namespace zt {

absl::StatusOr<RankCommunicators> ConnectRank(const zerotrain::JobSpec& job, int rank,
                                              Store* store) {
  const ShardGeometry g = GeometryOf(job, rank);
  // 16-bit reductions add in f32 through a conversion buffer: the largest reduction is one
  // unit's padded gradient (a reduce-scatter's input), or a stage-0 bucket of it.
  int64_t largest = 0;
  for (const UnitLayout& u : BuildModelLayout(job.model()).units) {
    largest = std::max(largest, PaddedUnitNumel(u.numel, g.group_size));
  }
  auto connect = [&](const std::string& prefix, int group_rank,
                     int size) -> absl::StatusOr<std::unique_ptr<Communicator>> {
    ZT_ASSIGN_OR_RETURN(
        std::unique_ptr<GlooCommunicator> c,
        GlooCommunicator::Create({.rank = group_rank,
                                  .size = size,
                                  .store = store,
                                  .prefix = prefix,
                                  .timeout_seconds = job.parallel().comm_timeout_s(),
                                  .max_16bit_elements = largest}));
    return std::unique_ptr<Communicator>(std::move(c));
  };
  RankCommunicators comms;
  ZT_ASSIGN_OR_RETURN(comms.world, connect("world", rank, g.world_size));
  if (g.group_size != g.world_size) {
    ZT_ASSIGN_OR_RETURN(comms.shard_group,
                        connect(absl::StrCat("shard.", g.group()), g.group_rank(), g.group_size));
  }
  if (g.groups() > 1) {
    ZT_ASSIGN_OR_RETURN(comms.replicas,
                        connect(absl::StrCat("replica.", g.group_rank()), g.group(), g.groups()));
  }
  return comms;
}

}  // namespace zt
