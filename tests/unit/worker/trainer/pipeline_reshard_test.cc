// Pipeline stages at ZeRO-3 with reshard_after_forward (FSDP's per-use gather): each
// micro-batch's forward on a stage gathers a unit before its use and frees it after, and the
// backward gathers it again, while the gradients accumulate into the same full buffers as a
// stage that keeps its units gathered for the step (reshard_after_forward false). Gathering is
// exact, so the two are the same training bit for bit — losses, norms, validation losses, every
// rank's shards and exported weights — under 1F1B, GPipe, interleaved 1F1B, in bf16 and with
// tensor-parallel stages; the extra gathers are counted exactly from the communicators'
// counters; the stage plans a pool of prefetch_units + 1 gathered units (what the arenas use)
// instead of every unit. (A checkpoint of such stages resuming bit for bit:
// PipelineTrainingTest.CheckpointResumesBitIdenticallyAtItsOwnLayout.)
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/trainer/pattern_corpus.h"
#include "tests/unit/worker/trainer/pipeline_runs.h"
#include "tests/unit/worker/trainer/small_sharded_job.h"
#include "worker/data/token_shard.h"
#include "worker/job/job_loading.h"
#include "worker/model/param_layout.h"
#include "worker/parallel/parallel_layout.h"
#include "worker/plan/gathered_units.h"
#include "worker/plan/memory_plan.h"

namespace zt {
namespace {

using testing::PipelineOutcome;
using testing::PipelineRankRun;
using zerotrain::JobSpec;
using zerotrain::ParallelConfig;

class PipelineReshardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TestScratchDir("zt-pp-reshard-test");
    ASSERT_TRUE(WriteTokenShard((dir_ / "train.bin").string(), testing::PatternTokens(), 32).ok());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // tp × pp × dp ranks, m = 4 micro-batches of one sequence, ZeRO-3 with the given reshard,
  // data.val evaluated at steps 5 and 10 (three micro-batches: the forward-only pass gathers
  // per use too).
  JobSpec Job(bool llama, int tp, int pp, int dp, ParallelConfig::PipelineSchedule schedule,
              bool reshard) {
    JobSpec job = testing::SmallShardedJob((dir_ / "train.bin").string(), tp * pp * dp,
                                           /*stage=*/3, /*micro_batch=*/1, /*accum=*/4);
    if (llama) testing::MakeSmallGqaLlama(job);
    job.mutable_model()->set_n_layer(4);
    auto* parallel = job.mutable_parallel();
    parallel->set_tensor_parallel(tp);
    parallel->set_pipeline_parallel(pp);
    parallel->set_pipeline_schedule(schedule);
    if (schedule == ParallelConfig::INTERLEAVED) parallel->set_virtual_stages(2);
    parallel->set_reshard_after_forward(reshard);
    job.mutable_data()->add_val((dir_ / "train.bin").string());
    job.mutable_train()->set_eval_interval(5);
    job.mutable_train()->set_eval_steps(3);
    job.mutable_train()->set_max_steps(10);
    return job;
  }
  // The one-rank job reading the same global batch: dp sequences a micro-batch.
  JobSpec OneRank(bool llama, int dp) {
    JobSpec job = Job(llama, 1, 1, 1, ParallelConfig::ONE_F_ONE_B, true);
    job.mutable_parallel()->set_zero_stage(0);
    job.mutable_train()->set_micro_batch_size(dp);
    return job;
  }

