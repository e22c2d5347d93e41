// Arenas: one allocation per memory category, carved into the plan's buffers.
//
// An Arenas object takes a MemoryPlan, makes one 64-byte-aligned allocation per non-empty
// category of host memory (zero-filled, so every page is touched before the first step and the
// measured RSS is the plan's), and hands out tensor views by buffer name. Nothing is allocated
// after construction. Lookups are for set-up (a hash map by name); the step loop keeps the
// views it took. Not thread-safe for construction; views may be used from any thread.
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

class Arenas {
 public:
  // ResourceExhausted names the category when an allocation fails.
  static absl::StatusOr<std::unique_ptr<Arenas>> Create(const MemoryPlan& plan);
  ~Arenas();
  Arenas(const Arenas&) = delete;
  Arenas& operator=(const Arenas&) = delete;

  // The view of buffer `name` with its planned dtype and shape (up to 4 dimensions; shapes
  // with more are flattened into the last). NotFound names the buffer.
  absl::StatusOr<Tensor> Get(const std::string& name) const;

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
  std::array<void*, kMemoryCategoryCount> base_{};
  std::array<int64_t, kMemoryCategoryCount> in_use_{};
  absl::flat_hash_map<std::string, Entry> by_name_;
};

}  // namespace zt
