// The step loop on a CUDA device (worker/train/rank_device.h, worker/train/trainer.h) against the
// same job on the CPU: one step and 20 steps in fp32 (TF32 off), bf16 with fp32 masters, fp16
// with dynamic loss scaling and a forced overflow; ZeRO stages 0–3 on 2 and 4 ranks sharing
// the GPU (staged communicators, ranks are threads) against one GPU rank; checkpoints written
// on the GPU resumed on the CPU and the other way round; the memory plan against the device
// memory the run holds. Every test skips without a GPU.
//
// The model has head size 64 (the CUDA attention kernels take D = 64 and 128): GPT-2 style, 2
// layers, d_model 128, 2 heads, vocabulary 32, T 32, on the pattern corpus of the CPU tests.
// Jobs are validated as CPU jobs, then moved to CUDA (job validation still refuses CUDA jobs
// until the coordinator places them), and created with Trainer::Create directly.
#if ZT_HAVE_CUDA

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/worker/train/gpu_train_runs.h"
#include "tests/unit/worker/trainer/pattern_corpus.h"
#include "worker/comm/store.h"
#include "worker/data/token_shard.h"
#include "worker/job/job_loading.h"
#include "worker/plan/memory_plan.h"
#include "worker/train/trainer.h"

namespace zt {
namespace {

using gpu_test::MaxAbsDiff;
using gpu_test::RelativeL2;
using gpu_test::RunResult;
using zerotrain::JobSpec;
using zerotrain::PrecisionConfig;
using zerotrain::ResourceConfig;

class TrainerGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (gpu_test::SkipReason()) return;
    dir_ = testing::TestScratchDir("zt-trainer-gpu-test");
    ASSERT_TRUE(WriteTokenShard((dir_ / "train.bin").string(), testing::PatternTokens(), 32).ok());
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // Validated on the CPU, then put on `device`.
  JobSpec Job(ResourceConfig::DeviceKind device, int world = 1, int stage = 0, int micro_batch = 4,
              PrecisionConfig::DType dtype = PrecisionConfig::FP32) {
    JobSpec job = gpu_test::GpuTestJob("trainer-gpu", (dir_ / "train.bin").string());
    job.mutable_train()->set_micro_batch_size(micro_batch);
    job.mutable_train()->set_max_steps(20);
    job.mutable_parallel()->set_world_size(world);
    job.mutable_parallel()->set_zero_stage(stage);
    if (dtype != PrecisionConfig::FP32) {
      job.mutable_precision()->set_param_dtype(dtype);
      job.mutable_precision()->set_compute_dtype(dtype);
      job.mutable_precision()->set_master_weights(true);
    }
    JobSpec valid = ValidatedJob(job).value();
    valid.mutable_resources()->set_device(device);
    return valid;
  }

  static RunResult Train(const JobSpec& job, int64_t stop_after, const std::string& resume = "") {
    return gpu_test::TrainRanks(job, stop_after, resume);
  }

