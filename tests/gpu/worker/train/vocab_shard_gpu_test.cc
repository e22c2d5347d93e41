// The tied embedding split by vocabulary rows at ZeRO-3 (docs/memory.md, "The tied embedding at
// ZeRO-3") on CUDA ranks: two ranks sharing the GPU (threads; their collectives staged through
// the host) train the same job as two CPU ranks, in fp32 with TF32 off and in bf16. Every op
// of the split runs on the GPU here (the vocabulary-row lookup and its backward, the head's
// GEMMs over the rank's columns, the three passes of the parallel cross-entropy;
// kernels/cuda/tensor_parallel.h), on the plan's vocab.* buffers, between the shard group's
// collectives. tests/unit/worker/trainer/vocab_shard_separate_memory_test.cc checks on the CPU
// that nothing of it reads or hands over memory from the wrong side.
//
// The model is gpu_train_runs.h's (head size 64, vocabulary 32, T 32), GPT-2 style (tied wte,
// learned positions); its embedding (64 rows) is smaller than the group's token rows, so the
// split is asked for. Jobs are validated as CPU jobs, then moved to CUDA.
#if ZT_HAVE_CUDA

#include <filesystem>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/worker/train/gpu_train_runs.h"
#include "tests/unit/worker/trainer/pattern_corpus.h"
#include "worker/data/token_shard.h"
#include "worker/job/job_loading.h"
#include "worker/parallel/parallel_layout.h"

namespace zt {
namespace {

using gpu_test::MaxAbsDiff;
using gpu_test::RelativeL2;
using gpu_test::RunResult;
using gpu_test::TrainRanks;
using zerotrain::JobSpec;
using zerotrain::PrecisionConfig;
using zerotrain::ResourceConfig;

class VocabShardGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (gpu_test::SkipReason()) return;
    dir_ = testing::TestScratchDir("zt-vocab-gpu-test");
    ASSERT_TRUE(WriteTokenShard((dir_ / "train.bin").string(), testing::PatternTokens(), 32).ok());
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  JobSpec Job(ResourceConfig::DeviceKind device, bool bf16) const {
    JobSpec job = gpu_test::GpuTestJob("vocab-gpu", (dir_ / "train.bin").string());
    job.mutable_train()->set_micro_batch_size(2);
    job.mutable_train()->set_max_steps(20);
    job.mutable_parallel()->set_world_size(2);
    job.mutable_parallel()->set_zero_stage(3);
    job.mutable_parallel()->set_vocab_sharded_embedding(true);
    if (bf16) {
      job.mutable_precision()->set_param_dtype(PrecisionConfig::BF16);
      job.mutable_precision()->set_compute_dtype(PrecisionConfig::BF16);
      job.mutable_precision()->set_grad_dtype(PrecisionConfig::BF16);
    }
    JobSpec valid = ValidatedJob(job).value();
    valid.mutable_resources()->set_device(device);
    EXPECT_TRUE(VocabularyShardedEmbedding(valid));
    return valid;
  }

  std::filesystem::path dir_;
};

TEST_F(VocabShardGpuTest, TwoCudaRanksMatchTwoCpuRanksInF32) {
  ZT_SKIP_WITHOUT_GPU();
  // One step: every GPU op is its CPU twin up to the order of its f32 sums (~1e-7 relative an
  // op) and the collectives are the same staged sums: loss and gradient norm within 1e-5
  // relative (100× the noise, far below the O(1) of a wrong row owner or a lost partial), the
  // weights of one Adam step (update ±lr for nearly every weight) within 1e-6 absolute.
  const RunResult cpu1 = TrainRanks(Job(ResourceConfig::CPU, false), 1);
  const RunResult gpu1 = TrainRanks(Job(ResourceConfig::CUDA, false), 1);
  ASSERT_EQ(gpu1.losses.size(), 1u);
  ASSERT_EQ(cpu1.losses.size(), 1u);
  EXPECT_NEAR(gpu1.losses[0], cpu1.losses[0], 1e-5 * cpu1.losses[0]);
  EXPECT_NEAR(gpu1.grad_norms[0], cpu1.grad_norms[0], 1e-5 * cpu1.grad_norms[0]);
  for (int r = 0; r < 2; ++r) {
    EXPECT_LT(MaxAbsDiff(gpu1.all_weights[r], cpu1.weights), 1e-6) << "rank " << r;
  }
  // 20 steps: Adam amplifies the reordering noise of gradients near zero, so the runs drift
  // slowly apart as one GPU rank does from one CPU rank (trainer_gpu_test.cc): 1e-4 relative
  // on the losses and the weights' L2, 100× the drift and 30× below one wrong update.
  const RunResult cpu = TrainRanks(Job(ResourceConfig::CPU, false), 20);
  const RunResult gpu = TrainRanks(Job(ResourceConfig::CUDA, false), 20);
  ASSERT_EQ(gpu.losses.size(), 20u);
  ASSERT_EQ(cpu.losses.size(), 20u);
  EXPECT_LT(gpu.losses.back(), gpu.losses.front() - 0.5) << "the model learns on the GPU";
  for (size_t s = 0; s < 20; ++s) {
    EXPECT_NEAR(gpu.losses[s], cpu.losses[s], 1e-4 * cpu.losses[s]) << "step " << s + 1;
  }
  EXPECT_LT(RelativeL2(gpu.weights, cpu.weights), 1e-4);
  EXPECT_EQ(gpu.all_weights[1], gpu.weights) << "both ranks join the same whole model";
}

TEST_F(VocabShardGpuTest, TwoCudaRanksMatchTwoCpuRanksInBf16) {
  ZT_SKIP_WITHOUT_GPU();
  // bf16 storage, f32 compute rounded once per op on both (the head's input-gradient partials
  // in f32, summed and rounded once): they differ where an f32 value whose last bits differ
  // (sum order) rounds to the other side of a bf16 boundary, one ulp = 2⁻⁸ of that value. As
  // trainer_gpu_test.cc's bf16 run: 2e-2 relative on the losses over 20 steps (a few ulps of
  // drift, well below the loss's fall), 1e-2 relative L2 on the f32 masters.
  const RunResult cpu = TrainRanks(Job(ResourceConfig::CPU, true), 20);
  const RunResult gpu = TrainRanks(Job(ResourceConfig::CUDA, true), 20);
  ASSERT_EQ(gpu.losses.size(), 20u);
  ASSERT_EQ(cpu.losses.size(), 20u);
  for (size_t s = 0; s < 20; ++s) {
    EXPECT_NEAR(gpu.losses[s], cpu.losses[s], 2e-2 * cpu.losses[s]) << "step " << s + 1;
  }
  EXPECT_LT(RelativeL2(gpu.weights, cpu.weights), 1e-2);
  EXPECT_LT(gpu.losses.back(), gpu.losses.front() - 0.5) << "the model learns in bf16";
  EXPECT_EQ(gpu.all_weights[1], gpu.weights) << "both ranks join the same whole model";
}

}  // namespace
}  // namespace zt

#endif  // ZT_HAVE_CUDA
