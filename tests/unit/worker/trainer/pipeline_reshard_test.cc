// Pipeline stages at ZeRO-3 with reshard_after_forward (FSDP's per-use gather and per-use
// reduction on a stage): each micro-batch's forward on a stage gathers a unit before its use and
// frees it after, the backward gathers it again, and as soon as a unit's backward of a
// micro-batch ends its gradient (in one of two rotating full slots) is reduce-scattered into the
// rank's gradient shard, which accumulates the micro-batches: no full gradient per unit is held
// through the schedule. Against a stage that keeps its units gathered for the step and
// accumulates full gradients (reshard_after_forward false) and against one rank, under 1F1B,
// GPipe, interleaved 1F1B, in bf16 and with tensor-parallel stages; the gathers and the
// reduce-scatters counted exactly from the communicators' counters; the stage plans
// prefetch_units + 1 gathered units and two gradient slots (what the arenas use) instead of
// every unit's gathered parameters and accumulated gradient. (A checkpoint of such stages
// resuming bit for bit: PipelineTrainingTest.CheckpointResumesBitIdenticallyAtItsOwnLayout.)
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


// Bounds of per-use reduction against the kept gathered stage. In f32 the two sum the same
// gradients in another order (each micro-batch's group sum added to the shard, against the
// micro-batches summed on each rank and then over the group): fp32 reduction noise, bounded as
// ExpectSamePipelineTraining bounds a pipeline against one rank (1e-6 in the loss, 2e-5 in the
// norm, 1e-4 per weight). In bf16 the shard is rounded to bf16 after every micro-batch where the
// full buffer was rounded after every micro-batch's backward: the mixed-precision pipeline
// tests' bf16 bounds against one rank (pipeline_mixed_precision_test.cc: 1e-3, 4e-2, 0.1
// absolute and 2.5e-3 rms per weight), the same kind of noise. A micro-batch lost or reduced
// twice, or an unsummed tied copy, moves the losses by > 1e-2 within a few steps.
struct Bounds {
  double loss, norm, weight, weight_rms;
};
constexpr Bounds kF32{1e-6, 2e-5, 1e-4, 1e-4};
constexpr Bounds kBf16{1e-3, 4e-2, 0.1, 2.5e-3};

void ExpectCloseTraining(const PipelineOutcome& got, const PipelineOutcome& want,
                         const std::string& what, const Bounds& b) {
  ASSERT_EQ(got.ranks.size(), want.ranks.size()) << what;
  for (size_t r = 0; r < got.ranks.size(); ++r) {
    const PipelineRankRun& g = got.ranks[r];
    const PipelineRankRun& w = want.ranks[r];
    ASSERT_EQ(g.losses.size(), w.losses.size()) << what;
    ASSERT_EQ(g.val_losses.size(), w.val_losses.size()) << what;
    for (size_t s = 0; s < w.losses.size(); ++s) {
      EXPECT_NEAR(g.losses[s], w.losses[s], b.loss * w.losses[s]) << what << " step " << s + 1;
      EXPECT_NEAR(g.grad_norms[s], w.grad_norms[s], b.norm * w.grad_norms[s])
          << what << " gradient norm, step " << s + 1;
    }
    for (size_t k = 0; k < w.val_losses.size(); ++k) {
      EXPECT_NEAR(g.val_losses[k], w.val_losses[k], b.loss * w.val_losses[k])
          << what << " validation " << k + 1;
    }
  }
  testing::ExpectSameWholeWeights(got, want, what, b.weight, b.weight_rms);
}

