// The copy queue a rank's store key swaps through (offload/copy_queue.h), over one of the memory
// plan's rings: pinned buffers the rank's arenas own ("offload.ring.<k>", "offload.base_ring.<k>"),
// so the queue's pool allocates nothing. Shared by the NVMe optimizer's states and a LoRA job's
// swapped base (worker/offload/nvme_optimizer.h, swapped_base.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "offload/copy_queue.h"
#include "offload/pinned_pool.h"
#include "offload/swap_store.h"

namespace zt {

struct PlanRingQueue {
  std::unique_ptr<offload::BorrowedRegionAllocator> ring;  // the queue's pool's region
  std::unique_ptr<offload::CopyQueue> queue;
};

// Forgets what the store held under `job` (swap is scratch: a killed run's bytes), places the
// key's new extents in `home_file` first (SwapStore::SetPlacement), and opens a queue whose
// pool is the ring's `count` buffers of `size` bytes at `ring`. The store's and the queue's
// errors.
absl::StatusOr<PlanRingQueue> OpenPlanRingQueue(offload::SwapStore* store, const std::string& job,
                                                uint32_t home_file, std::byte* ring, int64_t count,
                                                int64_t size);

}  // namespace zt