  std::filesystem::path dir_;
};

TEST_F(TrainerGpuTest, Fp32OneStepAndTwentyStepsMatchTheCpu) {
  ZT_SKIP_WITHOUT_GPU();
  // TF32 stays off (precision.allow_tf32 defaults to false), so every GPU op is its CPU twin
  // up to the order of its f32 sums (docs/cuda.md): ~1e-7 relative per op.
  const RunResult cpu1 = Train(Job(ResourceConfig::CPU), 1);
  const RunResult gpu1 = Train(Job(ResourceConfig::CUDA), 1);
  ASSERT_EQ(gpu1.losses.size(), 1u);
  // One step: the loss is a forward only (K ≤ 512 sums, ~1e-7 each, over a few ops): 1e-5
  // relative is 100× that and far below what a wrong op gives (O(1)). The weights moved by one
  // Adam step of lr 3e-3, whose update m/√v is ±1 for nearly every weight, so reordered sums
  // change it only through ε and the clipping factor: 1e-6 absolute, three orders below lr.
  EXPECT_NEAR(gpu1.losses[0], cpu1.losses[0], 1e-5 * cpu1.losses[0]);
  EXPECT_NEAR(gpu1.grad_norms[0], cpu1.grad_norms[0], 1e-5 * cpu1.grad_norms[0]);
  EXPECT_LT(MaxAbsDiff(gpu1.weights, cpu1.weights), 1e-6);

  const RunResult cpu = Train(Job(ResourceConfig::CPU), 20);
  const RunResult gpu = Train(Job(ResourceConfig::CUDA), 20);
  ASSERT_EQ(gpu.losses.size(), 20u);
  EXPECT_LT(gpu.losses.back(), gpu.losses.front() - 0.5) << "the model learns on the GPU";
  // 20 steps: Adam amplifies the reordering noise of gradients near zero (m/√v of a tiny
  // gradient is O(1) whatever its last bits), so the runs drift apart slowly; the sharded CPU
  // tests see ~1e-6 after 20 steps from the same kind of noise. 1e-4 relative on the losses
  // and on the weights' L2 is 100× that and 30× below one wrong update (lr / |w| ≈ 3e-2).
  for (size_t s = 0; s < 20; ++s) {
    EXPECT_NEAR(gpu.losses[s], cpu.losses[s], 1e-4 * cpu.losses[s]) << "step " << s + 1;
  }
  EXPECT_LT(RelativeL2(gpu.weights, cpu.weights), 1e-4);
}

TEST_F(TrainerGpuTest, Tf32IsTheJobsChoiceAndStaysWithinItsPrecision) {
  ZT_SKIP_WITHOUT_GPU();
  JobSpec tf32 = Job(ResourceConfig::CUDA);
  tf32.mutable_precision()->set_allow_tf32(true);
  const RunResult cpu = Train(Job(ResourceConfig::CPU), 1);
  const RunResult full = Train(Job(ResourceConfig::CUDA), 1);
  const RunResult fast = Train(tf32, 1);
  ASSERT_EQ(fast.losses.size(), 1u);
  // TF32 keeps 10 mantissa bits of each GEMM input (2^-11 relative rounding each); a K-long
  // dot product of such errors is ~2^-11 relative to its magnitude, and the loss, an average
  // over B·T positions of a log-softmax, sits well within 1e-2 relative of the fp32 loss. A
  // wrong GEMM gives O(1).
  EXPECT_NEAR(fast.losses[0], cpu.losses[0], 1e-2 * cpu.losses[0]);
  // And TF32 really ran: with 10-bit inputs the loss moves by ~1e-4 relative, three orders
  // above fp32's reordering noise (full vs CPU within 1e-5 above), so the two GPU runs differ.
  EXPECT_NE(fast.losses[0], full.losses[0]) << "allow_tf32 did not reach the GEMMs";
  EXPECT_NEAR(full.losses[0], cpu.losses[0], 1e-5 * cpu.losses[0]);
}

// A coordinator-placed rank computes on the GPU it was placed on, and a placement beyond the
// visible GPUs is refused naming the device (a CUDA_VISIBLE_DEVICES that hides it).
TEST_F(TrainerGpuTest, APlacedRankUsesItsPlacedGpu) {
  ZT_SKIP_WITHOUT_GPU();
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  const JobSpec job = Job(ResourceConfig::CUDA);
  TrainOptions options;
  options.cuda_device = count - 1;
  options.stop_after_step = 1;
  std::unique_ptr<Trainer> trainer = Trainer::Create(job, options).value();
  ASSERT_TRUE(trainer->Run([](const StepRecord&) {}).ok());
  int current = -1;
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(current, count - 1) << "the rank's thread computes on its placed GPU";

  options.cuda_device = count;
  const absl::StatusOr<std::unique_ptr<Trainer>> beyond = Trainer::Create(job, options);
  ASSERT_FALSE(beyond.ok());
  EXPECT_EQ(beyond.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(beyond.status().message()),
              ::testing::HasSubstr(absl::StrCat("CUDA device ", count)));
}

TEST_F(TrainerGpuTest, Bf16WithFp32MastersMatchesTheCpuWithinMixedPrecision) {
  ZT_SKIP_WITHOUT_GPU();
  const RunResult cpu = Train(Job(ResourceConfig::CPU, 1, 0, 4, PrecisionConfig::BF16), 20);
  const RunResult gpu = Train(Job(ResourceConfig::CUDA, 1, 0, 4, PrecisionConfig::BF16), 20);
  ASSERT_EQ(gpu.losses.size(), 20u);
  // Both store bf16 and compute in f32, rounding once per op: they differ where an f32 value
  // whose last bits differ (sum order) rounds to the other side of a bf16 boundary, one bf16
  // ulp = 2⁻⁸ ≈ 4e-3 relative of that activation or weight. Over 20 steps those flips average
  // out in the loss: 2e-2 relative bounds the drift (a few ulps) and is still well below the
  // loss's fall over the run (> 0.5 of ~3.5, 15%). The fp32 masters differ as the fp32 run's
  // do plus the bf16 forward's noise: 1e-2 relative L2.
  for (size_t s = 0; s < 20; ++s) {
    EXPECT_NEAR(gpu.losses[s], cpu.losses[s], 2e-2 * cpu.losses[s]) << "step " << s + 1;
  }
  EXPECT_LT(RelativeL2(gpu.weights, cpu.weights), 1e-2);
  EXPECT_LT(gpu.losses.back(), gpu.losses.front() - 0.5) << "the model learns in bf16";
}

TEST_F(TrainerGpuTest, Fp16LossScalingSkipsTheOverflowAndBacksOffAsOnTheCpu) {
  ZT_SKIP_WITHOUT_GPU();
  auto job = [&](ResourceConfig::DeviceKind device) {
    JobSpec j = Job(device, 1, 0, 4, PrecisionConfig::FP16);
    // 2^24 · (p − y) / (B·T = 128) reaches 1.3e5 > 65504 in fp16 dlogits: the first steps
    // overflow for sure; hysteresis 1 backs off at the first.
    auto* ls = j.mutable_precision()->mutable_loss_scale();
    ls->set_initial_power(24);
    ls->set_hysteresis(1);
    ls->set_window(1000);
    return j;
  };
  const RunResult cpu = Train(job(ResourceConfig::CPU), 20);
  const RunResult gpu = Train(job(ResourceConfig::CUDA), 20);
  ASSERT_EQ(gpu.losses.size(), 20u);
  EXPECT_GE(gpu.skipped.front(), 1) << "the forced overflow is skipped";
  EXPECT_LT(gpu.loss_scales[1], gpu.loss_scales[0]) << "and the scale backs off";
  EXPECT_TRUE(std::isinf(gpu.grad_norms[0]));
  // Whether a step overflows depends on values far from the fp16 limit here (a factor 2
  // either side), so both devices skip the same steps and end at the same scale.
  EXPECT_EQ(gpu.skipped, cpu.skipped);
  EXPECT_EQ(gpu.loss_scales, cpu.loss_scales);
  // The updates are fp16 mixed precision: bounds as bf16's, with fp16's 2⁻¹¹ ulp even tighter.
  for (size_t s = 0; s < 20; ++s) {
    EXPECT_NEAR(gpu.losses[s], cpu.losses[s], 2e-2 * cpu.losses[s]) << "step " << s + 1;
  }
  EXPECT_LT(RelativeL2(gpu.weights, cpu.weights), 1e-2);
}

TEST_F(TrainerGpuTest, EveryStageOnTwoAndFourRanksSharingTheGpuMatchesOneRank) {
  ZT_SKIP_WITHOUT_GPU();
  for (int world : {2, 4}) {
    // One GPU rank reading the whole global batch: micro-batch N·B.
    const RunResult reference = Train(Job(ResourceConfig::CUDA, 1, 0, 2 * world), 20);
    for (int stage = 0; stage <= 3; ++stage) {
      const std::string what = "world " + std::to_string(world) + " stage " + std::to_string(stage);
      const RunResult got = Train(Job(ResourceConfig::CUDA, world, stage, 2), 20);
      ASSERT_EQ(got.losses.size(), 20u) << what;
      // The staged communicator sums on the host as Gloo does; the ranks' partial gradients
      // are summed in another order than one rank's batch: the bounds of the CPU's sharded
      // tests (tests/unit/worker/trainer/sharded_training_test.cc), for the same reason.
      for (size_t s = 0; s < 20; ++s) {
        EXPECT_NEAR(got.losses[s], reference.losses[s], 1e-5 * reference.losses[s])
            << what << " step " << s + 1;
      }
      EXPECT_LT(MaxAbsDiff(got.weights, reference.weights), 1e-4) << what;
      for (int r = 1; r < world; ++r) {
        EXPECT_EQ(MaxAbsDiff(got.all_weights[r], got.weights), 0.0) << what << " rank " << r;
      }
    }
  }
}

TEST_F(TrainerGpuTest, ACheckpointMovesBetweenGpuAndCpuBitForBit) {
  ZT_SKIP_WITHOUT_GPU();
  for (const auto& [from, to] : {std::pair{ResourceConfig::CUDA, ResourceConfig::CPU},
                                 std::pair{ResourceConfig::CPU, ResourceConfig::CUDA}}) {
    const std::string what = from == ResourceConfig::CUDA ? "gpu → cpu" : "cpu → gpu";
    const std::filesystem::path ckpt = dir_ / (from == ResourceConfig::CUDA ? "g2c" : "c2g");
    auto with_checkpoints = [&](ResourceConfig::DeviceKind device) {
      JobSpec j = Job(device, 2, 2, 2);
      j.mutable_checkpoint()->set_dir(ckpt.string());
      j.mutable_checkpoint()->set_interval_steps(6);
      return j;
    };
    const RunResult writer = Train(with_checkpoints(from), 6);
    // Resuming and stopping at the same step trains nothing: the state read on the other
    // device is the state written, byte for byte (parameters, masters and moments are copied,
    // never recomputed), so its weights are the writer's bit for bit.
    const RunResult loaded = Train(with_checkpoints(to), 6, ckpt.string());
    EXPECT_TRUE(loaded.losses.empty()) << what;
    EXPECT_EQ(loaded.weights, writer.weights) << what;
    // And it trains on from there as a run on that device would: within the fp32 bounds.
    const RunResult on = Train(with_checkpoints(to), 12, ckpt.string());
    const RunResult straight = Train(Job(to, 2, 2, 2), 12);
    ASSERT_EQ(on.losses.size(), 6u) << what;
    EXPECT_LT(RelativeL2(on.weights, straight.weights), 1e-4) << what;
  }
}

TEST_F(TrainerGpuTest, ThePlanIsTheDeviceMemoryTheRunHolds) {
  ZT_SKIP_WITHOUT_GPU();
  const JobSpec job = Job(ResourceConfig::CUDA, 1, 3, 4, PrecisionConfig::BF16);
  TrainOptions options;
  // A first run loads every kernel module the job uses (lazy loading takes device memory at a
  // kernel's first launch), so the second measures the trainer's memory alone.
  {
    std::unique_ptr<Trainer> warm = Trainer::Create(job, options).value();
    ASSERT_TRUE(warm->Step().ok());
  }
  ZT_ASSERT_CUDA(cudaDeviceSynchronize());
  size_t free_before = 0, total = 0, free_created = 0, free_stepped = 0;
  ZT_ASSERT_CUDA(cudaMemGetInfo(&free_before, &total));
  std::unique_ptr<Trainer> t = Trainer::Create(job, options).value();
  ZT_ASSERT_CUDA(cudaDeviceSynchronize());
  ZT_ASSERT_CUDA(cudaMemGetInfo(&free_created, &total));
  for (int s = 0; s < 3; ++s) ASSERT_TRUE(t->Step().ok());
  ZT_ASSERT_CUDA(cudaDeviceSynchronize());
  ZT_ASSERT_CUDA(cudaMemGetInfo(&free_stepped, &total));

  // Per category, the arenas hold exactly what the plan says.
  int64_t planned_device = 0;
  for (int c = 0; c < kMemoryCategoryCount; ++c) {
    const auto category = static_cast<MemoryCategory>(c);
    EXPECT_EQ(t->arenas().BytesInUse(category), t->plan().CategoryBytes(category))
        << MemoryCategoryName(category);
    if (category != MemoryCategory::kPinnedHost && category != MemoryCategory::kNvme) {
      planned_device += t->plan().CategoryBytes(category);
    }
  }
  EXPECT_TRUE(t->arenas().UnclaimedBuffers().empty())
      << "the plan holds buffers the run never used, e.g. " << t->arenas().UnclaimedBuffers()[0];
  // Device memory taken by Create: the arenas (one cudaMalloc per category, each rounded up
  // to the allocator's 2 MiB granularity) and the stream; the initialisation's scratch is
  // freed. So at least the plan, and at most 2 MiB per category more.
  const int64_t taken = static_cast<int64_t>(free_before) - static_cast<int64_t>(free_created);
  EXPECT_GE(taken, planned_device);
  EXPECT_LE(taken, planned_device + int64_t{kMemoryCategoryCount} * (2 << 20));
  // Nothing is allocated in the step loop.
  EXPECT_EQ(free_stepped, free_created);
}

}  // namespace
}  // namespace zt

#endif  // ZT_HAVE_CUDA
