#include "daemon/scheduler.h"

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zt {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

SchedulerNode Node(const std::string& id, int devices, int64_t memory = 8 * kGiB) {
  SchedulerNode node{id, {}};
  for (int i = 0; i < devices; ++i) {
    node.devices.push_back({i, zerotrain::ResourceConfig::CPU, memory});
  }
  return node;
}

SchedulerJob Job(const std::string& id, int world, int priority = 0, int64_t order = 0,
                 int64_t memory = kGiB) {
  return SchedulerJob{.id = id,
                      .priority = priority,
                      .order = order,
                      .world_size = world,
                      .shard_group_size = world,
                      .device_kind = zerotrain::ResourceConfig::CPU,
                      .device_memory_bytes = memory};
}

// "node:device" of every rank, in rank order.
std::vector<std::string> Where(const JobPlacement& placement) {
  std::vector<std::string> out;
  for (int r = 0; r < static_cast<int>(placement.ranks.size()); ++r) {
    EXPECT_EQ(placement.ranks[r].rank(), r);
    out.push_back(absl::StrCat(placement.ranks[r].node_id(), ":", placement.ranks[r].device()));
  }
  return out;
}

TEST(SchedulerTest, HigherPriorityFirstThenSubmissionOrder) {
  // Two devices: only two one-rank jobs run; the high-priority one and the earlier of the
  // normal ones.
  std::vector<JobPlacement> placed = ScheduleJobs(
      {Job("late", 1, 0, 3), Job("early", 1, 0, 2), Job("urgent", 1, 5, 4)}, {Node("a", 2)});
  ASSERT_EQ(placed.size(), 2u);
  EXPECT_EQ(placed[0].job_id, "urgent");
  EXPECT_EQ(placed[1].job_id, "early");
}

TEST(SchedulerTest, GangAllOrNoneAndStrictFifo) {
  // The 3-rank job does not fit in 2 free devices: nothing of it is placed, and the 1-rank
  // job behind it waits too (no backfill).
  std::vector<JobPlacement> placed =
      ScheduleJobs({Job("big", 3, 0, 1), Job("small", 1, 0, 2)}, {Node("a", 1), Node("b", 1)});
  EXPECT_TRUE(placed.empty());
  // Once it fits, all of its ranks are placed.
  placed = ScheduleJobs({Job("big", 3, 0, 1)}, {Node("a", 1), Node("b", 2)});
  ASSERT_EQ(placed.size(), 1u);
  EXPECT_EQ(placed[0].ranks.size(), 3u);
}

TEST(SchedulerTest, PacksOntoFewestNodesWithConsecutiveRanks) {
  // One node with 2 free devices suffices for a 2-rank job: the best fit (b, 2 free) is chosen
  // over the larger c, and a (1 free) is not split into.
  std::optional<JobPlacement> two =
      PlaceJob(Job("j", 2), {Node("a", 1), Node("b", 2), Node("c", 4)});
  ASSERT_TRUE(two.has_value());
  EXPECT_THAT(Where(*two), ::testing::ElementsAre("b:0", "b:1"));
  // 5 ranks over 3 + 2 + 1 devices: the two largest nodes, consecutive ranks per node.
  std::optional<JobPlacement> five =
      PlaceJob(Job("j", 5), {Node("a", 1), Node("b", 2), Node("c", 3)});
  ASSERT_TRUE(five.has_value());
  EXPECT_THAT(Where(*five), ::testing::ElementsAre("c:0", "c:1", "c:2", "b:0", "b:1"));
}

TEST(SchedulerTest, HybridShardGroupsStayInsideANode) {
  SchedulerJob job = Job("h", 4);
  job.shard_group_size = 2;
  // 3 + 1 devices hold 4 ranks, but a group of 2 would span the nodes: a takes one group, b
  // none, so it waits for a node with room for a whole group.
  EXPECT_FALSE(PlaceJob(job, {Node("a", 3), Node("b", 1)}).has_value());
  std::optional<JobPlacement> placed = PlaceJob(job, {Node("a", 3), Node("b", 2)});
  ASSERT_TRUE(placed.has_value());
  EXPECT_THAT(Where(*placed), ::testing::ElementsAre("a:0", "a:1", "b:0", "b:1"));
}

TEST(SchedulerTest, DevicesTooSmallOrOfAnotherKindDoNotQualify) {
  SchedulerNode mixed = Node("a", 0);
  mixed.devices.push_back({0, zerotrain::ResourceConfig::CPU, kGiB / 2});
  mixed.devices.push_back({1, zerotrain::ResourceConfig::CUDA, 80 * kGiB});
  mixed.devices.push_back({2, zerotrain::ResourceConfig::CPU, 2 * kGiB});
  std::optional<JobPlacement> placed = PlaceJob(Job("j", 1), {mixed});
  ASSERT_TRUE(placed.has_value());
  EXPECT_THAT(Where(*placed), ::testing::ElementsAre("a:2"));
  EXPECT_FALSE(PlaceJob(Job("j", 2), {mixed}).has_value());
}

// The capacity summary is only a shortcut: summarized nodes place exactly as unsummarized
// ones, with mixed kinds and memories (where the summary cannot decide and the devices are
// scanned) and across the several jobs of one pass (which re-summarize what they take).
TEST(SchedulerTest, CapacitySummariesPlaceExactlyAsTheDeviceLists) {
  std::vector<SchedulerNode> nodes = {Node("a", 4), Node("b", 2, 2 * kGiB), Node("c", 0),
                                      Node("d", 3)};
  nodes[2].devices.push_back({0, zerotrain::ResourceConfig::CPU, kGiB / 2});
  nodes[2].devices.push_back({1, zerotrain::ResourceConfig::CUDA, 80 * kGiB});
  nodes[2].devices.push_back({2, zerotrain::ResourceConfig::CPU, 3 * kGiB});
  nodes[3].devices[1].memory_bytes = kGiB / 4;  // one small device among alike ones
  std::vector<SchedulerNode> summarized = nodes;
  for (SchedulerNode& n : summarized) SummarizeCapacity(n);
  EXPECT_EQ(summarized[2].capacity[zerotrain::ResourceConfig::CPU].count, 2);
  EXPECT_EQ(summarized[2].capacity[zerotrain::ResourceConfig::CPU].smallest_memory_bytes, kGiB / 2);
  EXPECT_EQ(summarized[2].capacity[zerotrain::ResourceConfig::CUDA].count, 1);
  const std::vector<SchedulerJob> queued = {Job("one", 1, 0, 1, 2 * kGiB), Job("two", 2, 0, 2),
                                            Job("three", 3, 0, 3, kGiB / 2),
                                            Job("four", 4, 0, 4)};
  const std::vector<JobPlacement> plain = ScheduleJobs(queued, nodes);
  const std::vector<JobPlacement> fast = ScheduleJobs(queued, summarized);
  ASSERT_EQ(plain.size(), fast.size());
  ASSERT_GE(plain.size(), 3u);
  for (size_t j = 0; j < plain.size(); ++j) {
    EXPECT_EQ(plain[j].job_id, fast[j].job_id);
    EXPECT_EQ(Where(plain[j]), Where(fast[j])) << plain[j].job_id;
  }
  SchedulerJob gpu = Job("gpu", 1);
  gpu.device_kind = zerotrain::ResourceConfig::CUDA;
  EXPECT_THAT(Where(*PlaceJob(gpu, summarized)), ::testing::ElementsAre("c:1"));
  gpu.world_size = gpu.shard_group_size = 2;
  EXPECT_EQ(NeverFits(gpu, summarized), NeverFits(gpu, nodes));
  EXPECT_TRUE(NeverFits(gpu, summarized).has_value());
}

TEST(SchedulerTest, NeverFitsGivesTheNumbers) {
  // 2.1 GiB per rank: node-a has 2 such devices of 3, node-b 1 of 2, node-c none.
  const int64_t need = static_cast<int64_t>(2.1 * static_cast<double>(kGiB));
  SchedulerNode a = Node("node-a", 3, 4 * kGiB);
  a.devices[2].memory_bytes = kGiB;
  SchedulerNode b = Node("node-b", 2, kGiB);
  b.devices[1].memory_bytes = 3 * kGiB;
  SchedulerNode c = Node("node-c", 4, kGiB);
  std::optional<std::string> why = NeverFits(Job("j", 4, 0, 0, need), {a, b, c});
  ASSERT_TRUE(why.has_value());
  EXPECT_EQ(*why,
            "needs 4 CPU devices of ≥ 2.10 GiB; the registered nodes have 3 such devices "
            "(node-a: 2, node-b: 1)");
  EXPECT_FALSE(NeverFits(Job("j", 3, 0, 0, need), {a, b, c}).has_value());
}

}  // namespace
}  // namespace zt
