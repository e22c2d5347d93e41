// The schedules' orders as pure functions (worker/plan/pipeline_schedule.h) and the
// unit-time simulation of them (pipeline_bubble.h): over many p, v and m, every stage runs
// each of its (chunk, micro-batch)'s forward once and then its backward once, each chunk in
// micro-batch order; the stages together never deadlock (every op's inputs come from an op
// that can run first); the interleaved order is Megatron's; and the bubble is exactly
// (p − 1)/(m + p − 1) for GPipe and 1F1B and (p − 1)/(v·m + p − 1) interleaved.
#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/plan/pipeline_bubble.h"
#include "worker/plan/pipeline_schedule.h"

namespace zt {
namespace {

using zerotrain::ParallelConfig;

// Every (chunk, micro-batch) forward exactly once, then its backward exactly once, and each
// chunk's forwards (and backwards) in micro-batch order, so the ones in flight are consecutive
// and slot k mod in_flight is free when micro-batch k arrives.
void ExpectEachOnceInOrder(const std::vector<PipelineOp>& ops, int m, int v,
                           const std::string& what) {
  ASSERT_EQ(static_cast<int>(ops.size()), 2 * m * v) << what;
  std::vector<std::vector<int>> state(v, std::vector<int>(m, 0));
  std::vector<int> forwards(v, 0), backwards(v, 0);
  for (const PipelineOp& op : ops) {
    ASSERT_GE(op.chunk, 0) << what;
    ASSERT_LT(op.chunk, v) << what;
    ASSERT_GE(op.micro_batch, 0) << what;
    ASSERT_LT(op.micro_batch, m) << what;
    int& s = state[op.chunk][op.micro_batch];
    ASSERT_EQ(s, op.forward ? 0 : 1) << what << ": chunk " << op.chunk << " micro-batch "
                                     << op.micro_batch << (op.forward ? " forward" : " backward");
    ++s;
    EXPECT_EQ(op.micro_batch, op.forward ? forwards[op.chunk]++ : backwards[op.chunk]++) << what;
  }
}

TEST(PipelineScheduleTest, EveryChunkAndMicroBatchRunsForwardOnceThenBackwardOnce) {
  for (int p : {2, 3, 4, 5, 8}) {
    for (int m = p; m <= 4 * p; ++m) {
      for (auto schedule : {ParallelConfig::GPIPE, ParallelConfig::ONE_F_ONE_B}) {
        for (int r = 0; r < p; ++r) {
          ExpectEachOnceInOrder(PipelineStageOps(schedule, p, r, m), m, 1,
                                absl::StrCat(ParallelConfig::PipelineSchedule_Name(schedule),
                                             " p ", p, " m ", m, " rank ", r));
        }
      }
      if (m % p != 0) continue;  // validation's rule for the interleaved schedule
      for (int v : {2, 3, 4}) {
        for (int r = 0; r < p; ++r) {
          ExpectEachOnceInOrder(PipelineStageOps(ParallelConfig::INTERLEAVED, p, r, m, v), m, v,
                                absl::StrCat("interleaved p ", p, " v ", v, " m ", m, " rank ", r));
        }
      }
    }
  }
}

TEST(PipelineScheduleTest, InterleavedIsMegatronsOrder) {
  // p 2, v 2, m 4. Rank 0's warmup is 2·(2 − 0 − 1) + (2 − 1)·2 = 4 forwards, rank 1's 2:
  // groups of p micro-batches go through chunk 0 then chunk 1; backwards take the chunks in
  // reverse.
  auto F = [](int c, int k) { return PipelineOp{.forward = true, .micro_batch = k, .chunk = c}; };
  auto B = [](int c, int k) { return PipelineOp{.forward = false, .micro_batch = k, .chunk = c}; };
  EXPECT_THAT(PipelineStageOps(ParallelConfig::INTERLEAVED, 2, 0, 4, 2),
              ::testing::ElementsAre(F(0, 0), F(0, 1), F(1, 0), F(1, 1),  // warmup
                                     F(0, 2), B(1, 0), F(0, 3), B(1, 1),  // steady
                                     F(1, 2), B(0, 0), F(1, 3), B(0, 1),
                                     B(1, 2), B(1, 3), B(0, 2), B(0, 3)));  // cooldown
  EXPECT_THAT(PipelineStageOps(ParallelConfig::INTERLEAVED, 2, 1, 4, 2),
              ::testing::ElementsAre(F(0, 0), F(0, 1),  // warmup
                                     F(1, 0), B(1, 0), F(1, 1), B(1, 1), F(0, 2), B(0, 0),
                                     F(0, 3), B(0, 1), F(1, 2), B(1, 2), F(1, 3), B(1, 3),
                                     B(0, 2), B(0, 3)));  // cooldown
  // Model chunks: rank r's local chunk c is c·p + r.
  EXPECT_EQ(ModelChunk(4, 3, 0), 3);
  EXPECT_EQ(ModelChunk(4, 0, 1), 4);
}

TEST(PipelineScheduleTest, LastStageRunsEachHeadBackwardRightAfterItsForward) {
  // The head's gradient scratch holds one micro-batch (Transformer::StageForward).
  for (int p : {2, 3, 4}) {
    for (int v : {1, 2, 3}) {
      for (int m : {p, 2 * p, 3 * p}) {
        const auto schedule = v == 1 ? ParallelConfig::ONE_F_ONE_B : ParallelConfig::INTERLEAVED;
        for (auto s : {schedule, ParallelConfig::GPIPE}) {
          if (s == ParallelConfig::GPIPE && v > 1) continue;
          const std::vector<PipelineOp> ops = PipelineStageOps(s, p, p - 1, m, v);
          for (size_t i = 0; i < ops.size(); ++i) {
            if (!ops[i].forward || ops[i].chunk != v - 1) continue;
            ASSERT_LT(i + 1, ops.size());
            EXPECT_EQ(ops[i + 1], (PipelineOp{.forward = false,
                                              .micro_batch = ops[i].micro_batch,
                                              .chunk = v - 1}))
                << "p " << p << " v " << v << " m " << m;
          }
        }
      }
    }
  }
}

// The unit-time model's makespan is 2·(m + p − 1) (every stage busy 2m of it) for GPipe and
// 1F1B, and 2·(v·m + p − 1) chunk-ops (busy 2·v·m) interleaved: exactly the formulas, as
// integers. The bubble fraction is then the formula's; computed as 1 − busy/(p·makespan) it
// differs from (p − 1)/(v·m + p − 1) only in double rounding (1e-12 is far below the
// 1/(v·m + p − 1) step between neighbouring m).
TEST(PipelineBubbleTest, UnitTimeBubbleIsTheFormulaExactly) {
  for (int p : {1, 2, 3, 4, 6, 8}) {
    for (int m = std::max(p, 1); m <= 4 * p + 1; ++m) {
      for (auto schedule : {ParallelConfig::GPIPE, ParallelConfig::ONE_F_ONE_B}) {
        const std::string what = absl::StrCat(ParallelConfig::PipelineSchedule_Name(schedule),
                                              " p ", p, " m ", m);
        absl::StatusOr<PipelineSimulation> sim = SimulatePipeline(schedule, p, m);
        ASSERT_TRUE(sim.ok()) << what << ": " << sim.status();
        EXPECT_EQ(sim->makespan, 2 * (m + p - 1)) << what;
        EXPECT_EQ(sim->busy, int64_t{2} * m * p) << what;
        EXPECT_NEAR(sim->bubble, static_cast<double>(p - 1) / (m + p - 1), 1e-12) << what;
      }
      if (p < 2 || m % p != 0) continue;
      for (int v : {2, 3, 4}) {
        const std::string what = absl::StrCat("interleaved p ", p, " v ", v, " m ", m);
        absl::StatusOr<PipelineSimulation> sim =
            SimulatePipeline(ParallelConfig::INTERLEAVED, p, m, v);
        ASSERT_TRUE(sim.ok()) << what << ": " << sim.status();
        EXPECT_EQ(sim->makespan, 2 * (int64_t{v} * m + p - 1)) << what;
        EXPECT_EQ(sim->busy, int64_t{2} * m * v * p) << what;
        EXPECT_NEAR(sim->bubble, static_cast<double>(p - 1) / (v * m + p - 1), 1e-12) << what;
      }
    }
  }
  // The figures bench/RESULTS.md compares the measured bubble with.
  EXPECT_NEAR(SimulatePipeline(ParallelConfig::ONE_F_ONE_B, 4, 4)->bubble, 3.0 / 7.0, 1e-12);
  EXPECT_NEAR(SimulatePipeline(ParallelConfig::INTERLEAVED, 4, 8, 2)->bubble, 3.0 / 19.0, 1e-12);
}

}  // namespace
}  // namespace zt
