// Tests of worker/plan/arena.h: the carving of each category's allocation into the plan's
// buffers, and the allocator seam that puts device categories on a device (CUDA's cudaMalloc,
// cudaHostAlloc for pinned host) while the carving stays the same.
#include "worker/plan/arena.h"

#include <cstdint>
#include <map>
#include <optional>
#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zt {
namespace {

using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

MemoryPlan ThreeCategoryPlan() {
  MemoryPlan plan;
  plan.buffers = {
      {.name = "w", .category = MemoryCategory::kParameters, .dtype = DType::kBF16, .shape = {3, 5}},
      {.name = "g", .category = MemoryCategory::kGradients, .dtype = DType::kF32, .shape = {7}},
      {.name = "b", .category = MemoryCategory::kParameters, .dtype = DType::kF32, .shape = {2, 2, 2}},
      {.name = "staging", .category = MemoryCategory::kPinnedHost, .dtype = DType::kF32, .shape = {16}},
  };
  return plan;
}

// Host memory that says it is a GPU's for every category but pinned host, and records what it
// allocated and freed: the routing a CUDA allocator does, observable on the CPU.
class RecordingAllocator : public ArenaAllocator {
 public:
  struct Log {
    std::map<MemoryCategory, int64_t> allocated;
    std::map<MemoryCategory, int> freed;
  };
  // Allocations of `fail` are refused.
  explicit RecordingAllocator(Log* log, std::optional<MemoryCategory> fail = std::nullopt)
      : log_(log), fail_(fail) {}

  Device DeviceOf(MemoryCategory c) const override {
    if (c == MemoryCategory::kPinnedHost) return Device{};
    return Device{.kind = DeviceKind::kCuda, .index = 1};
  }
  absl::StatusOr<void*> Allocate(MemoryCategory c, int64_t bytes) override {
    if (fail_ == c) return absl::ResourceExhaustedError("device full");
    log_->allocated[c] = bytes;
    return host_->Allocate(c, bytes);
  }
  void Free(MemoryCategory c, void* data) override {
    ++log_->freed[c];
    host_->Free(c, data);
  }

 private:
  Log* log_;
  std::optional<MemoryCategory> fail_;
  std::unique_ptr<ArenaAllocator> host_ = MakeHostArenaAllocator();
};

TEST(ArenasTest, BuffersAreCarvedInPlanOrderOnAlignedOffsetsAndZeroed) {
  auto arenas = Arenas::Create(ThreeCategoryPlan());
  ASSERT_TRUE(arenas.ok()) << arenas.status();
  const Tensor w = (*arenas)->Get("w").value();
  const Tensor b = (*arenas)->Get("b").value();
  EXPECT_EQ(w.device(), Device{});
  EXPECT_EQ(static_cast<char*>(b.raw()) - static_cast<char*>(w.raw()), AlignedBytes(3 * 5 * 2));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.raw()) % kBufferAlignment, 0u);
  for (int64_t i = 0; i < 8; ++i) EXPECT_EQ(b.data<float>()[i], 0.0f);
  EXPECT_EQ((*arenas)->BytesInUse(MemoryCategory::kParameters), 2 * kBufferAlignment);
  EXPECT_THAT((*arenas)->UnclaimedBuffers(), UnorderedElementsAre("g", "staging"));
}

TEST(ArenasTest, TheAllocatorDecidesEachCategorysDeviceAndOwnsItsMemory) {
  RecordingAllocator::Log log;
  {
    auto arenas = Arenas::Create(ThreeCategoryPlan(), std::make_unique<RecordingAllocator>(&log));
    ASSERT_TRUE(arenas.ok()) << arenas.status();
    const Device gpu{.kind = DeviceKind::kCuda, .index = 1};
    EXPECT_EQ((*arenas)->Get("w")->device(), gpu);
    EXPECT_EQ((*arenas)->Get("g")->device(), gpu);
    EXPECT_EQ((*arenas)->Get("staging")->device(), Device{});
    EXPECT_EQ((*arenas)->Get("b")->dim(2), 2);
    // One allocation per non-empty category, of the plan's bytes.
    EXPECT_EQ(log.allocated.size(), 3u);
    EXPECT_EQ(log.allocated[MemoryCategory::kParameters], 2 * kBufferAlignment);
    EXPECT_EQ(log.allocated[MemoryCategory::kPinnedHost], kBufferAlignment);
    EXPECT_TRUE(log.freed.empty());
  }
  EXPECT_EQ(log.freed[MemoryCategory::kParameters], 1);
  EXPECT_EQ(log.freed[MemoryCategory::kGradients], 1);
  EXPECT_EQ(log.freed[MemoryCategory::kPinnedHost], 1);
}

TEST(ArenasTest, AFailedAllocationIsReturnedAndWhatWasAllocatedIsFreed) {
  RecordingAllocator::Log log;
  // Categories are allocated in their enum order: parameters, then gradients (refused).
  auto arenas = Arenas::Create(
      ThreeCategoryPlan(),
      std::make_unique<RecordingAllocator>(&log, MemoryCategory::kGradients));
  ASSERT_FALSE(arenas.ok());
  EXPECT_EQ(arenas.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(arenas.status().message(), HasSubstr("device full"));
  EXPECT_EQ(log.freed[MemoryCategory::kParameters], 1);
  EXPECT_EQ(log.freed.count(MemoryCategory::kPinnedHost), 0u);
}

TEST(ArenasTest, GetOfAnUnknownBufferNamesIt) {
  auto arenas = Arenas::Create(ThreeCategoryPlan()).value();
  EXPECT_THAT(arenas->Get("nope").status().message(), HasSubstr("no buffer named 'nope'"));
}

}  // namespace
}  // namespace zt
