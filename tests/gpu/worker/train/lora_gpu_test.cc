// LoRA on CUDA ranks (docs/lora.md, "LoRA on CUDA ranks") against the same job on CPU ranks:
// adapters on c_attn, c_proj and c_fc (rank 8, dropout 0.1, so the CUDA LoraDropout's mask is
// in the loop) over an FP32 base, at 1 rank and at 2 ranks ZeRO 1 and 3 sharing the GPU
// (staged communicators, ranks are threads), and a checkpoint written on the GPU resumed on
// the GPU. The adapters are initialised on the host and uploaded; the base is seeded on the
// host and uploaded as a full model's is. QLoRA: an NF4 base quantized on the host into
// staging and uploaded (lora_separate_memory_test.cc checks the staging on the CPU, byte for
// byte), trained through kernels/cuda/nf4_linear.h. Every test skips without a GPU. Jobs are
// validated as CPU jobs, then moved to CUDA, as trainer_gpu_test.cc does.
#if ZT_HAVE_CUDA

#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/worker/train/gpu_train_runs.h"
#include "tests/unit/worker/trainer/pattern_corpus.h"
#include "tests/unit/worker/trainer/test_swap_store.h"
#include "worker/data/token_shard.h"
#include "worker/job/job_loading.h"

namespace zt {
namespace {

using gpu_test::MaxAbsDiff;
using gpu_test::RelativeL2;
using gpu_test::RunResult;
using zerotrain::JobSpec;
using zerotrain::ResourceConfig;

// `gpu` and `cpu`: the same 20-step job on CUDA and on CPU ranks. The adapters learn on the
// GPU, and with TF32 off every GPU op is its CPU twin up to the order of its f32 sums (~1e-7
// relative per op; the LoRA ops themselves are bitwise, tests/gpu/kernels/lora_test.cc, and so
// is the dropout mask). Over 20 Adam steps that noise grows as in trainer_gpu_test.cc's full
// fine-tuning (~1e-6); 1e-4 relative on the losses and on the adapters' L2 is 100× that, and
// well below one wrong update (lr 3e-3 against adapters of ~1e-1).
void ExpectGpuRunIsCpuRun(const RunResult& gpu, const RunResult& cpu, const std::string& what) {
  ASSERT_EQ(gpu.losses.size(), 20u) << what;
  ASSERT_EQ(cpu.losses.size(), 20u) << what;
  EXPECT_LT(gpu.losses.back(), gpu.losses.front()) << what << ": the adapters learn on the GPU";
  for (size_t s = 0; s < 20; ++s) {
    EXPECT_NEAR(gpu.losses[s], cpu.losses[s], 1e-4 * cpu.losses[s]) << what << " step " << s + 1;
  }
  EXPECT_LT(RelativeL2(gpu.weights, cpu.weights), 1e-4) << what;
}

class LoraGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (gpu_test::SkipReason()) return;
    dir_ = testing::TestScratchDir("zt-lora-gpu-test");
    ASSERT_TRUE(WriteTokenShard((dir_ / "train.bin").string(), testing::PatternTokens(), 32).ok());
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  JobSpec Job(ResourceConfig::DeviceKind device, int world, int stage,
              zerotrain::ModelConfig::BaseDType base = zerotrain::ModelConfig::FP32) {
    JobSpec job = gpu_test::GpuTestJob("lora-gpu", (dir_ / "train.bin").string());
    job.mutable_train()->set_micro_batch_size(4 / world);
    job.mutable_train()->set_max_steps(20);
    job.mutable_parallel()->set_world_size(world);
    job.mutable_parallel()->set_zero_stage(stage);
    auto* lora = job.mutable_model()->mutable_lora();
    lora->set_rank(8);
    lora->set_alpha(16.0f);
    lora->set_dropout(0.1f);
    for (const char* module : {"c_attn", "c_proj", "c_fc"}) lora->add_target_modules(module);
    job.mutable_model()->set_base_dtype(base);
    JobSpec valid = ValidatedJob(job).value();
    valid.mutable_resources()->set_device(device);
    return valid;
  }

