// Pipeline parallelism on CUDA ranks sharing one GPU (their collectives, the stages' sends and
// receives included, staged through the host): GPipe, 1F1B and interleaved 1F1B, PP2 × DP2 at
// ZeRO 1 and 3, and TP2 × PP2, each against the same job on CPU ranks. The host-side part of
// running the pipeline on a device whose memory is its own — every activation, gradient,
// statistic and bubble timing crossing through device buffers — runs on the CPU in
// tests/unit/worker/trainer/pipeline_separate_memory_test.cc; these tests add the GPU's
// kernels and streams. Every test skips without a GPU.
#if ZT_HAVE_CUDA

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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
using zerotrain::ParallelConfig;
using zerotrain::ResourceConfig;

struct Layout {
  std::string name;
  int pp, dp, tp, stage;
  ParallelConfig::PipelineSchedule schedule;
};

class PipelineGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (gpu_test::SkipReason()) return;
    dir_ = testing::TestScratchDir("zt-pp-gpu-test");
    ASSERT_TRUE(WriteTokenShard((dir_ / "train.bin").string(), testing::PatternTokens(), 32).ok());
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // trainer_gpu_test.cc's model (head size 64, as the CUDA attention takes; 4 heads where
  // tensor parallelism splits them, 4 layers where the interleaved schedule puts two chunks on
  // each stage), m = 4 micro-batches of one sequence a step; validated, then put on `device`.
  JobSpec Job(ResourceConfig::DeviceKind device, const Layout& l) const {
    JobSpec job = gpu_test::GpuTestJob("pp-gpu", (dir_ / "train.bin").string());
    auto* m = job.mutable_model();
    m->set_n_layer(l.schedule == ParallelConfig::INTERLEAVED ? 4 : 2);
    m->set_n_head(2 * l.tp);
    m->set_d_model(128 * l.tp);
    job.mutable_train()->set_micro_batch_size(1);
    job.mutable_train()->set_grad_accum_steps(4);
    job.mutable_train()->set_max_steps(10);
    auto* parallel = job.mutable_parallel();
    parallel->set_world_size(l.pp * l.dp * l.tp);
    parallel->set_pipeline_parallel(l.pp);
    parallel->set_tensor_parallel(l.tp);
    parallel->set_zero_stage(l.stage);
    parallel->set_pipeline_schedule(l.schedule);
    if (l.schedule == ParallelConfig::INTERLEAVED) parallel->set_virtual_stages(2);
    JobSpec valid = ValidatedJob(job).value();
    valid.mutable_resources()->set_device(device);
    return valid;
  }

  std::filesystem::path dir_;
};

TEST_F(PipelineGpuTest, EveryScheduleAndLayoutOnCudaRanksMatchesCpuRanks) {
  ZT_SKIP_WITHOUT_GPU();
  const Layout layouts[] = {
      {"pp2 gpipe", 2, 1, 1, 0, ParallelConfig::GPIPE},
      {"pp2 1f1b", 2, 1, 1, 0, ParallelConfig::ONE_F_ONE_B},
      {"pp2 interleaved", 2, 1, 1, 0, ParallelConfig::INTERLEAVED},
      {"pp2 x dp2 zero-1", 2, 2, 1, 1, ParallelConfig::ONE_F_ONE_B},
      {"pp2 x dp2 zero-3", 2, 2, 1, 3, ParallelConfig::ONE_F_ONE_B},
      {"tp2 x pp2", 2, 1, 2, 0, ParallelConfig::ONE_F_ONE_B},
  };
  for (const Layout& l : layouts) {
    // One step: every GPU op is its CPU twin up to the order of its f32 sums and the
    // collectives are the same staged sums (trainer_gpu_test.cc's one-step bounds: 1e-5
    // relative on the loss, 1e-6 absolute on weights one Adam step of lr 3e-3 moved).
    const RunResult cpu1 = TrainRanks(Job(ResourceConfig::CPU, l), 1);
    const RunResult gpu1 = TrainRanks(Job(ResourceConfig::CUDA, l), 1);
    ASSERT_EQ(gpu1.losses.size(), 1u) << l.name;
    ASSERT_EQ(cpu1.losses.size(), 1u) << l.name;
    EXPECT_NEAR(gpu1.losses[0], cpu1.losses[0], 1e-5 * cpu1.losses[0]) << l.name;
    EXPECT_NEAR(gpu1.grad_norms[0], cpu1.grad_norms[0], 1e-5 * cpu1.grad_norms[0]) << l.name;
    EXPECT_LT(MaxAbsDiff(gpu1.weights, cpu1.weights), 1e-6) << l.name;
    // Ten steps: Adam's drift from reordered sums, trainer_gpu_test.cc's 20-step bound (1e-4
    // relative, 100× the drift, 30× below one wrong update).
    const RunResult cpu = TrainRanks(Job(ResourceConfig::CPU, l), 10);
    const RunResult gpu = TrainRanks(Job(ResourceConfig::CUDA, l), 10);
    ASSERT_EQ(gpu.losses.size(), 10u) << l.name;
    ASSERT_EQ(cpu.losses.size(), 10u) << l.name;
    EXPECT_LT(gpu.losses.back(), gpu.losses.front() - 0.3) << l.name << ": the model learns";
    for (size_t s = 0; s < cpu.losses.size(); ++s) {
      EXPECT_NEAR(gpu.losses[s], cpu.losses[s], 1e-4 * cpu.losses[s])
          << l.name << " step " << s + 1;
    }
    EXPECT_LT(RelativeL2(gpu.weights, cpu.weights), 1e-4) << l.name;
    for (size_t r = 1; r < gpu.all_weights.size(); ++r) {
      EXPECT_EQ(gpu.all_weights[r], gpu.weights) << l.name << ": rank " << r << "'s whole model";
    }
  }
}

}  // namespace
}  // namespace zt

#endif  // ZT_HAVE_CUDA
