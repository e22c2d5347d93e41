// Tests of worker/parallel/parallel_layout.h: coordinates, groups and the ZeRO geometry of every
// layout of up to 16 ranks, and tp = pp = 1 reproducing the data-parallel geometry exactly.
#include "worker/parallel/parallel_layout.h"

#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zt {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

struct Dims {
  int world, tensor, pipeline, shard_group;
};

// Every (world ≤ 16, tp, pp, G) that fits.
std::vector<Dims> AllLayouts() {
  std::vector<Dims> out;
  for (int world = 1; world <= 16; ++world) {
    for (int tp = 1; tp <= world; ++tp) {
      for (int pp = 1; pp * tp <= world; ++pp) {
        if (world % (tp * pp) != 0) continue;
        const int dp = world / (tp * pp);
        for (int g = 1; g <= dp; ++g) {
          if (dp % g == 0) out.push_back({world, tp, pp, g});
        }
      }
    }
  }
  return out;
}

ParallelLayout Make(const Dims& d, int rank) {
  absl::StatusOr<ParallelLayout> l = ParallelLayout::Create(
      {.world = d.world, .tensor = d.tensor, .pipeline = d.pipeline, .shard_group = d.shard_group},
      rank);
  EXPECT_TRUE(l.ok()) << l.status();
  return *l;
}

TEST(ParallelLayoutTest, TensorIsInnermostThenDataThenPipeline) {
  // 16 ranks, tp 2, pp 2, dp 4.
  const Dims d{16, 2, 2, 4};
  for (int r = 0; r < 16; ++r) {
    const ParallelLayout l = Make(d, r);
    EXPECT_EQ(l.coordinates(),
              (ParallelCoordinates{.tensor = r % 2, .data = (r / 2) % 4, .pipeline = r / 8}))
        << r;
  }
  const ParallelLayout l = Make(d, 11);  // tp 1, dp 1, pp 1
  EXPECT_THAT(l.TensorGroup(), ElementsAre(10, 11));
  EXPECT_THAT(l.DataGroup(), ElementsAre(9, 11, 13, 15));
  EXPECT_THAT(l.PipelineGroup(), ElementsAre(3, 11));
  EXPECT_EQ(l.DataGroupIndex(), 3);
}

TEST(ParallelLayoutTest, HybridShardAndReplicaGroupsLieInsideTheDataGroup) {
  // 16 ranks, tp 2, pp 1, dp 8 in shard groups of 4: rank 13 is dp 6, member 2 of group 1.
  const ParallelLayout l = Make({16, 2, 1, 4}, 13);
  EXPECT_EQ(l.shard().rank, 6);
  EXPECT_EQ(l.shard().group(), 1);
  EXPECT_EQ(l.shard().group_rank(), 2);
  EXPECT_THAT(l.ShardGroup(), ElementsAre(9, 11, 13, 15));
  EXPECT_THAT(l.ReplicaGroup(), ElementsAre(5, 13));
}

// Each group kind partitions the world: every rank lies in exactly one group of each kind,
// every member of a rank's group names the same group, and the group's i-th member has
// coordinate i on the group's dimension.
TEST(ParallelLayoutTest, EveryGroupKindPartitionsTheWorldForEveryLayout) {
  for (const Dims& d : AllLayouts()) {
    SCOPED_TRACE(testing::Message() << "world " << d.world << " tp " << d.tensor << " pp "
                                    << d.pipeline << " G " << d.shard_group);
    using Groups = std::vector<int> (ParallelLayout::*)() const;
    for (Groups groups :
         {&ParallelLayout::TensorGroup, &ParallelLayout::PipelineGroup, &ParallelLayout::DataGroup,
          &ParallelLayout::ShardGroup, &ParallelLayout::ReplicaGroup}) {
      std::map<int, int> times_seen;
      std::set<std::vector<int>> distinct;
      for (int r = 0; r < d.world; ++r) {
        const std::vector<int> g = (Make(d, r).*groups)();
        EXPECT_TRUE(std::find(g.begin(), g.end(), r) != g.end()) << r;
        EXPECT_TRUE(std::is_sorted(g.begin(), g.end()));
        for (int member : g) EXPECT_EQ((Make(d, member).*groups)(), g) << r << " " << member;
        if (distinct.insert(g).second) {
          for (int member : g) ++times_seen[member];
        }
      }
      ASSERT_EQ(static_cast<int>(times_seen.size()), d.world);
      for (const auto& [rank, times] : times_seen) EXPECT_EQ(times, 1) << rank;
    }
    // Sizes, and the coordinate each group walks.
    for (int r = 0; r < d.world; ++r) {
      const ParallelLayout l = Make(d, r);
      EXPECT_EQ(l.RankAt(l.coordinates()), r);
      EXPECT_EQ(l.TensorGroup().size(), static_cast<size_t>(d.tensor));
      EXPECT_EQ(l.PipelineGroup().size(), static_cast<size_t>(d.pipeline));
      EXPECT_EQ(l.DataGroup().size(), static_cast<size_t>(l.data_size()));
      EXPECT_EQ(l.ShardGroup().size(), static_cast<size_t>(d.shard_group));
      EXPECT_EQ(l.ReplicaGroup().size(), static_cast<size_t>(l.data_size() / d.shard_group));
      for (int i = 0; i < d.tensor; ++i) {
        EXPECT_EQ(l.CoordinatesOf(l.TensorGroup()[i]).tensor, i);
      }
      for (int i = 0; i < d.pipeline; ++i) {
        EXPECT_EQ(l.CoordinatesOf(l.PipelineGroup()[i]).pipeline, i);
      }
      for (int i = 0; i < l.data_size(); ++i) {
        EXPECT_EQ(l.CoordinatesOf(l.DataGroup()[i]).data, i);
      }
      EXPECT_EQ(l.ShardGroup()[l.shard().group_rank()], r);
      EXPECT_EQ(l.ReplicaGroup()[l.shard().group()], r);
      EXPECT_GE(l.DataGroupIndex(), 0);
      EXPECT_LT(l.DataGroupIndex(), d.tensor * d.pipeline);
    }
  }
}

