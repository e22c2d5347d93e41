#include "worker/offload/plan_ring_queue.h"

#include <utility>

#include "worker/status_macros.h"

namespace zt {

absl::StatusOr<PlanRingQueue> OpenPlanRingQueue(offload::SwapStore* store, const std::string& job,
                                                uint32_t home_file, std::byte* ring, int64_t count,
                                                int64_t size) {
  ZT_RETURN_IF_ERROR(store->DropJob(job));
  ZT_RETURN_IF_ERROR(store->SetPlacement(job, home_file));
  PlanRingQueue out;
  out.ring = std::make_unique<offload::BorrowedRegionAllocator>(ring,
                                                                static_cast<size_t>(count * size));
  ZT_ASSIGN_OR_RETURN(out.queue, offload::CopyQueue::Create(
                                     store, {.buffer_count = static_cast<size_t>(count),
                                             .buffer_size = static_cast<size_t>(size),
                                             .allocator = out.ring.get()}));
  return out;
}

}  // namespace zt
