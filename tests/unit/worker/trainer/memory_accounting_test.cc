// The running engine spends exactly the memory plan: for several precision × checkpointing ×
// optimizer configurations, after set-up and a training step (and an evaluation) every
// arena's high-water mark equals the plan's category total, and every planned buffer was
// claimed by the engine — the plan holds nothing unused, the engine nothing unplanned.
#include <filesystem>
#include <random>

#include "gtest/gtest.h"
#include "worker/data/token_shard.h"
#include "worker/job/job_loading.h"
#include "worker/train/trainer.h"

namespace zt {
namespace {

using zerotrain::MemoryConfig;
using zerotrain::OptimizerConfig;
using zerotrain::PrecisionConfig;

struct Config {
  const char* name;
  PrecisionConfig::DType dtype;
  MemoryConfig::ActivationCheckpointing checkpointing;
  OptimizerConfig::Type optimizer;
  bool split_master = false;  // bf16 gradients and split master weights
};

class MemoryAccountingTest : public ::testing::TestWithParam<Config> {};

TEST_P(MemoryAccountingTest, ArenasEqualThePlan) {
  const Config c = GetParam();
  const auto dir = std::filesystem::temp_directory_path() /
                   ("zt-accounting-" + std::to_string(::getpid()) + "-" + c.name);
  std::filesystem::create_directories(dir);
  std::mt19937 rng(1);
  std::vector<int32_t> tokens(4000);
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % 64);
  ASSERT_TRUE(WriteTokenShard((dir / "d.bin").string(), tokens, 64).ok());

  zerotrain::JobSpec job;
  job.set_name("memory-accounting");
  auto* m = job.mutable_model();
  m->set_family(c.optimizer == OptimizerConfig::SGD ? zerotrain::ModelConfig::GPT2
                                                    : zerotrain::ModelConfig::LLAMA);
  m->set_n_layer(3);
  m->set_n_head(4);
  m->set_d_model(64);
  m->set_vocab_size(64);
  m->set_max_seq_len(32);
  job.mutable_data()->add_train((dir / "d.bin").string());
  job.mutable_data()->add_val((dir / "d.bin").string());
  job.mutable_data()->set_seq_len(32);
  job.mutable_train()->set_micro_batch_size(2);
  job.mutable_train()->set_max_steps(2);
  job.mutable_train()->set_eval_interval(1);
  job.mutable_train()->set_eval_steps(1);
  job.mutable_optimizer()->set_type(c.optimizer);
  job.mutable_optimizer()->set_lr(1e-3f);
  job.mutable_optimizer()->set_momentum(0.9f);
  job.mutable_optimizer()->set_min_quantized_numel(1024);  // quantize this model's matrices
  job.mutable_optimizer()->set_quant_block_size(256);
  job.mutable_precision()->set_param_dtype(c.dtype);
  if (c.split_master) {
    job.mutable_precision()->set_grad_dtype(PrecisionConfig::BF16);
    job.mutable_precision()->set_split_master_weights(true);
  }
  job.mutable_memory()->set_activation_checkpointing(c.checkpointing);
  job.mutable_memory()->set_checkpoint_every_k(2);
  job.mutable_resources()->set_cpu_threads(2);
  const zerotrain::JobSpec validated = ValidatedJob(job).value();

  auto trainer = Trainer::Create(validated, {}).value();
  ASSERT_TRUE(trainer->Run().ok());
  const MemoryPlan plan = PlanMemory(validated);
  EXPECT_EQ(trainer->plan().TotalBytes(), plan.TotalBytes());
  for (int i = 0; i < kMemoryCategoryCount; ++i) {
    const auto category = static_cast<MemoryCategory>(i);
    EXPECT_EQ(trainer->arenas().BytesInUse(category), plan.CategoryBytes(category))
        << MemoryCategoryName(category);
  }
  EXPECT_TRUE(trainer->arenas().UnclaimedBuffers().empty())
      << trainer->arenas().UnclaimedBuffers().front();
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Configurations, MemoryAccountingTest,
    ::testing::Values(
        Config{"Fp32NoneAdamW", PrecisionConfig::FP32, MemoryConfig::NONE, OptimizerConfig::ADAMW},
        Config{"Bf16FullAdamW8bit", PrecisionConfig::BF16, MemoryConfig::FULL,
               OptimizerConfig::ADAMW_8BIT},
        Config{"Bf16FullAdamW8bitSplitMaster", PrecisionConfig::BF16, MemoryConfig::FULL,
               OptimizerConfig::ADAMW_8BIT, true},
        Config{"Bf16SelectiveAdafactor", PrecisionConfig::BF16, MemoryConfig::SELECTIVE,
               OptimizerConfig::ADAFACTOR},
        Config{"Fp16EveryKAdamW", PrecisionConfig::FP16, MemoryConfig::EVERY_K,
               OptimizerConfig::ADAMW},
        Config{"Fp32FullSgd", PrecisionConfig::FP32, MemoryConfig::FULL, OptimizerConfig::SGD}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace zt