TEST_F(PipelineReshardTest, PerUseGathersAndReductionsTrainAsTheKeptStageAndOneRank) {
  struct Case {
    bool llama;
    int tp;
    ParallelConfig::PipelineSchedule schedule;
    bool against_one_rank;
    bool bf16 = false;  // 16-bit parameters and gradients, gathered as 16 bits; master f32
  };
  for (const Case& c : {Case{false, 1, ParallelConfig::ONE_F_ONE_B, true},
                        Case{false, 1, ParallelConfig::GPIPE, true},
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
    ExpectCloseTraining(per_use, kept, what, c.bf16 ? kBf16 : kF32);
    const JobSpec& job = per_use.job;
    const int64_t m = job.train().grad_accum_steps(), steps = 10;
    const int64_t evals = 2, val_batches = job.train().eval_steps();
    const int64_t element = c.bf16 ? 2 : 4;  // bytes of a parameter and of a gradient
    const bool tied = !c.llama;
    for (size_t r = 0; r < per_use.ranks.size(); ++r) {
      const PipelineRankRun& got = per_use.ranks[r];
      const PipelineRankRun& want = kept.ranks[r];
      const std::string rank = absl::StrCat(what, ", rank ", r);
      EXPECT_TRUE(got.unclaimed.empty()) << rank << ": unused plan buffer " << got.unclaimed[0];
      EXPECT_TRUE(got.off_plan.empty()) << rank << ": " << got.off_plan[0];
      const ParallelLayout place = ParallelLayout::ForJob(job, static_cast<int>(r));
      const ShardGeometry& g = place.shard();

      // The reduce-scatters: per use, every unit of the stage after each micro-batch's backward
      // (m a step); kept, every unit once after the schedule. Gloo reduces in f32 and counts
      // the f32 chunks it sends: (G − 1) shards of 4 bytes an element (GlooCommunicator).
      const int64_t units = static_cast<int64_t>(got.layout.units.size());
      int64_t reduced_bytes = 0;
      for (const UnitLayout& unit : got.layout.units) {
        reduced_bytes += int64_t{g.group_size - 1} * ShardOf(unit.numel, g).shard_numel * 4;
      }
      EXPECT_EQ(got.comm[CommKind::kReduceScatter].calls, steps * m * units) << rank;
      EXPECT_EQ(got.comm[CommKind::kReduceScatter].bytes_sent, steps * m * reduced_bytes) << rank;
      EXPECT_EQ(want.comm[CommKind::kReduceScatter].calls, steps * units) << rank;
      EXPECT_EQ(want.comm[CommKind::kReduceScatter].bytes_sent, steps * reduced_bytes) << rank;

      // The gathers: per micro-batch a forward gathers each of the stage's units, a backward
      // each again but the embedding (its backward reads no parameters) and the head (kept
      // from its forward, whose backward follows at once); an evaluation's forward gathers
      // each unit per validation micro-batch. Kept gathered, a stage gathers each unit once a
      // step and once an evaluation. And per use, a stage holding a copy of the tied wte (the
      // first's embedding, the last's head) gathers that unit's reduced gradient once a step to
      // sum the two copies (the kept stage sums its full buffers). Everything else the ranks
      // send is the same in both.
      int64_t extra_calls = 0, extra_bytes = 0;
      for (size_t u = 0; u < got.layout.units.size(); ++u) {
        const int whole = got.held_units[u];
        const bool embedding = whole == 0, head = whole == job.model().n_layer() + 1;
        const int64_t training = m * (2 - embedding - head) - 1;
        const int64_t evaluation = val_batches - 1;
        const int64_t calls = steps * training + evals * evaluation;
        const int64_t gather = GatherBytes(got.layout.units[u].numel, g, element);
        extra_calls += calls;
        extra_bytes += calls * gather;
        if (tied && (embedding || head)) {
          extra_calls += steps;
          extra_bytes += steps * gather;  // gradients in the parameters' dtype here
        }
      }
      EXPECT_EQ(got.comm[CommKind::kAllGather].calls - want.comm[CommKind::kAllGather].calls,
                extra_calls)
          << rank;
      EXPECT_EQ(
          got.comm[CommKind::kAllGather].bytes_sent - want.comm[CommKind::kAllGather].bytes_sent,
          extra_bytes)
          << rank;

      // The plan: prefetch_units + 1 buffers of the stage's largest unit instead of one per
      // unit, and two gradient slots of the largest unit instead of every unit's accumulated
      // gradient; the arenas' high-water mark (off_plan above).
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
      EXPECT_EQ(kept_plan.CategoryBytes(MemoryCategory::kParameters) -
                    per_use_plan.CategoryBytes(MemoryCategory::kParameters),
                GatheredUnitBytes(kept_plan) - GatheredUnitBytes(per_use_plan))
          << rank;
      const int64_t slots = 2 * AlignedBytes(largest * element);
      EXPECT_LT(slots, every_unit) << rank;
      EXPECT_EQ(kept_plan.CategoryBytes(MemoryCategory::kGradients) -
                    per_use_plan.CategoryBytes(MemoryCategory::kGradients),
                every_unit - slots)
          << rank;
      for (const BufferSpec& b : per_use_plan.buffers) {
        EXPECT_FALSE(b.name.ends_with(".grad_accum")) << rank << ": " << b.name;
      }
    }
    if (c.against_one_rank) {
      // And one rank reading the same global batch, to fp32 reduction noise
      // (testing::ExpectSamePipelineTraining's bounds): each stage's two DP shards joined.
      const PipelineOutcome one = testing::RunPipelineRanks(OneRank(c.llama, 2), 10);
      testing::JoinDataParallelShards(per_use);
      testing::ExpectSamePipelineTraining(per_use, one, what);
    }
  }
}

// With one micro-batch a step (GPipe allows it) a stage trains at ZeRO 2, and at 3 per use or
// keeping its units gathered: there is nothing to accumulate, so each unit's one backward is
// reduce-scattered as it ends (StageGradientsPerMicroBatch), as off a pipeline; no stage holds a
// full gradient per unit. PP2 × DP2 against one rank, to fp32 noise (ExpectSamePipelineTraining's
// bounds: the stages sum the norm's squares and the ranks the gradients in another order). Where
// the order of the sums is the same the runs are equal bit for bit: ZeRO 3 keeping the units
// gathered is ZeRO 3 per use (the same gathered values, the same reductions), and untied Llama
// at ZeRO 2 is ZeRO 1 (the same reduce-scatter of the same gradient, after the backward instead
// of as it ends; a tied GPT-2 sums its two wte copies before ZeRO 1's reduction, after ZeRO 2's).
TEST_F(PipelineReshardTest, OneMicroBatchTrainsAgainstOneRank) {
  for (const bool llama : {false, true}) {
    JobSpec one = OneRank(llama, 2);
    one.mutable_train()->set_grad_accum_steps(1);
    const PipelineOutcome reference = testing::RunPipelineRanks(one, 10);
    auto run = [&](int stage, bool reshard) {
      JobSpec job = Job(llama, 1, 2, 2, ParallelConfig::GPIPE, reshard);
      job.mutable_parallel()->set_zero_stage(stage);
      job.mutable_train()->set_grad_accum_steps(1);
      return testing::RunPipelineRanks(job, 10);
    };
    struct Case {
      int stage;
      bool reshard;
    };
    std::vector<PipelineOutcome> runs;
    for (const Case c : {Case{3, true}, Case{3, false}, Case{2, true}}) {
      const std::string what = absl::StrCat(llama ? "llama" : "gpt2", " m = 1, zero ", c.stage,
                                            c.reshard ? "" : " kept gathered");
      PipelineOutcome got = run(c.stage, c.reshard);
      ASSERT_TRUE(got.status.ok()) << what << ": " << got.status;
      for (size_t r = 0; r < got.ranks.size(); ++r) {
        // One reduce-scatter per unit a step.
        EXPECT_EQ(got.ranks[r].comm[CommKind::kReduceScatter].calls,
                  10 * static_cast<int64_t>(got.ranks[r].layout.units.size()))
            << what << ", rank " << r;
      }
      testing::JoinDataParallelShards(got);
      testing::ExpectSamePipelineTraining(got, reference, what);
      runs.push_back(std::move(got));
    }
    const std::string what = llama ? "llama m = 1" : "gpt2 m = 1";
    for (size_t r = 0; r < runs[0].ranks.size(); ++r) {
      EXPECT_EQ(runs[1].ranks[r].losses, runs[0].ranks[r].losses) << what << ", rank " << r;
      EXPECT_EQ(runs[1].ranks[r].grad_norms, runs[0].ranks[r].grad_norms) << what << ", rank " << r;
      EXPECT_TRUE(runs[1].ranks[r].whole == runs[0].ranks[r].whole) << what << ", rank " << r;
    }
    if (llama) {
      PipelineOutcome zero1 = run(1, true);
      ASSERT_TRUE(zero1.status.ok()) << what << ": " << zero1.status;
      for (size_t r = 0; r < runs[2].ranks.size(); ++r) {
        EXPECT_EQ(runs[2].ranks[r].losses, zero1.ranks[r].losses) << what << ", rank " << r;
        EXPECT_EQ(runs[2].ranks[r].grad_norms, zero1.ranks[r].grad_norms) << what << ", rank " << r;
        EXPECT_TRUE(runs[2].ranks[r].whole == zero1.ranks[r].whole) << what << ", rank " << r;
      }
    }
  }
}

// Hybrid sharding on stages (PP2 × DP4, shard groups of 2 replicated twice): each micro-batch's
// reduce-scatter runs in the shard group and the accumulated shard is all-reduced across the
// replicas once, after the schedule — so the replicas' sum is taken once a step, not once a
// micro-batch, and the tied wte's copies are summed on the group's shards before it. GPT-2
// (tied) against one rank reading the same global batch (4 sequences a micro-batch), to fp32
// noise: the losses, norms and the exported model (ExpectSamePipelineTraining's bounds).
TEST_F(PipelineReshardTest, HybridShardedStagesReduceInTheGroupThenOnceAcrossReplicas) {
  JobSpec job = Job(/*llama=*/false, 1, 2, 4, ParallelConfig::ONE_F_ONE_B, /*reshard=*/true);
  job.mutable_parallel()->set_shard_group_size(2);
  const PipelineOutcome per_use = testing::RunPipelineRanks(job, 10);
  ASSERT_TRUE(per_use.status.ok()) << per_use.status;
  const PipelineOutcome one = testing::RunPipelineRanks(OneRank(false, 4), 10);
  ASSERT_TRUE(one.status.ok()) << one.status;
  const testing::PipelineRankRun& ref = one.ranks[0];
  const int64_t m = per_use.job.train().grad_accum_steps();
  for (size_t r = 0; r < per_use.ranks.size(); ++r) {
    const testing::PipelineRankRun& got = per_use.ranks[r];
    const std::string rank = absl::StrCat("pp2 x dp4 hybrid, rank ", r);
    EXPECT_TRUE(got.unclaimed.empty()) << rank << ": unused plan buffer " << got.unclaimed[0];
    EXPECT_TRUE(got.off_plan.empty()) << rank << ": " << got.off_plan[0];
    ASSERT_EQ(got.losses.size(), ref.losses.size()) << rank;
    for (size_t s = 0; s < ref.losses.size(); ++s) {
      EXPECT_NEAR(got.losses[s], ref.losses[s], 1e-6 * ref.losses[s]) << rank << " step " << s + 1;
      EXPECT_NEAR(got.grad_norms[s], ref.grad_norms[s], 2e-5 * ref.grad_norms[s])
          << rank << " gradient norm, step " << s + 1;
    }
    const int64_t units = static_cast<int64_t>(got.layout.units.size());
    EXPECT_EQ(got.comm[CommKind::kReduceScatter].calls, 10 * m * units) << rank;
    // All-reduces: each unit's shard across the replicas once a step, and the tied wte's sum
    // (both stages hold a copy at p = 2) once a step.
    EXPECT_EQ(got.comm[CommKind::kAllReduce].calls, 10 * (units + 1)) << rank;
  }
  testing::ExpectSameWholeWeights(per_use, one, "pp2 x dp4 hybrid", 1e-4, 1e-4);
}

}  // namespace
}  // namespace zt
