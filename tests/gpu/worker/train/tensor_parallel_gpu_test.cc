// Tensor parallelism (and sequence parallelism) on CUDA ranks: two ranks sharing the GPU
// (threads; their collectives staged through the host, as trainer_gpu_test.cc's ZeRO ranks)
// train the same job as two CPU ranks, in fp32 with TF32 off: one step and 20 steps, the
// losses, gradient norms and the whole model joined from the shares (FullWeights, what export
// writes) on every rank. Every tensor-parallel local op runs on the GPU here (the vocabulary-
// parallel embedding and its backward, the three cross-entropy passes, the row-parallel bias;
// kernels/cuda/tensor_parallel.h), between the model's collectives.
//
// The model has head size 64 (the CUDA attention kernels take D = 64 and 128): GPT-2 style
// (tied embedding, learned positions, biases), 2 layers, d_model 256, 4 heads (2 a rank), on
// the pattern corpus of the CPU tests; with sequence parallelism a vocabulary of 33, which two
// ranks split into 17 columns each, the last ending in a padding column. Jobs are validated
// as CPU jobs, then moved to CUDA, as trainer_gpu_test.cc's.
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

namespace zt {
namespace {

using gpu_test::MaxAbsDiff;
using gpu_test::RelativeL2;
using gpu_test::RunResult;
using gpu_test::TrainRanks;
using zerotrain::JobSpec;
using zerotrain::ResourceConfig;

class TensorParallelGpuTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (gpu_test::SkipReason()) return;
    dir_ = testing::TestScratchDir("zt-tp-gpu-test");
    ASSERT_TRUE(WriteTokenShard((dir_ / "train.bin").string(), testing::PatternTokens(), 32).ok());
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  JobSpec Job(ResourceConfig::DeviceKind device, bool sequence_parallel) const {
    JobSpec job = gpu_test::GpuTestJob("tp-gpu", (dir_ / "train.bin").string());
    auto* m = job.mutable_model();
    m->set_n_head(4);
    m->set_d_model(256);  // head size 64
    m->set_vocab_size(sequence_parallel ? 33 : 32);
    job.mutable_train()->set_micro_batch_size(4);
    job.mutable_train()->set_max_steps(20);
    job.mutable_parallel()->set_world_size(2);
    job.mutable_parallel()->set_tensor_parallel(2);
    job.mutable_parallel()->set_sequence_parallel(sequence_parallel);
    JobSpec valid = ValidatedJob(job).value();
    valid.mutable_resources()->set_device(device);
    return valid;
  }

  std::filesystem::path dir_;
};

TEST_P(TensorParallelGpuTest, TwoCudaRanksMatchTwoCpuRanks) {
  ZT_SKIP_WITHOUT_GPU();
  const bool sp = GetParam();
  // One step: every GPU op is its CPU twin up to the order of its f32 sums (~1e-7 relative an
  // op, docs/cuda.md) and the collectives are the same staged sums: the loss, a forward of a
  // few ops with K ≤ 1024 sums, within 1e-5 relative (100× the noise, far below the O(1) of a
  // wrong op or a misplaced shard). The weights moved by one Adam step of lr 3e-3 whose update
  // m/√v is ±1 for nearly every weight, so reordered sums change them only through ε and the
  // clipping factor: 1e-6 absolute, three orders below lr.
  const RunResult cpu1 = TrainRanks(Job(ResourceConfig::CPU, sp), 1);
  const RunResult gpu1 = TrainRanks(Job(ResourceConfig::CUDA, sp), 1);
  ASSERT_EQ(gpu1.losses.size(), 1u);
  ASSERT_EQ(cpu1.losses.size(), 1u);
  EXPECT_NEAR(gpu1.losses[0], cpu1.losses[0], 1e-5 * cpu1.losses[0]);
  EXPECT_NEAR(gpu1.grad_norms[0], cpu1.grad_norms[0], 1e-5 * cpu1.grad_norms[0]);
  ASSERT_EQ(cpu1.weights.size(), gpu1.weights.size());
  for (int r = 0; r < 2; ++r) {
    EXPECT_LT(MaxAbsDiff(gpu1.all_weights[r], cpu1.weights), 1e-6) << "rank " << r << "'s whole";
  }

  // 20 steps: Adam amplifies the reordering noise of gradients near zero (m/√v of a tiny
  // gradient is O(1) whatever its last bits), so the runs drift apart slowly, as one GPU rank
  // does from one CPU rank (trainer_gpu_test.cc): 1e-4 relative on the losses and on the
  // weights' L2, 100× the drift and 30× below one wrong update (lr / |w| ≈ 3e-2).
  const RunResult cpu = TrainRanks(Job(ResourceConfig::CPU, sp), 20);
  const RunResult gpu = TrainRanks(Job(ResourceConfig::CUDA, sp), 20);
  ASSERT_EQ(gpu.losses.size(), 20u);
  ASSERT_EQ(cpu.losses.size(), 20u);
  EXPECT_LT(gpu.losses.back(), gpu.losses.front() - 0.5) << "the model learns on the GPU";
  for (size_t s = 0; s < 20; ++s) {
    EXPECT_NEAR(gpu.losses[s], cpu.losses[s], 1e-4 * cpu.losses[s]) << "step " << s + 1;
  }
  EXPECT_LT(RelativeL2(gpu.weights, cpu.weights), 1e-4);
  EXPECT_EQ(gpu.all_weights[1], gpu.weights) << "both ranks join the same whole model";
}

INSTANTIATE_TEST_SUITE_P(All, TensorParallelGpuTest, ::testing::Bool(), [](const auto& info) {
  return info.param ? std::string("sequence_parallel") : std::string("tensor_parallel");
});

}  // namespace
}  // namespace zt

#endif  // ZT_HAVE_CUDA
