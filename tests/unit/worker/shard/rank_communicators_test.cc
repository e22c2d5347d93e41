// Tests of worker/shard/rank_communicators.h with a ParallelLayout: every rank of a tensor ×
// data layout connects the communicators of its own data-parallel group (and its shard and
// replica groups inside it) and of its tensor-parallel group (and its KV-head subgroup), and a
// collective on each reaches exactly that group's ranks.
// Ranks are threads sharing an InProcessStore; values are small integers (exact f32 sums).
#include "worker/shard/rank_communicators.h"

#include <memory>
#include <numeric>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/dtype.h"
#include "kernels/tensor.h"
#include "worker/comm/store.h"
#include "worker/parallel/parallel_layout.h"
#include "worker/plan/arena.h"

namespace zt {
namespace {

// The sum of (rank + 1) over `ranks`.
float SumOf(const std::vector<int>& ranks) {
  float s = 0;
  for (int r : ranks) s += static_cast<float>(r + 1);
  return s;
}

float AllReduced(Communicator* comm, int rank) {
  float v = static_cast<float>(rank + 1);
  absl::StatusOr<CommHandle> h =
      comm->AllReduce(Tensor(&v, DType::kF32, {1}), ReduceOp::kSum, "probe");
  EXPECT_TRUE(h.ok()) << h.status();
  if (h.ok()) EXPECT_TRUE(h->Wait().ok());
  return v;
}

// 8 ranks at tensor_parallel 2: 4 data-parallel ranks in each of 2 groups, hybrid shard
// groups of 2 inside them (so replica groups of 2 as well).
TEST(RankCommunicatorsTest, EachRankConnectsItsOwnDataParallelGroups) {
  zerotrain::JobSpec job;
  job.mutable_parallel()->set_world_size(8);
  job.mutable_parallel()->set_tensor_parallel(2);
  job.mutable_parallel()->set_zero_stage(1);
  job.mutable_parallel()->set_shard_group_size(2);
  job.mutable_parallel()->set_comm_timeout_s(30);
  // fp32 gradients: no conversion buffers, so an empty plan's arenas serve.
  absl::StatusOr<std::unique_ptr<Arenas>> arenas = Arenas::Create(MemoryPlan{});
  ASSERT_TRUE(arenas.ok()) << arenas.status();
  InProcessStore store;
  std::vector<std::thread> threads;
  for (int r = 0; r < 8; ++r) {
    threads.emplace_back([&, r] {
      const ParallelLayout layout = ParallelLayout::ForJob(job, r);
      absl::StatusOr<RankCommunicators> comms = ConnectRank(job, layout, &store, **arenas);
      ASSERT_TRUE(comms.ok()) << comms.status();
      const ShardComms view = comms->view();
      EXPECT_EQ(view.world->size(), 4);
      EXPECT_EQ(view.world->rank(), layout.coordinates().data);
      EXPECT_EQ(view.shard_group->size(), 2);
      ASSERT_NE(view.replicas, nullptr);
      EXPECT_EQ(view.replicas->size(), 2);
      EXPECT_EQ(AllReduced(view.world, r), SumOf(layout.DataGroup())) << r;
      EXPECT_EQ(AllReduced(view.shard_group, r), SumOf(layout.ShardGroup())) << r;
      EXPECT_EQ(AllReduced(view.replicas, r), SumOf(layout.ReplicaGroup())) << r;
      // Without model heads (n_kv_head 0) only the TP group's own communicator.
      ASSERT_NE(view.tensor, nullptr);
      EXPECT_EQ(view.tensor->rank(), layout.coordinates().tensor);
      EXPECT_EQ(AllReduced(view.tensor, r), SumOf(layout.TensorGroup())) << r;
      EXPECT_EQ(comms->tensor_kv, nullptr);
    });
  }
  for (std::thread& t : threads) t.join();
}

// 8 ranks at tensor_parallel 4 with 2 KV heads: each KV head is shared by 2 consecutive ranks
// of a TP group, which sum its gradient on "tensor.<j>.kv.<k>".
TEST(RankCommunicatorsTest, ReplicatedKvHeadsGetTheirSubgroup) {
  zerotrain::JobSpec job;
  job.mutable_model()->set_n_head(4);
  job.mutable_model()->set_n_kv_head(2);
  job.mutable_parallel()->set_world_size(8);
  job.mutable_parallel()->set_tensor_parallel(4);
  job.mutable_parallel()->set_comm_timeout_s(30);
  absl::StatusOr<std::unique_ptr<Arenas>> arenas = Arenas::Create(MemoryPlan{});
  ASSERT_TRUE(arenas.ok()) << arenas.status();
  InProcessStore store;
  std::vector<std::thread> threads;
  for (int r = 0; r < 8; ++r) {
    threads.emplace_back([&, r] {
      const ParallelLayout layout = ParallelLayout::ForJob(job, r);
      absl::StatusOr<RankCommunicators> comms = ConnectRank(job, layout, &store, **arenas);
      ASSERT_TRUE(comms.ok()) << comms.status();
      EXPECT_EQ(AllReduced(comms->tensor.get(), r), SumOf(layout.TensorGroup())) << r;
      ASSERT_NE(comms->tensor_kv, nullptr);
      EXPECT_EQ(comms->tensor_kv->size(), 2);
      const int first = r / 2 * 2;  // ranks {0,1}, {2,3}, … share a KV head
      EXPECT_EQ(AllReduced(comms->tensor_kv.get(), r), SumOf({first, first + 1})) << r;
    });
  }
  for (std::thread& t : threads) t.join();
}

}  // namespace
}  // namespace zt
