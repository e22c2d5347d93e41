// Arenas: one allocation per memory category, carved into the plan's buffers.
//
// An Arenas object takes a MemoryPlan, makes one 64-byte-aligned allocation per non-empty
// category (zero-filled, so every page is touched before the first step and the measured
// memory is the plan's), and hands out tensor views by buffer name, each on the device its
// category lives on. Nothing is allocated after construction. Lookups are for set-up (a hash
// map by name); the step loop keeps the views it took. Not thread-safe for construction; views
// may be used from any thread.
//
// The kNvme category is not memory: its buffers are extents of the node's swap store
// (offload.optimizer NVME, worker/offload/nvme_optimizer.h), so no arena is made for it and
// Get refuses them; Spec names them for the code that swaps them.
//
// Where a category's memory comes from is an ArenaAllocator: on a CPU device every category
// is host memory (HostArenaAllocator); on a CUDA device the device categories come from one
// cudaMalloc each and the pinned-host category from cudaHostAlloc (the CUDA backend's
// allocator), so the same plan and the same carving serve both.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "kernels/tensor.h"
#include "worker/plan/memory_plan.h"

namespace zt {

// Makes and frees the one allocation of each category. Allocate returns zero-filled memory
// aligned to kBufferAlignment, or ResourceExhausted naming the category and the bytes.
class ArenaAllocator {
 public:
  virtual ~ArenaAllocator() = default;
  // The device the category's tensors are on.
  virtual Device DeviceOf(MemoryCategory category) const = 0;
  virtual absl::StatusOr<void*> Allocate(MemoryCategory category, int64_t bytes) = 0;
  virtual void Free(MemoryCategory category, void* data) = 0;
};

// Every category in this process's host memory, on the CPU device.
std::unique_ptr<ArenaAllocator> MakeHostArenaAllocator();

class Arenas {
 public:
  // ResourceExhausted names the category when an allocation fails. Without an allocator,
  // every category is host memory.
  static absl::StatusOr<std::unique_ptr<Arenas>> Create(
      const MemoryPlan& plan, std::unique_ptr<ArenaAllocator> allocator = nullptr);
  ~Arenas();
  Arenas(const Arenas&) = delete;
  Arenas& operator=(const Arenas&) = delete;

  // The view of buffer `name` with its planned dtype and shape (up to 4 dimensions; shapes
  // with more are flattened into the last). NotFound names the buffer.
  absl::StatusOr<Tensor> Get(const std::string& name) const;

  // The spec of buffer `name` (any category), claiming it as Get does: how the swapped
  // buffers of the kNvme category are claimed. NotFound names the buffer.
  absl::StatusOr<const BufferSpec*> Spec(const std::string& name) const;

  // Bytes carved from each category's arena: the high-water mark, since arenas never free.
  int64_t BytesInUse(MemoryCategory c) const { return in_use_[static_cast<int>(c)]; }
  int64_t TotalBytesInUse() const;

  // The plan's buffers nobody has asked for with Get() yet. After the engine is set up and
  // has stepped, an empty list proves the plan holds nothing the engine does not use (and
  // Get's NotFound that the engine uses nothing the plan does not hold).
  std::vector<std::string> UnclaimedBuffers() const;

 private:
  Arenas() = default;

  struct Entry {
    void* data;
    const BufferSpec* spec;
    mutable bool claimed = false;
  };
  MemoryPlan plan_;
  std::unique_ptr<ArenaAllocator> allocator_;
  std::array<void*, kMemoryCategoryCount> base_{};
  std::array<int64_t, kMemoryCategoryCount> in_use_{};
  absl::flat_hash_map<std::string, Entry> by_name_;
};

}  // namespace zt
