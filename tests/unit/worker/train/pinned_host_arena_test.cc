// Tests of worker/train/pinned_host_arena.h: the plan's pinned_host category comes from a pinned
// host pool of its own (one region, zero-filled, on the host), every other category from the
// device's allocator; the pool's region is freed with the arenas.
#include "worker/train/pinned_host_arena.h"

#include <cstdint>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "worker/plan/arena.h"
#include "worker/plan/memory_plan.h"

namespace zt {
namespace {

// A device allocator that records the categories it is asked for.
class RecordingAllocator : public ArenaAllocator {
 public:
  explicit RecordingAllocator(std::vector<MemoryCategory>* asked)
      : inner_(MakeHostArenaAllocator()), asked_(asked) {}
  Device DeviceOf(MemoryCategory) const override { return Device{DeviceKind::kCuda, 3}; }
  absl::StatusOr<void*> Allocate(MemoryCategory c, int64_t bytes) override {
    asked_->push_back(c);
    return inner_->Allocate(c, bytes);
  }
  void Free(MemoryCategory c, void* data) override { inner_->Free(c, data); }

 private:
  std::unique_ptr<ArenaAllocator> inner_;
  std::vector<MemoryCategory>* asked_;
};

MemoryPlan TwoTierPlan() {
  MemoryPlan plan;
  plan.buffers.push_back(
      {.name = "u.params", .category = MemoryCategory::kParameters, .shape = {1000}});
  plan.buffers.push_back({.name = "u.master",
                          .category = MemoryCategory::kPinnedHost,
                          .shape = {1000},
                          .offloaded_from = MemoryCategory::kOptimizerState});
  plan.buffers.push_back({.name = "offload.ring.0",
                          .category = MemoryCategory::kPinnedHost,
                          .dtype = DType::kU8,
                          .shape = {8192}});
  return plan;
}

TEST(PinnedHostArenaTest, PinnedHostComesFromItsOwnPoolAndTheRestFromTheDevice) {
  for (bool pin : {false, true}) {
    std::vector<MemoryCategory> asked;
    PinnedHostUse use;
    const MemoryPlan plan = TwoTierPlan();
    {
      absl::StatusOr<std::unique_ptr<Arenas>> arenas = Arenas::Create(
          plan, MakePinnedHostArenaAllocator(std::make_unique<RecordingAllocator>(&asked),
                                             {.pin_memory = pin, .use = &use}));
      ASSERT_TRUE(arenas.ok()) << arenas.status();
      EXPECT_EQ(asked, std::vector<MemoryCategory>{MemoryCategory::kParameters});
      EXPECT_EQ(use.allocations, 1);
      // 4032 (4000 aligned to 64) + 8192 bytes in one region rounded up to 3 pages.
      EXPECT_EQ(use.bytes, 3 * 4096);
      // Pageable unless asked; asked, locked where RLIMIT_MEMLOCK (8 MiB here) allows 16 KiB.
      if (!pin) EXPECT_FALSE(use.pinned);
      const Tensor master = (*arenas)->Get("u.master").value();
      const Tensor params = (*arenas)->Get("u.params").value();
      EXPECT_EQ(master.device().kind, DeviceKind::kCpu);
      EXPECT_EQ(params.device().kind, DeviceKind::kCuda);
      // Zero-filled, like every arena.
      const auto* bytes = static_cast<const uint8_t*>(master.raw());
      for (int64_t i = 0; i < master.size_bytes(); ++i) ASSERT_EQ(bytes[i], 0) << i;
      // Two allocations: the master is not inside the device's parameters.
      const auto* p = static_cast<const uint8_t*>(params.raw());
      EXPECT_TRUE(bytes >= p + params.size_bytes() || bytes + master.size_bytes() <= p);
    }
    EXPECT_EQ(use.bytes, 0) << "the pool's region is freed with the arenas";
  }
}

}  // namespace
}  // namespace zt
