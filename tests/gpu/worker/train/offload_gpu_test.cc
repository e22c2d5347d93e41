// The offload tier on CUDA ranks (issue 16): ZeRO-Offload (offload.optimizer CPU) and
// ZeRO-Infinity (optimizer NVME, parameters CPU and NVME at stage 3) with the rank's
// CudaCopyEngine moving gradients down and parameters up on its copy stream, the host step on
// the job's CPU share, and the plan's pinned_host category in cudaHostAlloc'd memory.
//
// What is checked, on 1 and 2 ranks sharing the GPU (staged communicators):
// - an offloaded GPU run against the GPU run without offload, within the bounds of the GPU vs
//   CPU comparison (the host AdamW is the CPU kernel, the device one the CUDA kernel);
// - every offload against every other on the GPU bit for bit: they run the same host kernel
//   on the same gradients, so only a wrong copy (stale, early, misplaced) can tell them apart;
// - the offloaded GPU run against the same offloaded job on the CPU;
// - the delayed update on the GPU against the same delayed job on the CPU;
// - a checkpoint of offloaded states written on the GPU loads bit for bit and trains on;
// - the arenas are the plan's categories, the device memory taken is the device categories',
//   and nothing is allocated in the step loop.
// The same paths run on the CPU through a device whose memory is its own
// (tests/unit/worker/trainer/offload_separate_memory_test.cc); these tests add the streams.
// Every test skips without a GPU.
#if ZT_HAVE_CUDA

#include <cuda_runtime_api.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/worker/train/gpu_train_runs.h"
#include "tests/unit/worker/trainer/pattern_corpus.h"
#include "tests/unit/worker/trainer/test_swap_store.h"
#include "worker/data/token_shard.h"
#include "worker/job/job_loading.h"
#include "worker/plan/memory_plan.h"
#include "worker/train/trainer.h"

namespace zt {
namespace {

using zerotrain::JobSpec;
using zerotrain::OffloadConfig;
using zerotrain::PrecisionConfig;
using zerotrain::ResourceConfig;

using gpu_test::RelativeL2;
using gpu_test::RunResult;

class OffloadGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (gpu_test::SkipReason()) return;
    dir_ = testing::TestScratchDir("zt-offload-gpu-test");
    ASSERT_TRUE(WriteTokenShard((dir_ / "train.bin").string(), testing::PatternTokens(), 32).ok());
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // trainer_gpu_test.cc's model (head size 64, as the CUDA attention takes), with `optimizer`
  // and `params` offload; validated, then put on `device`. Each NVMe job gets a swap directory
  // of its own.
  JobSpec Job(ResourceConfig::DeviceKind device, int world, int stage,
              OffloadConfig::Device optimizer, OffloadConfig::Device params = OffloadConfig::NONE,
              PrecisionConfig::DType dtype = PrecisionConfig::FP32) {
    JobSpec job = gpu_test::GpuTestJob("offload-gpu", (dir_ / "train.bin").string());
    job.mutable_train()->set_micro_batch_size(4 / world);
    job.mutable_train()->set_max_steps(10);
    job.mutable_parallel()->set_world_size(world);
    job.mutable_parallel()->set_zero_stage(stage);
    if (dtype != PrecisionConfig::FP32) {
      job.mutable_precision()->set_param_dtype(dtype);
      job.mutable_precision()->set_compute_dtype(dtype);
      job.mutable_precision()->set_master_weights(true);
    }
    auto* offload = job.mutable_offload();
    offload->set_optimizer(optimizer);
    offload->set_params(params);
    // A block's fp32 master weights are 12·C² + 13·C ≈ 0.8 MB; its master and two Adam
    // moments (NVMe reads them into one buffer) fit 4 MiB.
    offload->set_buffer_count(4);
    offload->set_buffer_size(4 << 20);
    if (optimizer == OffloadConfig::NVME || params == OffloadConfig::NVME) {
      const std::filesystem::path swap = dir_ / absl::StrCat("swap-", next_swap_++);
      std::filesystem::create_directories(swap);
      offload->set_nvme_path(swap.string());
    }
    absl::StatusOr<JobSpec> valid = ValidatedJob(job);
    EXPECT_TRUE(valid.ok()) << valid.status();
    JobSpec out = valid.ok() ? *valid : job;
    out.mutable_resources()->set_device(device);
    return out;
  }

