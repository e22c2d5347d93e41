// Adafactor on pipeline stages: its factored second moments are per tensor, and a stage holds
// each of its tensors whole (with tensor-parallel stages, the logical matrix's statistics
// summed over the TP group, as tensor parallelism alone sums them). PP2 under 1F1B and
// interleaved, GPT-2 (tied: the head stage's copy of wte gets the same summed gradient and
// so the same statistics and update as wte) and Llama (GQA, untied), and TP2 × PP2, each
// against one rank over 10 steps.
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
using testing::PipelineOutcome;

class PipelineAdafactorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TestScratchDir("zt-pp-adafactor-test");
    ASSERT_TRUE(WriteTokenShard((dir_ / "train.bin").string(), testing::PatternTokens(), 32).ok());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // tp × pp ranks, m = 4 micro-batches of one sequence, 4 blocks, Adafactor with Hugging
  // Face's defaults (relative step) and beta1 0.9.
  JobSpec Model(bool llama, int tp, int pp, ParallelConfig::PipelineSchedule schedule) {
    JobSpec job = testing::SmallShardedJob((dir_ / "train.bin").string(), tp * pp, 0, 1,
                                           /*accum=*/4);
    if (llama) testing::MakeSmallGqaLlama(job);
    job.mutable_model()->set_n_layer(4);
    job.mutable_parallel()->set_tensor_parallel(tp);
    job.mutable_parallel()->set_pipeline_parallel(pp);
    job.mutable_parallel()->set_pipeline_schedule(schedule);
    if (schedule == ParallelConfig::INTERLEAVED) job.mutable_parallel()->set_virtual_stages(2);
    job.mutable_train()->set_max_steps(10);
    job.mutable_optimizer()->set_type(zerotrain::OptimizerConfig::ADAFACTOR);
    job.mutable_optimizer()->mutable_adafactor()->set_beta1(0.9f);
    return job;
  }

  std::filesystem::path dir_;
};

// Losses, gradient norms, the stages' and the whole weights against one rank at
// ExpectSamePipelineTraining's f32 bounds (1e-6 in the loss, 2e-5 in the norm, 1e-4 a weight:
// the stages run one rank's ops, summing in another order only the tied copies' gradients and
// the norm), and the whole weights' root mean square difference to 1e-5. Adafactor's relative
// step moves these weights by ~2e-4 a step, too little for the learning check, so there is
// none (as AdafactorOnTwoRanksMatchesOneRank); a stage stepping a tensor with another's
// statistics, or the tied copy apart from wte, moves weights by ~2e-4 a step, above the bound
// within the 10 steps.
void ExpectSameAdafactorTraining(const PipelineOutcome& got, const PipelineOutcome& want,
                                 const std::string& what) {
  testing::ExpectSamePipelineTraining(got, want, what, 1e-4, /*expect_learning=*/false);
  testing::ExpectSameWholeWeights(got, want, what, 1e-4, 1e-5);
}

TEST_F(PipelineAdafactorTest, AdafactorOnStagesMatchesOneRank) {
  for (const bool llama : {false, true}) {
    const std::string name = llama ? "llama" : "gpt2";
    const PipelineOutcome reference =
        testing::RunPipelineRanks(Model(llama, 1, 1, ParallelConfig::ONE_F_ONE_B), 10);
    for (auto schedule : {ParallelConfig::ONE_F_ONE_B, ParallelConfig::INTERLEAVED}) {
      ExpectSameAdafactorTraining(
          testing::RunPipelineRanks(Model(llama, 1, 2, schedule), 10), reference,
          absl::StrCat(name, " adafactor pp 2 ", ParallelConfig::PipelineSchedule_Name(schedule)));
    }
    // Tensor-parallel stages: a split tensor's statistics summed over the TP group as tensor
    // parallelism alone sums them, each stage's tensor split as the whole model's tensor is
    // (AdafactorSplits of the stage's held units; the head stage's tied wte copy as wte: split
    // by vocabulary, its column statistics summed). Llama's 2 KV heads split over 2 TP ranks;
    // replicated heads stay refused. (With the splits read at the stage's own unit indices,
    // the runs parted from one rank by 3e-5 in the loss within 10 steps.)
    ExpectSameAdafactorTraining(
        testing::RunPipelineRanks(Model(llama, 2, 2, ParallelConfig::ONE_F_ONE_B), 10),
        reference, name + " adafactor tp2 x pp2");
  }
}

}  // namespace
}  // namespace zt