// tp = pp = 1: the data-parallel group is the world and ZeRO's geometry is the one
// the plan used before layouts existed (rank r is member r mod G of group r / G).
TEST(ParallelLayoutTest, OneTensorAndOnePipelineRankReproduceDataParallelGeometry) {
  for (int world = 1; world <= 16; ++world) {
    for (int g = 1; g <= world; ++g) {
      if (world % g != 0) continue;
      for (int r = 0; r < world; ++r) {
        const ParallelLayout l = Make({world, 1, 1, g}, r);
        EXPECT_EQ(l.shard().world_size, world);
        EXPECT_EQ(l.shard().group_size, g);
        EXPECT_EQ(l.shard().rank, r);
        EXPECT_EQ(l.shard().group_rank(), r % g);
        EXPECT_EQ(l.shard().group(), r / g);
        EXPECT_EQ(l.DataGroup().size(), static_cast<size_t>(world));
        EXPECT_EQ(l.DataGroupIndex(), 0);
      }
    }
  }
}

TEST(ParallelLayoutTest, CreateNamesWhatDoesNotFit) {
  EXPECT_THAT(ParallelLayout::Create({.world = 6, .tensor = 4}, 0).status().message(),
              HasSubstr("world size 6 is not divisible by tensor 4 × pipeline 1 = 4"));
  EXPECT_THAT(
      ParallelLayout::Create({.world = 8, .tensor = 2, .shard_group = 3}, 0).status().message(),
      HasSubstr("shard group size 3 does not divide the data-parallel size 4"));
  EXPECT_THAT(ParallelLayout::Create({.world = 4}, 4).status().message(),
              HasSubstr("rank 4 is outside [0, 4)"));
  EXPECT_THAT(ParallelLayout::Create({.world = 4, .pipeline = 0}, 0).status().message(),
              HasSubstr("the pipeline size must be >= 1 (got 0)"));
}

TEST(ParallelLayoutTest, ForJobReadsTheJobAndFallsBackOnSizesThatDoNotFit) {
  zerotrain::JobSpec job;
  job.mutable_parallel()->set_world_size(8);
  job.mutable_parallel()->set_tensor_parallel(2);
  job.mutable_parallel()->set_pipeline_parallel(2);
  job.mutable_parallel()->set_shard_group_size(2);
  const ParallelLayout l = ParallelLayout::ForJob(job, 5);
  EXPECT_EQ(l.tensor_size(), 2);
  EXPECT_EQ(l.pipeline_size(), 2);
  EXPECT_EQ(l.data_size(), 2);
  EXPECT_EQ(l.coordinates(), (ParallelCoordinates{.tensor = 1, .data = 0, .pipeline = 1}));
  EXPECT_EQ(l.shard().group_size, 2);
  // A shard group that does not divide the data-parallel size: the whole group, as the plan of
  // an unvalidated candidate did before.
  job.mutable_parallel()->set_shard_group_size(3);
  EXPECT_EQ(ParallelLayout::ForJob(job, 0).shard().group_size, 2);
  // A tensor size that does not divide the world: one tensor rank.
  job.mutable_parallel()->set_tensor_parallel(3);
  EXPECT_EQ(ParallelLayout::ForJob(job, 0).tensor_size(), 1);
  EXPECT_EQ(ParallelLayout::ForJob(job, 0).data_size(), 4);
}

}  // namespace
}  // namespace zt
