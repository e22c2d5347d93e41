#include "worker/train/pinned_host_arena.h"

#include <cstring>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "offload/pinned_pool.h"
#include "worker/status_macros.h"

namespace zt {
namespace {

class PinnedHostArenaAllocator : public ArenaAllocator {
 public:
  PinnedHostArenaAllocator(std::unique_ptr<ArenaAllocator> device, PinnedHostArenaOptions options)
      : device_(std::move(device)), options_(options) {}

  ~PinnedHostArenaAllocator() override {
    // Arenas free what they took; a pool left here (an Arenas that failed half-way) goes now.
    for (auto& [data, held] : pools_) Release(held);
  }

  Device DeviceOf(MemoryCategory category) const override {
    return category == MemoryCategory::kPinnedHost ? Device{} : device_->DeviceOf(category);
  }

  absl::StatusOr<void*> Allocate(MemoryCategory category, int64_t bytes) override {
    if (category != MemoryCategory::kPinnedHost) return device_->Allocate(category, bytes);
    Held held;
    if (options_.pin_memory) {
      held.host = std::make_unique<offload::MlockAllocator>();
    } else {
      held.host = std::make_unique<offload::PageableAllocator>();
    }
    ZT_ASSIGN_OR_RETURN(held.pool,
                        offload::PinnedPool::Create({.buffer_count = 1,
                                                     .buffer_size = static_cast<size_t>(bytes),
                                                     .allocator = held.host.get()}));
    held.lease = held.pool->Acquire();
    // Zero-filled as every arena is, which also touches every page before the first step.
    std::memset(held.lease.data(), 0, held.lease.size());
    void* data = held.lease.data();
    if (options_.use != nullptr) {
      options_.use->bytes += static_cast<int64_t>(held.lease.size());
      options_.use->pinned = held.pool->pinned();
      ++options_.use->allocations;
    }
    pools_.emplace(data, std::move(held));
    return data;
  }

  void Free(MemoryCategory category, void* data) override {
    if (category != MemoryCategory::kPinnedHost) {
      device_->Free(category, data);
      return;
    }
    auto it = pools_.find(data);
    if (it == pools_.end()) return;
    Release(it->second);
    pools_.erase(it);
  }

 private:
  struct Held {
    // Declared in the order they must go last to first: the lease before its pool, the pool
    // before the allocator that frees its region.
    std::unique_ptr<offload::HostAllocator> host;
    std::unique_ptr<offload::PinnedPool> pool;
    offload::PinnedLease lease;
  };

  void Release(Held& held) {
    if (options_.use != nullptr && held.lease.valid()) {
      options_.use->bytes -= static_cast<int64_t>(held.lease.size());
    }
    held.lease.Release();
    held.pool.reset();
  }

  std::unique_ptr<ArenaAllocator> device_;
  PinnedHostArenaOptions options_;
  absl::flat_hash_map<void*, Held> pools_;
};

}  // namespace

std::unique_ptr<ArenaAllocator> MakePinnedHostArenaAllocator(std::unique_ptr<ArenaAllocator> device,
                                                             PinnedHostArenaOptions options) {
  return std::make_unique<PinnedHostArenaAllocator>(std::move(device), options);
}

}  // namespace zt
