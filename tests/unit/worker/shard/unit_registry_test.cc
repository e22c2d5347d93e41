// The per-unit residency state machine and the prefetch coordinator's ordering, with a fake
// gather that records what was issued and completes when the test says so.
#include "worker/shard/unit_registry.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/comm/comm_handle_state.h"
#include "worker/shard/prefetch_coordinator.h"

namespace zt {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A handle the test completes by hand.
struct ManualHandle {
  std::shared_ptr<CommHandle::State> state = std::make_shared<CommHandle::State>();
  CommHandle handle{state};
  void Complete(absl::Status s = absl::OkStatus()) { state->Complete(std::move(s)); }
};

Tensor Buffer(std::vector<float>& storage) {
  return Tensor(storage.data(), DType::kF32, {static_cast<int64_t>(storage.size())});
}

TEST(UnitRegistryTest, FollowsShardedGatheringGatheredSharded) {
  UnitRegistry registry({"embedding", "block.0"});
  std::vector<float> storage(8);
  ManualHandle gather;
  EXPECT_EQ(registry.state(1), Residency::kSharded);
  ASSERT_TRUE(registry.BeginGather(1, Buffer(storage), gather.handle).ok());
  EXPECT_EQ(registry.state(1), Residency::kGathering);
  EXPECT_EQ(registry.in_flight(), 1);
  gather.Complete();
  absl::StatusOr<Tensor> full = registry.AwaitGathered(1);
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(full->raw(), storage.data());
  EXPECT_EQ(registry.state(1), Residency::kGathered);
  EXPECT_EQ(registry.in_flight(), 0);
  ASSERT_TRUE(registry.Release(1).ok());
  EXPECT_EQ(registry.state(1), Residency::kSharded);
}

TEST(UnitRegistryTest, RefusesIllegalTransitionsNamingTheUnit) {
  UnitRegistry registry({"embedding", "block.0"});
  std::vector<float> storage(8);
  // Computing with, or releasing, a unit that was never gathered.
  absl::StatusOr<Tensor> compute = registry.AwaitGathered(1);
  EXPECT_EQ(compute.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(compute.status().message(), HasSubstr("block.0"));
  EXPECT_THAT(compute.status().message(), HasSubstr("sharded"));
  EXPECT_EQ(registry.Release(0).code(), absl::StatusCode::kFailedPrecondition);
  // Gathering twice, or releasing a buffer a gather is still writing.
  ManualHandle gather;
  ASSERT_TRUE(registry.BeginGather(0, Buffer(storage), gather.handle).ok());
  EXPECT_EQ(registry.BeginGather(0, Buffer(storage), gather.handle).code(),
            absl::StatusCode::kFailedPrecondition);
  const absl::Status early = registry.Release(0);
  EXPECT_EQ(early.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(early.message(), HasSubstr("gathering"));
  gather.Complete();
  EXPECT_TRUE(registry.ReleaseAll().ok());
  EXPECT_EQ(registry.state(0), Residency::kSharded);
}

TEST(UnitRegistryTest, AGatherErrorReachesTheComputeThatNeedsIt) {
  UnitRegistry registry({"head"});
  std::vector<float> storage(8);
  ManualHandle gather;
  ASSERT_TRUE(registry.BeginGather(0, Buffer(storage), gather.handle).ok());
  gather.Complete(absl::DeadlineExceededError("head all-gather: ranks 1 did not arrive"));
  EXPECT_EQ(registry.AwaitGathered(0).status().code(), absl::StatusCode::kDeadlineExceeded);
}

class PrefetchCoordinatorTest : public ::testing::Test {
 protected:
  // Units 0..4; a pool of `prefetch` + 1 buffers; unit 0 optionally dedicated.
  void Make(int prefetch, bool dedicated_first) {
    registry_ = std::make_unique<UnitRegistry>(
        std::vector<std::string>{"embedding", "block.0", "block.1", "block.2", "head"});
    storage_.assign(prefetch + 2, std::vector<float>(4));
    std::vector<Tensor> pool;
    for (int k = 0; k <= prefetch; ++k) pool.push_back(Buffer(storage_[k]));
    std::vector<Tensor> dedicated(5);
    if (dedicated_first) dedicated[0] = Buffer(storage_.back());
    coordinator_ = std::make_unique<PrefetchCoordinator>(
        registry_.get(), std::move(pool), std::move(dedicated), prefetch,
        [this](int u, const Tensor&) -> absl::StatusOr<CommHandle> {
          issued_.push_back(u);
          if (log_ != nullptr) log_->push_back(absl::StrCat("g", u));
          // Gathers complete at once: the ordering is what is under test.
          ManualHandle h;
          h.Complete();
          return h.handle;
        });
  }
  std::unique_ptr<UnitRegistry> registry_;
  std::vector<std::vector<float>> storage_;
  std::unique_ptr<PrefetchCoordinator> coordinator_;
  std::vector<int> issued_;
  std::vector<std::string>* log_ = nullptr;  // also logs each gather as "g<unit>" when set
};

TEST_F(PrefetchCoordinatorTest, IssuesGathersAheadInSequenceOrder) {
  Make(/*prefetch=*/1, /*dedicated_first=*/false);
  // Forward then backward, the head kept across the turn.
  std::vector<UnitUse> uses = {{0, true}, {1, true}, {2, true}, {3, true}, {4, false},
                               {4, true}, {3, true}, {2, true}, {1, true}};
  coordinator_->Begin(uses);
  ASSERT_TRUE(coordinator_->Acquire(0).ok());
  EXPECT_THAT(issued_, ElementsAre(0, 1));  // the unit computed and one ahead
  for (int i = 0; i < static_cast<int>(uses.size()); ++i) {
    ASSERT_TRUE(coordinator_->Acquire(i).ok()) << i;
    // At most prefetch + 1 units are held at any time.
    int held = 0;
    for (int u = 0; u < 5; ++u) held += registry_->state(u) != Residency::kSharded;
    EXPECT_LE(held, 2) << "use " << i;
    ASSERT_TRUE(coordinator_->Finish(i).ok()) << i;
  }
  // The head is gathered once for both its forward and its backward.
  EXPECT_THAT(issued_, ElementsAre(0, 1, 2, 3, 4, 3, 2, 1));
  ASSERT_TRUE(coordinator_->End().ok());
}

// Between passes the coordinator names the buffers a pass's first gathers will take (the
// uploads ahead of offload.params CPU put each rank's shard there): exactly those its Issue
// then hands the gathers; nothing while a pass is under way, or past the pool's room.
TEST_F(PrefetchCoordinatorTest, FirstGatherBuffersAreTheBuffersThePassGathersInto) {
  Make(/*prefetch=*/2, /*dedicated_first=*/true);
  std::vector<const void*> gathered_into(5, nullptr);
  coordinator_ = std::make_unique<PrefetchCoordinator>(
      registry_.get(),
      std::vector<Tensor>{Buffer(storage_[0]), Buffer(storage_[1]), Buffer(storage_[2])},
      std::vector<Tensor>{Buffer(storage_[3]), {}, {}, {}, {}}, 2,
      [&](int u, const Tensor& full) -> absl::StatusOr<CommHandle> {
        gathered_into[u] = full.raw();
        ManualHandle h;
        h.Complete();
        return h.handle;
      });
  const std::vector<Tensor> ahead = coordinator_->FirstGatherBuffers({0, 1, 2});
  ASSERT_EQ(ahead.size(), 3u);
  EXPECT_EQ(ahead[0].raw(), storage_[3].data());  // the embedding's own buffer
  EXPECT_EQ(ahead[1].raw(), storage_[0].data());
  EXPECT_EQ(ahead[2].raw(), storage_[1].data());
  coordinator_->Begin({{0, false}, {1, true}, {2, true}, {3, true}});
  ASSERT_TRUE(coordinator_->Acquire(0).ok());
  for (int u = 0; u < 3; ++u) EXPECT_EQ(gathered_into[u], ahead[u].raw()) << u;
  for (const Tensor& t : coordinator_->FirstGatherBuffers({0, 1, 2})) {
    EXPECT_TRUE(t.empty()) << "a pass is under way";
  }
  ASSERT_TRUE(coordinator_->End().ok());
  // Four pooled units with three pool buffers: the fourth has none.
  const std::vector<Tensor> over = coordinator_->FirstGatherBuffers({1, 2, 3, 4});
  EXPECT_FALSE(over[2].empty());
  EXPECT_TRUE(over[3].empty());
}

TEST_F(PrefetchCoordinatorTest, NoPrefetchGathersOnDemandAndDedicatedUnitsStay) {
  Make(/*prefetch=*/0, /*dedicated_first=*/true);
  coordinator_->Begin({{0, false}, {1, true}, {2, true}, {4, true}});
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(coordinator_->Acquire(i).ok()) << i;
    EXPECT_EQ(issued_.back(), std::vector<int>({0, 1, 2, 4})[i]);
    ASSERT_TRUE(coordinator_->Finish(i).ok());
  }
  EXPECT_EQ(registry_->state(0), Residency::kGathered);  // kept in its own buffer
  ASSERT_TRUE(coordinator_->End().ok());
  EXPECT_EQ(registry_->state(0), Residency::kSharded);
}

TEST_F(PrefetchCoordinatorTest, RunningOutOfBuffersIsAnErrorNotAnOverwrite) {
  Make(/*prefetch=*/0, /*dedicated_first=*/false);
  coordinator_->Begin({{1, false}, {2, true}});
  ASSERT_TRUE(coordinator_->Acquire(0).ok());
  ASSERT_TRUE(coordinator_->Finish(0).ok());  // kept: its buffer stays taken
  const absl::StatusOr<Tensor> second = coordinator_->Acquire(1);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(second.status().message(), HasSubstr("no free gather buffer"));
  ASSERT_TRUE(coordinator_->End().ok());
}

// Read-ahead (rule 4): each gather's unit is announced max(k, 1) uses before the gather is
// issued, so a shard read from NVMe runs while those uses compute. The log interleaves the
// announcements ("r"), the gathers ("g") and the ends of uses ("f"): a unit's read precedes
// its gather by at least one finished use, except for the first k + 1 gathers, issued
// together at the pass's first Acquire; a use whose unit is still held announces nothing.
TEST_F(PrefetchCoordinatorTest, AnnouncesReadsAheadOfTheGathers) {
  for (int prefetch : {1, 2}) {
    Make(prefetch, /*dedicated_first=*/false);
    std::vector<std::string> log;
    log_ = &log;
    coordinator_->SetReadAhead([&](int u) { log.push_back(absl::StrCat("r", u)); });
    std::vector<UnitUse> uses = {{0, true}, {1, true}, {2, true}, {3, true}, {4, false},
                                 {4, true}, {3, true}, {2, true}, {1, true}};
    coordinator_->Begin(uses);
    for (int i = 0; i < static_cast<int>(uses.size()); ++i) {
      ASSERT_TRUE(coordinator_->Acquire(i).ok()) << i;
      ASSERT_TRUE(coordinator_->Finish(i).ok()) << i;
      log.push_back(absl::StrCat("f", i));
    }
    ASSERT_TRUE(coordinator_->End().ok());
    if (prefetch == 1) {
      EXPECT_THAT(
          log, ElementsAre("g0", "g1", "r2", "f0", "g2", "r3", "f1", "g3", "r4", "f2", "g4", "f3",
                           "r3", "f4", "g3", "r2", "f5", "g2", "r1", "f6", "g1", "f7", "f8"));
    } else {
      EXPECT_THAT(
          log, ElementsAre("g0", "g1", "g2", "r3", "r4", "f0", "g3", "f1", "g4", "r3", "f2", "r2",
                           "f3", "g3", "r1", "f4", "g2", "f5", "g1", "f6", "f7", "f8"));
    }
  }
}

}  // namespace
}  // namespace zt
