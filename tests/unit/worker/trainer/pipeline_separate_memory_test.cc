// Pipeline stages on devices whose memory is their own (separate_memory_device.h): arenas and
// context on cpu:1, host buffers on cpu:0, communicators staged through a copy engine, as a GPU
// rank's are. Each schedule and layout trains through it bit for bit as on the plain CPU
// device — the same ops on the same values, the staged collectives summing as Gloo does — so
// nothing of the pipeline (the activations and gradients sent between stages, the step's
// statistics, the tied embedding's sum between the first and last stage, the evaluation, the
// checkpoints) reaches device memory from the host or host memory from a device op or a
// collective except through the rank's copy engine: the pipeline's part of running on CUDA
// ranks, checked on the CPU. tests/gpu/worker/train/pipeline_gpu_test.cc runs the same on a
// GPU.
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/trainer/pattern_corpus.h"
#include "tests/unit/worker/trainer/pipeline_runs.h"
#include "tests/unit/worker/trainer/small_sharded_job.h"
#include "worker/data/token_shard.h"

namespace zt {
namespace {

using zerotrain::JobSpec;
using zerotrain::ParallelConfig;
using zerotrain::PrecisionConfig;

using Outcome = testing::PipelineOutcome;

class PipelineSeparateMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TestScratchDir("zt-pp-separate-test");
    ASSERT_TRUE(WriteTokenShard((dir_ / "train.bin").string(), testing::PatternTokens(), 32).ok());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // pp stages × dp replicas at `stage`, m = 4 micro-batches of one sequence a step.
  JobSpec Job(int pp, int dp, int stage, ParallelConfig::PipelineSchedule s) {
    JobSpec job = testing::SmallShardedJob((dir_ / "train.bin").string(), pp * dp, stage,
                                           /*micro_batch=*/1, /*accum=*/4);
    job.mutable_parallel()->set_pipeline_parallel(pp);
    job.mutable_parallel()->set_pipeline_schedule(s);
    job.mutable_train()->set_max_steps(4);
    return job;
  }

  std::filesystem::path dir_;
};

// Losses, gradient norms and every rank's final weights, bit for bit.
void ExpectSameRun(const Outcome& got, const Outcome& want, const std::string& what) {
  ASSERT_TRUE(got.status.ok()) << what << ": " << got.status;
  ASSERT_TRUE(want.status.ok()) << what << ": " << want.status;
  ASSERT_EQ(got.ranks.size(), want.ranks.size()) << what;
  for (size_t r = 0; r < want.ranks.size(); ++r) {
    EXPECT_EQ(got.ranks[r].losses, want.ranks[r].losses) << what << " rank " << r;
    EXPECT_EQ(got.ranks[r].grad_norms, want.ranks[r].grad_norms) << what << " rank " << r;
    EXPECT_EQ(got.ranks[r].val_losses, want.ranks[r].val_losses) << what << " rank " << r;
    EXPECT_EQ(got.ranks[r].whole, want.ranks[r].whole) << what << " rank " << r;
    EXPECT_TRUE(got.ranks[r].off_plan.empty())
        << what << " rank " << r << ": " << got.ranks[r].off_plan[0];
  }
}

TEST_F(PipelineSeparateMemoryTest, EveryScheduleAndLayoutTrainsThroughTheCopyEngineBitForBit) {
  struct Case {
    std::string name;
    JobSpec job;
  };
  std::vector<Case> cases;
  for (const auto schedule : {ParallelConfig::GPIPE, ParallelConfig::ONE_F_ONE_B}) {
    cases.push_back({ParallelConfig::PipelineSchedule_Name(schedule), Job(2, 1, 0, schedule)});
  }
  JobSpec interleaved = Job(2, 1, 0, ParallelConfig::INTERLEAVED);
  interleaved.mutable_parallel()->set_virtual_stages(2);
  interleaved.mutable_model()->set_n_layer(4);
  cases.push_back({"interleaved", interleaved});
  JobSpec llama = Job(2, 1, 0, ParallelConfig::ONE_F_ONE_B);
  testing::MakeSmallGqaLlama(llama);
  cases.push_back({"llama", llama});
  for (const int stage : {1, 3}) {
    cases.push_back({stage == 1 ? "pp2 x dp2 zero-1" : "pp2 x dp2 zero-3",
                     Job(2, 2, stage, ParallelConfig::ONE_F_ONE_B)});
  }
  JobSpec bf16 = Job(2, 1, 0, ParallelConfig::ONE_F_ONE_B);
  bf16.mutable_precision()->set_param_dtype(PrecisionConfig::BF16);
  bf16.mutable_precision()->set_compute_dtype(PrecisionConfig::BF16);
  bf16.mutable_precision()->set_grad_dtype(PrecisionConfig::BF16);
  cases.push_back({"bf16", bf16});
  JobSpec evaluated = Job(2, 1, 0, ParallelConfig::ONE_F_ONE_B);
  evaluated.mutable_data()->add_val(evaluated.data().train(0));
  evaluated.mutable_train()->set_eval_steps(2);
  evaluated.mutable_train()->set_eval_interval(2);
  cases.push_back({"evaluation", evaluated});
  for (const Case& c : cases) {
    const Outcome separate = testing::RunPipelineRanks(c.job, 4, "", /*separate_memory=*/true);
    const Outcome plain = testing::RunPipelineRanks(c.job, 4);
    ExpectSameRun(separate, plain, c.name);
  }
}

TEST_F(PipelineSeparateMemoryTest, CheckpointsWrittenThroughTheCopyEngineResumeBitForBit) {
  JobSpec job = Job(2, 2, 1, ParallelConfig::ONE_F_ONE_B);
  job.mutable_checkpoint()->set_dir((dir_ / "ckpt").string());
  job.mutable_checkpoint()->set_interval_steps(2);
  // A device's state is written from the plan's page-locked staging (on CUDA always; here
  // the plan is a CPU job's, which holds it for asynchronous saves).
  job.mutable_checkpoint()->set_async(true);
  const Outcome straight = testing::RunPipelineRanks(job, 4, "", /*separate_memory=*/true);
  ASSERT_TRUE(straight.status.ok()) << straight.status;
  JobSpec stopped = job;
  stopped.mutable_checkpoint()->set_dir((dir_ / "stopped").string());
  ASSERT_TRUE(testing::RunPipelineRanks(stopped, 2, "", true).status.ok());
  const Outcome second =
      testing::RunPipelineRanks(stopped, 4, stopped.checkpoint().dir(), /*separate_memory=*/true);
  ASSERT_TRUE(second.status.ok()) << second.status;
  for (size_t r = 0; r < straight.ranks.size(); ++r) {
    ASSERT_EQ(second.ranks[r].losses.size(), 2u) << "rank " << r;
    EXPECT_EQ(second.ranks[r].losses[0], straight.ranks[r].losses[2]) << "rank " << r;
    EXPECT_EQ(second.ranks[r].losses[1], straight.ranks[r].losses[3]) << "rank " << r;
    EXPECT_EQ(second.ranks[r].whole, straight.ranks[r].whole) << "rank " << r;
  }
}

}  // namespace
}  // namespace zt