  // Every rank of `job` (threads) to `stop_after`, from `resume` when set, sharing one swap
  // store as `zt train` does.
  static RunResult Train(const JobSpec& job, int64_t stop_after, const std::string& resume = "") {
    absl::StatusOr<std::shared_ptr<offload::SwapStore>> swap = testing::OpenTestSwapStore(job);
    EXPECT_TRUE(swap.ok()) << swap.status();
    if (!swap.ok()) return RunResult();
    return gpu_test::TrainRanks(job, stop_after, resume, swap->get());
  }

  std::filesystem::path dir_;
  int next_swap_ = 0;
};

struct Layout {
  int world, stage;
};
constexpr Layout kLayouts[] = {{1, 1}, {2, 2}, {2, 3}};

TEST_F(OffloadGpuTest, OffloadedGpuRunsMatchTheDeviceOptimizer) {
  ZT_SKIP_WITHOUT_GPU();
  for (const Layout& l : kLayouts) {
    const RunResult device =
        Train(Job(ResourceConfig::CUDA, l.world, l.stage, OffloadConfig::NONE), 10);
    for (const OffloadConfig::Device optimizer : {OffloadConfig::CPU, OffloadConfig::NVME}) {
      const std::string what = absl::StrCat("world ", l.world, " stage ", l.stage, " optimizer ",
                                            OffloadConfig::Device_Name(optimizer));
      const RunResult got = Train(Job(ResourceConfig::CUDA, l.world, l.stage, optimizer), 10);
      ASSERT_EQ(got.losses.size(), 10u) << what;
      EXPECT_LT(got.losses.back(), got.losses.front() - 0.3) << what << ": the model learns";
      // The host step is the CPU AdamW kernel, the device's the CUDA one: the same f32
      // expression, apart in the last bit where one contracts a multiply-add the other does
      // not. trainer_gpu_test.cc's GPU-vs-CPU bound (1e-4 relative, 100× the drift seen
      // between reordered f32 runs, 30× under one wrong update) covers it, for the same reason.
      for (size_t s = 0; s < device.losses.size(); ++s) {
        EXPECT_NEAR(got.losses[s], device.losses[s], 1e-4 * device.losses[s])
            << what << " step " << s + 1;
      }
      EXPECT_LT(RelativeL2(got.weights, device.weights), 1e-4) << what;
      for (int r = 0; r < l.world; ++r) {
        EXPECT_GT(got.offload_bytes[r], 0) << what << " rank " << r << ": nothing crossed";
      }
    }
  }
}

// Every offload runs the same host kernel on the same reduced gradients, so on the GPU they
// agree bit for bit; a gradient copied before its reduction ended, a parameter shard uploaded
// late or into the wrong slot, or a stale swap generation each breaks that.
TEST_F(OffloadGpuTest, EveryOffloadIsTheOtherOnTheGpuBitForBit) {
  ZT_SKIP_WITHOUT_GPU();
  for (const PrecisionConfig::DType dtype : {PrecisionConfig::FP32, PrecisionConfig::BF16}) {
    for (const int world : {1, 2}) {
      const std::string base = absl::StrCat(PrecisionConfig::DType_Name(dtype), " world ", world);
      const auto job = [&](OffloadConfig::Device optimizer, OffloadConfig::Device params) {
        return Job(ResourceConfig::CUDA, world, 3, optimizer, params, dtype);
      };
      const RunResult cpu = Train(job(OffloadConfig::CPU, OffloadConfig::NONE), 10);
      ASSERT_EQ(cpu.losses.size(), 10u) << base;
      const std::pair<OffloadConfig::Device, OffloadConfig::Device> others[] = {
          {OffloadConfig::NVME, OffloadConfig::NONE},
          {OffloadConfig::CPU, OffloadConfig::CPU},
          {OffloadConfig::NVME, OffloadConfig::CPU},
          {OffloadConfig::NVME, OffloadConfig::NVME}};
      for (const auto& [optimizer, params] : others) {
        const std::string what =
            absl::StrCat(base, " optimizer ", OffloadConfig::Device_Name(optimizer), " params ",
                         OffloadConfig::Device_Name(params));
        const RunResult got = Train(job(optimizer, params), 10);
        EXPECT_EQ(got.losses, cpu.losses) << what;
        EXPECT_EQ(got.weights, cpu.weights) << what;
      }
    }
  }
}

TEST_F(OffloadGpuTest, OffloadedAndDelayedGpuRunsMatchTheCpu) {
  ZT_SKIP_WITHOUT_GPU();
  for (const bool delayed : {false, true}) {
    for (const OffloadConfig::Device optimizer : {OffloadConfig::CPU, OffloadConfig::NVME}) {
      const std::string what =
          absl::StrCat(OffloadConfig::Device_Name(optimizer), delayed ? " delayed" : "");
      const auto job = [&](ResourceConfig::DeviceKind device) {
        JobSpec j = Job(device, 2, 2, optimizer);
        j.mutable_offload()->mutable_delayed_update()->set_enabled(delayed);
        j.mutable_offload()->mutable_delayed_update()->set_after_steps(2);
        return j;
      };
      const RunResult gpu = Train(job(ResourceConfig::CUDA), 10);
      const RunResult cpu = Train(job(ResourceConfig::CPU), 10);
      ASSERT_EQ(gpu.losses.size(), 10u) << what;
      // The GPU's forward and backward against the CPU's, the host step the same kernel on
      // both: trainer_gpu_test.cc's 20-step bound.
      for (size_t s = 0; s < cpu.losses.size(); ++s) {
        EXPECT_NEAR(gpu.losses[s], cpu.losses[s], 1e-4 * cpu.losses[s])
            << what << " step " << s + 1;
      }
      EXPECT_LT(RelativeL2(gpu.weights, cpu.weights), 1e-4) << what;
    }
  }
}

// A sharded Adafactor's host step sums its factored statistics in host memory over the host
// step's own contexts (worker/shard/host_step_sums.h): the GPU run against the CPU run.
TEST_F(OffloadGpuTest, ShardedAdafactorOffloadedFromGpuRanksMatchesTheCpu) {
  ZT_SKIP_WITHOUT_GPU();
  for (const OffloadConfig::Device optimizer : {OffloadConfig::CPU, OffloadConfig::NVME}) {
    const std::string what = OffloadConfig::Device_Name(optimizer);
    const auto job = [&](ResourceConfig::DeviceKind device) {
      JobSpec j = Job(device, 2, 2, optimizer);
      j.mutable_optimizer()->set_type(zerotrain::OptimizerConfig::ADAFACTOR);
      return j;
    };
    const RunResult gpu = Train(job(ResourceConfig::CUDA), 10);
    const RunResult cpu = Train(job(ResourceConfig::CPU), 10);
    ASSERT_EQ(gpu.losses.size(), 10u) << what;
    // The host step is the same CPU kernel on both; the GPU's forward and backward against the
    // CPU's: trainer_gpu_test.cc's 20-step bound.
    for (size_t s = 0; s < cpu.losses.size(); ++s) {
      EXPECT_NEAR(gpu.losses[s], cpu.losses[s], 1e-4 * cpu.losses[s]) << what << " step " << s + 1;
    }
    EXPECT_LT(RelativeL2(gpu.weights, cpu.weights), 1e-4) << what;
  }
}

TEST_F(OffloadGpuTest, OffloadedCheckpointsLoadBitForBitAndTrainOn) {
  ZT_SKIP_WITHOUT_GPU();
  for (const OffloadConfig::Device params : {OffloadConfig::CPU, OffloadConfig::NVME}) {
    const std::string what = absl::StrCat("params ", OffloadConfig::Device_Name(params));
    JobSpec job = Job(ResourceConfig::CUDA, 2, 3, OffloadConfig::NVME, params);
    job.mutable_checkpoint()->set_dir(
        (dir_ / absl::StrCat("ckpt-", OffloadConfig::Device_Name(params))).string());
    job.mutable_checkpoint()->set_interval_steps(5);
    const RunResult writer = Train(job, 5);
    // Resuming and stopping at the same step trains nothing: the states read back through the
    // store and the copy engine are the ones written.
    const RunResult loaded = Train(job, 5, job.checkpoint().dir());
    EXPECT_TRUE(loaded.losses.empty()) << what;
    EXPECT_EQ(loaded.weights, writer.weights) << what;
    const RunResult on = Train(job, 10, job.checkpoint().dir());
    const RunResult straight =
        Train(Job(ResourceConfig::CUDA, 2, 3, OffloadConfig::NVME, params), 10);
    ASSERT_EQ(on.losses.size(), 5u) << what;
    // The same kernels on the same states: the GPU ops are deterministic in fp32 (no atomics in
    // this model's kernels), so the resumed run is the straight one within the fp32 bound and,
    // on a deterministic build, equal.
    EXPECT_LT(RelativeL2(on.weights, straight.weights), 1e-5) << what;
  }
}

TEST_F(OffloadGpuTest, ThePlanIsTheMemoryAnOffloadedRunHolds) {
  ZT_SKIP_WITHOUT_GPU();
  for (const OffloadConfig::Device params : {OffloadConfig::CPU, OffloadConfig::NVME}) {
    const std::string what = absl::StrCat("params ", OffloadConfig::Device_Name(params));
    const JobSpec job =
        Job(ResourceConfig::CUDA, 1, 3, OffloadConfig::NVME, params, PrecisionConfig::BF16);
    absl::StatusOr<std::shared_ptr<offload::SwapStore>> swap = testing::OpenTestSwapStore(job);
    ASSERT_TRUE(swap.ok()) << swap.status();
    TrainOptions options;
    options.swap_store = swap->get();
    {
      // Loads every kernel module the job uses, so the run below measures the trainer alone.
      std::unique_ptr<Trainer> warm = Trainer::Create(job, options).value();
      ASSERT_TRUE(warm->Step().ok()) << what;
    }
    ZT_ASSERT_CUDA(cudaDeviceSynchronize());
    size_t free_before = 0, total = 0, free_created = 0, free_stepped = 0;
    ZT_ASSERT_CUDA(cudaMemGetInfo(&free_before, &total));
    absl::StatusOr<std::unique_ptr<Trainer>> created = Trainer::Create(job, options);
    ASSERT_TRUE(created.ok()) << what << ": " << created.status();
    std::unique_ptr<Trainer> t = *std::move(created);
    ZT_ASSERT_CUDA(cudaDeviceSynchronize());
    ZT_ASSERT_CUDA(cudaMemGetInfo(&free_created, &total));
    for (int s = 0; s < 3; ++s) ASSERT_TRUE(t->Step().ok()) << what;
    ZT_ASSERT_CUDA(cudaDeviceSynchronize());
    ZT_ASSERT_CUDA(cudaMemGetInfo(&free_stepped, &total));
    int64_t planned_device = 0;
    for (int c = 0; c < kMemoryCategoryCount; ++c) {
      const auto category = static_cast<MemoryCategory>(c);
      EXPECT_EQ(t->arenas().BytesInUse(category), t->plan().CategoryBytes(category))
          << what << " " << MemoryCategoryName(category);
      if (category != MemoryCategory::kPinnedHost && category != MemoryCategory::kNvme) {
        planned_device += t->plan().CategoryBytes(category);
      }
    }
    // The optimizer states and the parameter shards left the device.
    EXPECT_EQ(t->plan().CategoryBytes(MemoryCategory::kOptimizerState), 0) << what;
    EXPECT_GT(t->plan().CategoryBytes(MemoryCategory::kPinnedHost), 0) << what;
    // trainer_gpu_test.cc's rule: the arenas and the stream, each category rounded up to the
    // allocator's 2 MiB, and nothing allocated in the step loop (the copy stream's events
    // and the staging were made with the engine).
    const int64_t taken = static_cast<int64_t>(free_before) - static_cast<int64_t>(free_created);
    EXPECT_GE(taken, planned_device) << what;
    EXPECT_LE(taken, planned_device + int64_t{kMemoryCategoryCount} * (2 << 20)) << what;
    EXPECT_EQ(free_stepped, free_created) << what;
  }
}

}  // namespace
}  // namespace zt

#endif  // ZT_HAVE_CUDA
