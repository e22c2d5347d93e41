// Adafactor on tensor-parallel ranks whose memory is their own (separate_memory_device.h):
// arenas and context on cpu:1, host buffers on cpu:0, communicators staged through a copy
// engine, as a CUDA rank's are. Without optimizer offload the step runs on the device: a split
// tensor's factored statistics (the column sums of a column-parallel weight, the row sums of
// a row-parallel one, Σ param², Σ R_i, Σ U²; a replicated KV head's rows counted once,
// worker/optim/adafactor_splits.h) are summed over the tensor-parallel group in the plan's
// device scratch through the rank's device communicator. Any of them handed over as host
// memory fails the run by name; through it the run is the plain CPU ranks' bit for bit.
// tests/gpu/kernels/adafactor_test.cc checks the CUDA kernel's tensor-parallel path against
// the CPU op.
#include <filesystem>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/worker/trainer/pattern_corpus.h"
#include "tests/unit/worker/trainer/pipeline_runs.h"
#include "tests/unit/worker/trainer/small_sharded_job.h"
#include "worker/data/token_shard.h"

namespace zt {
namespace {

using zerotrain::JobSpec;
using zerotrain::PrecisionConfig;

using Outcome = testing::PipelineOutcome;

class TensorParallelAdafactorSeparateMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TestScratchDir("zt-tp-adafactor-separate-test");
    ASSERT_TRUE(WriteTokenShard((dir_ / "train.bin").string(), testing::PatternTokens(), 32).ok());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // tp × dp ranks at `stage`, Adafactor with a first moment (so m is stepped too).
  JobSpec Job(int tp, int dp, int stage, bool llama) {
    JobSpec job =
        testing::SmallShardedJob((dir_ / "train.bin").string(), tp * dp, stage, /*micro_batch=*/2);
    job.mutable_parallel()->set_tensor_parallel(tp);
    job.mutable_train()->set_max_steps(6);
    if (llama) testing::MakeSmallGqaLlama(job);
    job.mutable_optimizer()->set_type(zerotrain::OptimizerConfig::ADAFACTOR);
    job.mutable_optimizer()->mutable_adafactor()->set_beta1(0.9f);
    // An explicit step, scaled by RMS(param) (whose Σ param² the group sums): large enough
    // that 6 steps lower the loss, which relative_step's 1e-2 · RMS(param) does not.
    job.mutable_optimizer()->mutable_adafactor()->set_relative_step(false);
    job.mutable_optimizer()->set_lr(0.3f);
    return job;
  }

  std::filesystem::path dir_;
};

TEST_F(TensorParallelAdafactorSeparateMemoryTest, SplitStatisticsSumOnTheDeviceBitForBit) {
  struct Case {
    std::string name;
    JobSpec job;
  };
  // GPT-2 (column- and row-parallel weights, split biases, the vocabulary-parallel tied wte);
  // Llama with its 2 KV heads split (t = 2) and replicated (t = 4: each head's K and V rows
  // counted by one of its two ranks); TP2 × DP2 at ZeRO-2, where the shard group's sums come
  // first; and bf16 gradients with f32 master weights.
  std::vector<Case> cases = {{"gpt2 tp2", Job(2, 1, 0, false)},
                             {"llama tp2", Job(2, 1, 0, true)},
                             {"llama tp4, replicated kv heads", Job(4, 1, 0, true)},
                             {"gpt2 tp2 x dp2 zero-2", Job(2, 2, 2, false)}};
  JobSpec bf16 = Job(2, 1, 0, true);
  bf16.mutable_precision()->set_param_dtype(PrecisionConfig::BF16);
  bf16.mutable_precision()->set_compute_dtype(PrecisionConfig::BF16);
  bf16.mutable_precision()->set_grad_dtype(PrecisionConfig::BF16);
  cases.push_back({"llama tp2 bf16", bf16});
  for (const Case& c : cases) {
    const Outcome separate = testing::RunPipelineRanks(c.job, 6, "", /*separate_memory=*/true);
    const Outcome plain = testing::RunPipelineRanks(c.job, 6);
    ASSERT_TRUE(separate.status.ok()) << c.name << ": " << separate.status;
    ASSERT_TRUE(plain.status.ok()) << c.name << ": " << plain.status;
    EXPECT_LT(plain.ranks[0].losses.back(), plain.ranks[0].losses.front()) << c.name;
    for (size_t r = 0; r < plain.ranks.size(); ++r) {
      EXPECT_EQ(separate.ranks[r].losses, plain.ranks[r].losses) << c.name << " rank " << r;
      EXPECT_EQ(separate.ranks[r].grad_norms, plain.ranks[r].grad_norms) << c.name << " rank " << r;
      EXPECT_EQ(separate.ranks[r].whole, plain.ranks[r].whole) << c.name << " rank " << r;
      EXPECT_TRUE(separate.ranks[r].off_plan.empty())
          << c.name << " rank " << r << ": " << separate.ranks[r].off_plan[0];
    }
  }
}

}  // namespace
}  // namespace zt
