// The tied embedding split by vocabulary rows at ZeRO-3 (docs/memory.md, "The tied embedding
// at ZeRO-3") on devices whose memory is their own (separate_memory_device.h): arenas and
// context on cpu:1, host buffers on cpu:0, communicators staged through a copy engine, as a
// CUDA rank's are. The split's lookup, head, parallel cross-entropy and backward then run on
// the device's own buffers (the plan's vocab.* workspace) and every one of its collectives
// goes through the rank's device communicator; any host read of device memory, or host
// memory handed to a device op or a collective, fails the run by name. Through it the run is
// the plain CPU ranks' bit for bit: the same ops on the same values, the staged collectives
// summing as Gloo does. tests/gpu/worker/train/vocab_shard_gpu_test.cc runs it on a GPU.
#include <filesystem>
#include <string>

#include "gtest/gtest.h"
#include "tests/unit/worker/trainer/document_corpus.h"
#include "tests/unit/worker/trainer/pattern_corpus.h"
#include "tests/unit/worker/trainer/pipeline_runs.h"
#include "tests/unit/worker/trainer/small_sharded_job.h"
#include "worker/data/token_shard.h"
#include "worker/job/job_loading.h"
#include "worker/parallel/parallel_layout.h"

namespace zt {
namespace {

using zerotrain::JobSpec;
using zerotrain::PrecisionConfig;

using Outcome = testing::PipelineOutcome;

class VocabShardSeparateMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TestScratchDir("zt-vocab-separate-test");
    ASSERT_TRUE(WriteTokenShard((dir_ / "train.bin").string(), testing::PatternTokens(), 32).ok());
    testing::WriteDocumentShard((dir_ / "documents.bin").string(), 14);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // GPT-2 (tied wte, learned positions) at ZeRO-3 on `world` ranks, the embedding split by
  // vocabulary rows (asked: this model's 48 rows are fewer than the group's token rows, so
  // unset it would be gathered), `accum` micro-batches of `micro_batch` sequences a step.
  JobSpec Job(int world, int micro_batch, int accum, bool bf16) {
    JobSpec job = testing::SmallShardedJob((dir_ / "train.bin").string(), world,
                                           /*stage=*/world > 1 ? 3 : 0, micro_batch, accum);
    if (world > 1) job.mutable_parallel()->set_vocab_sharded_embedding(true);
    if (bf16) {
      job.mutable_precision()->set_param_dtype(PrecisionConfig::BF16);
      job.mutable_precision()->set_compute_dtype(PrecisionConfig::BF16);
      job.mutable_precision()->set_grad_dtype(PrecisionConfig::BF16);
    }
    return job;
  }

  std::filesystem::path dir_;
};

TEST_F(VocabShardSeparateMemoryTest, SplitEmbeddingTrainsThroughTheCopyEngineBitForBit) {
  struct Case {
    std::string name;
    JobSpec job;
  };
  std::vector<Case> cases = {{"f32", Job(2, 2, 1, false)},
                             {"bf16, accumulation 2", Job(2, 2, 2, true)}};
  // Evaluation runs the split head without gradients.
  JobSpec evaluated = Job(2, 2, 1, false);
  evaluated.mutable_data()->add_val(evaluated.data().train(0));
  evaluated.mutable_train()->set_eval_steps(2);
  evaluated.mutable_train()->set_eval_interval(2);
  cases.push_back({"evaluation", evaluated});
  // Packed documents: the lookup's positions restart at each document, gathered over the group
  // from the micro-batch's uploaded positions (batch.positions), which the host cannot read.
  JobSpec packed = Job(2, 2, 1, false);
  packed.mutable_data()->set_train(0, (dir_ / "documents.bin").string());
  packed.mutable_data()->set_packing(true);
  cases.push_back({"packed", packed});
  for (const Case& c : cases) {
    ASSERT_TRUE(VocabularyShardedEmbedding(ValidatedJob(c.job).value())) << c.name;
    const Outcome separate = testing::RunPipelineRanks(c.job, 6, "", /*separate_memory=*/true);
    const Outcome plain = testing::RunPipelineRanks(c.job, 6);
    ASSERT_TRUE(separate.status.ok()) << c.name << ": " << separate.status;
    ASSERT_TRUE(plain.status.ok()) << c.name << ": " << plain.status;
    ASSERT_EQ(plain.ranks.size(), 2u) << c.name;
    EXPECT_LT(plain.ranks[0].losses.back(), plain.ranks[0].losses.front()) << c.name;
    for (size_t r = 0; r < plain.ranks.size(); ++r) {
      EXPECT_EQ(separate.ranks[r].losses, plain.ranks[r].losses) << c.name << " rank " << r;
      EXPECT_EQ(separate.ranks[r].grad_norms, plain.ranks[r].grad_norms) << c.name << " rank " << r;
      EXPECT_EQ(separate.ranks[r].val_losses, plain.ranks[r].val_losses) << c.name << " rank " << r;
      EXPECT_EQ(separate.ranks[r].whole, plain.ranks[r].whole) << c.name << " rank " << r;
      // The split's buffers are the plan's, every one used, and the arenas hold the plan.
      EXPECT_TRUE(separate.ranks[r].off_plan.empty())
          << c.name << " rank " << r << ": " << separate.ranks[r].off_plan[0];
      EXPECT_TRUE(separate.ranks[r].unclaimed.empty())
          << c.name << " rank " << r << ": " << separate.ranks[r].unclaimed[0];
    }
  }
}

}  // namespace
}  // namespace zt
