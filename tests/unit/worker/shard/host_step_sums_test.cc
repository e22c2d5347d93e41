// Tests of worker/shard/host_step_sums.h: the delayed host step's Adafactor sums connect only
// where a job needs them, reach exactly the shard group's and the tensor-parallel group's
// ranks, and run beside the rank's own communicators from another thread, in any order the
// two threads' operations interleave on each rank. Ranks are threads sharing an InProcessStore;
// values are small integers (exact f32 sums).
#include "worker/shard/host_step_sums.h"

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/dtype.h"
#include "kernels/tensor.h"
#include "worker/comm/store.h"
#include "worker/parallel/parallel_layout.h"
#include "worker/plan/arena.h"
#include "worker/shard/rank_communicators.h"

namespace zt {
namespace {

float SumOf(const std::vector<int>& ranks, float scale) {
  float s = 0;
  for (int r : ranks) s += scale * static_cast<float>(r + 1);
  return s;
}

zerotrain::JobSpec AdafactorJob(int world, int tp, int shard_group, bool delayed) {
  zerotrain::JobSpec job;
  job.mutable_optimizer()->set_type(zerotrain::OptimizerConfig::ADAFACTOR);
  job.mutable_parallel()->set_world_size(world);
  job.mutable_parallel()->set_tensor_parallel(tp);
  job.mutable_parallel()->set_zero_stage(1);
  job.mutable_parallel()->set_shard_group_size(shard_group);
  job.mutable_parallel()->set_comm_timeout_s(30);
  job.mutable_offload()->mutable_delayed_update()->set_enabled(delayed);
  return job;
}

// Nothing to connect (and so no rendezvous a peer could miss): without the delayed update,
// without Adafactor, or with an Adafactor that sums nothing across ranks.
TEST(HostStepSumsTest, NoneWhereTheHostStepSumsNothingOnTheDelayedThread) {
  zerotrain::JobSpec serial = AdafactorJob(4, 2, 2, /*delayed=*/false);
  zerotrain::JobSpec adamw = AdafactorJob(4, 2, 2, /*delayed=*/true);
  adamw.mutable_optimizer()->set_type(zerotrain::OptimizerConfig::ADAMW);
  const zerotrain::JobSpec one_rank = AdafactorJob(1, 1, 1, /*delayed=*/true);
  InProcessStore store;
  for (const zerotrain::JobSpec& job : {serial, adamw, one_rank}) {
    absl::StatusOr<HostStepSums> sums =
        ConnectHostStepSums(job, ParallelLayout::ForJob(job, 0), &store);
    ASSERT_TRUE(sums.ok()) << sums.status();
    EXPECT_FALSE(sums->shard_group);
    EXPECT_FALSE(sums->tensor);
  }
}

// 8 ranks at tensor_parallel 2 with shard groups of 2: on each rank one thread runs "the next
// step's" collectives on the rank's shard-group and tensor-parallel communicators while
// another runs the host step's sums; odd ranks start the host step's first, even ranks the
// step's, so the two streams interleave differently on the ranks of every group. Each
// operation still meets its own peers: every result is its group's sum.
TEST(HostStepSumsTest, SumOverTheirGroupsBesideTheRanksOwnCollectives) {
  const zerotrain::JobSpec job = AdafactorJob(8, 2, 2, /*delayed=*/true);
  absl::StatusOr<std::unique_ptr<Arenas>> arenas = Arenas::Create(MemoryPlan{});
  ASSERT_TRUE(arenas.ok()) << arenas.status();
  InProcessStore store;
  constexpr int kRounds = 20;
  std::vector<std::thread> ranks;
  for (int r = 0; r < 8; ++r) {
    ranks.emplace_back([&, r] {
      const ParallelLayout layout = ParallelLayout::ForJob(job, r);
      absl::StatusOr<RankCommunicators> comms = ConnectRank(job, layout, &store, **arenas);
      ASSERT_TRUE(comms.ok()) << comms.status();
      absl::StatusOr<HostStepSums> sums = ConnectHostStepSums(job, layout, &store);
      ASSERT_TRUE(sums.ok()) << sums.status();
      ASSERT_TRUE(sums->shard_group);
      ASSERT_TRUE(sums->tensor);
      const ShardComms view = comms->view();
      const float shard_sum = SumOf(layout.ShardGroup(), 1);
      const float tensor_sum = SumOf(layout.TensorGroup(), 1);
      std::thread compute([&] {
        if (r % 2 == 1) std::this_thread::sleep_for(std::chrono::milliseconds(20));
        for (int k = 0; k < kRounds; ++k) {
          for (Communicator* c : {view.shard_group, view.tensor}) {
            float v = static_cast<float>(r + 1);
            absl::StatusOr<CommHandle> h =
                c->AllReduce(Tensor(&v, DType::kF32, {1}), ReduceOp::kSum, "step");
            ASSERT_TRUE(h.ok()) << h.status();
            ASSERT_TRUE(h->Wait().ok());
            EXPECT_EQ(v, c == view.tensor ? tensor_sum : shard_sum) << "rank " << r;
          }
        }
      });
      std::thread host([&] {
        if (r % 2 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
        for (int k = 0; k < kRounds; ++k) {
          // Two floats, as the statistics are rows of them.
          float shard[2] = {100.0f * (r + 1), 1.0f};
          ASSERT_TRUE(sums->shard_group(shard, 2).ok());
          EXPECT_EQ(shard[0], 100.0f * shard_sum) << "rank " << r;
          EXPECT_EQ(shard[1], 2.0f) << "rank " << r;
          float tensor[2] = {100.0f * (r + 1), 1.0f};
          ASSERT_TRUE(sums->tensor(tensor, 2).ok());
          EXPECT_EQ(tensor[0], 100.0f * tensor_sum) << "rank " << r;
          EXPECT_EQ(tensor[1], 2.0f) << "rank " << r;
        }
      });
      compute.join();
      host.join();
      // The sums count in the rank's communication (the trainer adds `stats` to its
      // communicators'): kRounds all-reduces of 2 floats over each group of 2, a ring
      // all-reduce sending 2·(N − 1)/N of the buffer: 8 bytes each.
      const CommStats counted = sums->stats();
      const CommStats::Entry& all_reduce = counted[CommKind::kAllReduce];
      EXPECT_EQ(all_reduce.calls, 2 * kRounds) << "rank " << r;
      EXPECT_EQ(all_reduce.bytes_sent, 2 * kRounds * 8) << "rank " << r;
    });
  }
  for (std::thread& t : ranks) t.join();
}

}  // namespace
}  // namespace zt