  std::filesystem::path dir_;
};

// Bytes one all-gather of a unit of `numel` elements sends from this rank: Gloo's ring sends
// its shard (`bytes` per element) to each of the G − 1 others (GlooCommunicator::AllGather).
int64_t GatherBytes(int64_t numel, const ShardGeometry& g, int64_t bytes) {
  return int64_t{g.group_size - 1} * ShardOf(numel, g).shard_numel * bytes;
}

TEST_F(PipelineReshardTest, ReshardAfterForwardIsTheKeptGatheredTrainingBitForBit) {
  struct Case {
    bool llama;
    int tp;
    ParallelConfig::PipelineSchedule schedule;
    bool against_one_rank;
    bool bf16 = false;  // 16-bit parameters, gathered as 16 bits; master weights f32
  };
  for (const Case& c : {Case{false, 1, ParallelConfig::ONE_F_ONE_B, true},
                        Case{false, 1, ParallelConfig::GPIPE, false},
                        Case{true, 1, ParallelConfig::INTERLEAVED, true},
                        Case{false, 2, ParallelConfig::ONE_F_ONE_B, false},
                        Case{true, 1, ParallelConfig::ONE_F_ONE_B, false, /*bf16=*/true}}) {
    const std::string what =
        absl::StrCat(c.llama ? "llama" : "gpt2", c.tp > 1 ? " tp2 x" : "", " pp2 x dp2 zero-3 ",
                     ParallelConfig::PipelineSchedule_Name(c.schedule), c.bf16 ? " bf16" : "");
    auto job_of = [&](bool reshard) {
      JobSpec job = Job(c.llama, c.tp, 2, 2, c.schedule, reshard);
      if (c.bf16) {
        auto* p = job.mutable_precision();
        p->set_param_dtype(zerotrain::PrecisionConfig::BF16);
        p->set_compute_dtype(zerotrain::PrecisionConfig::BF16);
        p->set_grad_dtype(zerotrain::PrecisionConfig::BF16);
      }
      return job;
    };
    const PipelineOutcome kept = testing::RunPipelineRanks(job_of(/*reshard=*/false), 10);
    PipelineOutcome per_use = testing::RunPipelineRanks(job_of(/*reshard=*/true), 10);
    ASSERT_TRUE(kept.status.ok()) << what << ": " << kept.status;
    ASSERT_TRUE(per_use.status.ok()) << what << ": " << per_use.status;
    ASSERT_EQ(kept.ranks.size(), per_use.ranks.size()) << what;
    const JobSpec& job = per_use.job;
    const int64_t m = job.train().grad_accum_steps(), steps = 10;
    const int64_t evals = 2, val_batches = job.train().eval_steps();
    for (size_t r = 0; r < per_use.ranks.size(); ++r) {
      const PipelineRankRun& got = per_use.ranks[r];
      const PipelineRankRun& want = kept.ranks[r];
      const std::string rank = absl::StrCat(what, ", rank ", r);
      // Bit for bit: gathering copies the shards exactly, and both accumulate the micro-batches
      // into the same full gradient buffers in the same order.
      EXPECT_EQ(got.losses, want.losses) << rank;
      EXPECT_EQ(got.grad_norms, want.grad_norms) << rank;
      EXPECT_EQ(got.val_losses, want.val_losses) << rank;
      EXPECT_EQ(got.params, want.params) << rank;
      EXPECT_EQ(got.whole, want.whole) << rank;
      EXPECT_TRUE(got.unclaimed.empty()) << rank << ": unused plan buffer " << got.unclaimed[0];
      EXPECT_TRUE(got.off_plan.empty()) << rank << ": " << got.off_plan[0];

      // The gathers: per micro-batch a forward gathers each of the stage's units, a backward
      // each again but the embedding (its backward reads no parameters) and the head (kept
      // from its forward, whose backward follows at once); an evaluation's forward gathers
      // each unit per validation micro-batch. Kept gathered, a stage gathers each unit once a
      // step and once an evaluation. Everything else the ranks send is the same in both.
      const ParallelLayout place = ParallelLayout::ForJob(job, static_cast<int>(r));
      const ShardGeometry& g = place.shard();
      const int64_t element = c.bf16 ? 2 : 4;  // bytes of a parameter
      int64_t extra_calls = 0, extra_bytes = 0;
      for (size_t u = 0; u < got.layout.units.size(); ++u) {
        const int whole = got.held_units[u];
        const bool embedding = whole == 0, head = whole == job.model().n_layer() + 1;
        const int64_t training = m * (2 - embedding - head) - 1;
        const int64_t evaluation = val_batches - 1;
        const int64_t calls = steps * training + evals * evaluation;
        extra_calls += calls;
        extra_bytes += calls * GatherBytes(got.layout.units[u].numel, g, element);
      }
      EXPECT_EQ(got.comm[CommKind::kAllGather].calls - want.comm[CommKind::kAllGather].calls,
                extra_calls)
          << rank;
      EXPECT_EQ(
          got.comm[CommKind::kAllGather].bytes_sent - want.comm[CommKind::kAllGather].bytes_sent,
          extra_bytes)
          << rank;

      // The plan: prefetch_units + 1 buffers of the stage's largest unit instead of one per
      // unit, the arenas' high-water mark (off_plan above).
      const MemoryPlan per_use_plan = PlanMemory(job, place);
      const MemoryPlan kept_plan = PlanMemory(kept.job, place);
      int64_t largest = 0, every_unit = 0;
      for (const UnitLayout& unit : got.layout.units) {
        const int64_t padded = ShardOf(unit.numel, g).padded;
        largest = std::max(largest, padded);
        every_unit += AlignedBytes(padded * element);
      }
      EXPECT_EQ(GatheredUnitBytes(per_use_plan),
                (job.parallel().prefetch_units() + 1) * AlignedBytes(largest * element))
          << rank;
      EXPECT_EQ(GatheredUnitBytes(kept_plan), every_unit) << rank;
      EXPECT_LT(GatheredUnitBytes(per_use_plan), GatheredUnitBytes(kept_plan)) << rank;
      EXPECT_EQ(kept_plan.CategoryBytes(MemoryCategory::kParameters) -
                    per_use_plan.CategoryBytes(MemoryCategory::kParameters),
                GatheredUnitBytes(kept_plan) - GatheredUnitBytes(per_use_plan))
          << rank;
    }
    if (c.against_one_rank) {
      // And one rank reading the same global batch, to fp32 reduction noise
      // (testing::ExpectSamePipelineTraining's bounds): each stage's two DP shards joined.
      const PipelineOutcome one = testing::RunPipelineRanks(OneRank(c.llama, 2), 10);
      for (int first : {0, 2}) {
        for (size_t u = 0; u < per_use.ranks[first].params.size(); ++u) {
          const std::vector<float>& second = per_use.ranks[first + 1].params[u];
          per_use.ranks[first].params[u].insert(per_use.ranks[first].params[u].end(),
                                                second.begin(), second.end());
        }
        per_use.ranks[first + 1].params = per_use.ranks[first].params;
      }
      testing::ExpectSamePipelineTraining(per_use, one, what);
    }
  }
}

}  // namespace
}  // namespace zt