  std::filesystem::path dir_;
};

TEST_F(LoraGpuTest, AdaptersTrainOnCudaRanksAsOnCpuRanks) {
  ZT_SKIP_WITHOUT_GPU();
  for (const auto [world, stage] : {std::pair{1, 0}, std::pair{2, 1}, std::pair{2, 3}}) {
    const std::string what = absl::StrCat("world ", world, " stage ", stage);
    const RunResult cpu = gpu_test::TrainRanks(Job(ResourceConfig::CPU, world, stage), 20);
    const RunResult gpu = gpu_test::TrainRanks(Job(ResourceConfig::CUDA, world, stage), 20);
    ExpectGpuRunIsCpuRun(gpu, cpu, what);
  }
}

// QLoRA on CUDA ranks: the NF4 base quantized on the host (the same bytes as a CPU rank's, the
// quantize op being the CPU's) and uploaded, the forward and backward through the CUDA NF4
// layer (each tile dequantized bit for bit as on the CPU, then multiplied by cuBLASLt).
TEST_F(LoraGpuTest, AQuantizedBaseTrainsOnCudaRanksAsOnCpuRanks) {
  ZT_SKIP_WITHOUT_GPU();
  for (const auto [world, stage] : {std::pair{1, 0}, std::pair{2, 1}, std::pair{2, 3}}) {
    const std::string what = absl::StrCat("NF4 world ", world, " stage ", stage);
    const auto nf4 = zerotrain::ModelConfig::NF4;
    const RunResult cpu = gpu_test::TrainRanks(Job(ResourceConfig::CPU, world, stage, nf4), 20);
    const RunResult gpu = gpu_test::TrainRanks(Job(ResourceConfig::CUDA, world, stage, nf4), 20);
    // The dequantized weight is the CPU's bit for bit: only the f32 sums' order differs.
    ExpectGpuRunIsCpuRun(gpu, cpu, what);
  }
}

// Tensor-parallel ranks and pipeline stages on CUDA: each rank's adapter shares (a stage's
// blocks' adapters) staged on the host and uploaded, an NF4 share quantized on the host from
// the one-rank weight, the TP and pipeline collectives on device buffers. TP2, PP2 (1F1B, four
// micro-batches) and TP2 × PP2 against the same layouts on CPU ranks.
TEST_F(LoraGpuTest, TensorParallelRanksAndStagesTrainOnCudaAsOnCpu) {
  ZT_SKIP_WITHOUT_GPU();
  struct Layout {
    int tp, pp;
  };
  for (const Layout l : {Layout{2, 1}, Layout{1, 2}, Layout{2, 2}}) {
    const std::string what = absl::StrCat("NF4 tp", l.tp, " pp", l.pp);
    const auto job = [&](ResourceConfig::DeviceKind device) {
      JobSpec j = gpu_test::GpuTestJob("lora-gpu", (dir_ / "train.bin").string());
      j.mutable_train()->set_micro_batch_size(1);
      j.mutable_train()->set_grad_accum_steps(4);
      j.mutable_train()->set_max_steps(20);
      j.mutable_parallel()->set_world_size(l.tp * l.pp);
      j.mutable_parallel()->set_tensor_parallel(l.tp);
      j.mutable_parallel()->set_pipeline_parallel(l.pp);
      j.mutable_model()->set_base_dtype(zerotrain::ModelConfig::NF4);
      auto* lora = j.mutable_model()->mutable_lora();
      lora->set_rank(8);
      lora->set_alpha(16.0f);
      lora->set_dropout(0.1f);
      for (const char* module : {"c_attn", "c_proj", "c_fc"}) lora->add_target_modules(module);
      JobSpec valid = ValidatedJob(j).value();
      valid.mutable_resources()->set_device(device);
      return valid;
    };
    const RunResult cpu = gpu_test::TrainRanks(job(ResourceConfig::CPU), 20);
    const RunResult gpu = gpu_test::TrainRanks(job(ResourceConfig::CUDA), 20);
    ExpectGpuRunIsCpuRun(gpu, cpu, what);  // the same layout on both sides
  }
}

// QLoRA with the offload tier on CUDA ranks: 2 ranks at ZeRO 3 over an NF4 base, the adapters'
// states and the base's shards in the pinned host pool (CPU) or the swap store (NVME), against
// the same offloaded job on CPU ranks.
TEST_F(LoraGpuTest, OffloadedAdaptersAndBaseTrainOnCudaAsOnCpu) {
  ZT_SKIP_WITHOUT_GPU();
  for (const auto where : {zerotrain::OffloadConfig::CPU, zerotrain::OffloadConfig::NVME}) {
    const std::string what =
        absl::StrCat("NF4 zero-3 offload ", zerotrain::OffloadConfig::Device_Name(where));
    const auto job = [&](ResourceConfig::DeviceKind device) {
      JobSpec j = Job(ResourceConfig::CPU, 2, 3, zerotrain::ModelConfig::NF4);
      j.mutable_offload()->set_optimizer(where);
      j.mutable_offload()->set_params(where);
      j.mutable_offload()->set_buffer_count(4);
      j.mutable_offload()->set_buffer_size(4 << 20);  // a block's base shard and states fit one
      if (where == zerotrain::OffloadConfig::NVME) {
        const std::filesystem::path swap =
            dir_ / (device == ResourceConfig::CUDA ? "swap-gpu" : "swap-cpu");
        std::filesystem::create_directories(swap);
        j.mutable_offload()->set_nvme_path(swap.string());
      }
      JobSpec valid = ValidatedJob(j).value();
      valid.mutable_resources()->set_device(device);
      return valid;
    };
    const auto train = [](const JobSpec& j) {
      absl::StatusOr<std::shared_ptr<offload::SwapStore>> swap = testing::OpenTestSwapStore(j);
      EXPECT_TRUE(swap.ok()) << swap.status();
      return swap.ok() ? gpu_test::TrainRanks(j, 20, "", swap->get()) : RunResult();
    };
    const RunResult cpu = train(job(ResourceConfig::CPU));
    const RunResult gpu = train(job(ResourceConfig::CUDA));
    ExpectGpuRunIsCpuRun(gpu, cpu, what);  // the host step is the same CPU kernel on both
  }
}

// A checkpoint of adapters and their states written from a CUDA rank (read through the host)
// resumes on one bit for bit: the resumed run's losses and adapters are the uninterrupted
// GPU run's (the same kernels on the same bytes in the same order).
TEST_F(LoraGpuTest, AdapterCheckpointsResumeOnTheGpuBitForBit) {
  ZT_SKIP_WITHOUT_GPU();
  JobSpec job = Job(ResourceConfig::CUDA, 2, 3);
  job.mutable_train()->set_max_steps(6);
  job.mutable_checkpoint()->set_dir((dir_ / "ckpt").string());
  job.mutable_checkpoint()->set_interval_steps(3);
  const RunResult straight = gpu_test::TrainRanks(job, 6);
  JobSpec stopped = job;
  stopped.mutable_checkpoint()->set_dir((dir_ / "ckpt-stopped").string());
  ASSERT_EQ(gpu_test::TrainRanks(stopped, 3).losses.size(), 3u);
  const RunResult resumed = gpu_test::TrainRanks(stopped, 6, stopped.checkpoint().dir());
  ASSERT_EQ(straight.losses.size(), 6u);
  ASSERT_EQ(resumed.losses.size(), 3u);
  for (size_t s = 0; s < 3; ++s) EXPECT_EQ(resumed.losses[s], straight.losses[3 + s]) << s;
  EXPECT_EQ(MaxAbsDiff(resumed.weights, straight.weights), 0.0);
}

}  // namespace
}  // namespace zt

#endif  // ZT_HAVE_CUDA
