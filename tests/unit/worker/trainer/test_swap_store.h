// One swap store for all the ranks of a test job, as `zt train` opens it for the ranks of its
// process (worker/offload/node_swap_store.h).
#pragma once

#include <memory>
#include <numeric>
#include <vector>

#include "absl/status/statusor.h"
#include "offload/swap_env.h"
#include "offload/swap_store.h"
#include "proto/job.pb.h"
#include "worker/offload/node_swap_store.h"

namespace zt::testing {

// The store for every rank of `job` (validated) when its optimizer states or its parameters
// are on NVMe, null when neither is. `env`: the store's operating-system seam (null: the real one).
inline absl::StatusOr<std::shared_ptr<offload::SwapStore>> OpenTestSwapStore(
    const zerotrain::JobSpec& job, offload::SwapEnv* env = nullptr) {
  if (job.offload().optimizer() != zerotrain::OffloadConfig::NVME &&
      job.offload().params() != zerotrain::OffloadConfig::NVME) {
    return std::shared_ptr<offload::SwapStore>();
  }
  std::vector<int> ranks(job.parallel().world_size());
  std::iota(ranks.begin(), ranks.end(), 0);
  return OpenSwapStore(job, ranks, env);
}

}  // namespace zt::testing
