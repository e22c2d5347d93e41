// Mixed precision end to end: 16-bit parameters and activations with fp32 master weights
// train like fp32; FP16's dynamic loss scaler skips overflowing steps and backs off; the
// plan holds exactly the dtypes it promises.
#include <filesystem>
#include <random>

#include "gtest/gtest.h"
#include "tests/unit/worker/trainer/pattern_corpus.h"
#include "worker/data/token_shard.h"
#include "worker/job/job_loading.h"
#include "worker/train/trainer.h"

namespace zt {
namespace {

using zerotrain::PrecisionConfig;

class MixedPrecisionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TestScratchDir("zt-mixed");
    ASSERT_TRUE(WriteTokenShard((dir_ / "train.bin").string(), testing::PatternTokens(), 32).ok());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  zerotrain::JobSpec Job(PrecisionConfig::DType param, PrecisionConfig::DType compute) {
    zerotrain::JobSpec job;
    job.set_name("mixed-precision");
    auto* m = job.mutable_model();
    m->set_family(zerotrain::ModelConfig::LLAMA);
    m->set_n_layer(2);
    m->set_n_head(4);
    m->set_n_kv_head(2);
    m->set_d_model(32);
    m->set_vocab_size(32);
    m->set_max_seq_len(16);
    job.mutable_data()->add_train((dir_ / "train.bin").string());
    job.mutable_data()->set_seq_len(16);
    job.mutable_train()->set_micro_batch_size(4);
    job.mutable_train()->set_max_steps(40);
    job.mutable_optimizer()->set_lr(3e-3f);
    job.mutable_precision()->set_param_dtype(param);
    job.mutable_precision()->set_compute_dtype(compute);
    job.mutable_resources()->set_cpu_threads(2);
    return job;
  }

  std::vector<StepRecord> Train(const zerotrain::JobSpec& raw) {
    absl::StatusOr<zerotrain::JobSpec> job = ValidatedJob(raw);
    EXPECT_TRUE(job.ok()) << job.status();
    auto trainer = Trainer::Create(*job, {});
    EXPECT_TRUE(trainer.ok()) << trainer.status();
    std::vector<StepRecord> records;
    const absl::Status s = (*trainer)->Run([&](const StepRecord& r) { records.push_back(r); });
    EXPECT_TRUE(s.ok()) << s;
    return records;
  }

  std::filesystem::path dir_;
};

TEST_F(MixedPrecisionTest, PlanHoldsSixteenBitParametersAndFp32Masters) {
  const zerotrain::JobSpec job =
      ValidatedJob(Job(PrecisionConfig::BF16, PrecisionConfig::BF16)).value();
  auto trainer = Trainer::Create(job, {}).value();
  const Tensor params = trainer->arenas().Get("block.0.params").value();
  const Tensor master = trainer->arenas().Get("block.0.master").value();
  EXPECT_EQ(params.dtype(), DType::kBF16);
  EXPECT_EQ(master.dtype(), DType::kF32);
  EXPECT_EQ(trainer->arenas().Get("block.0.qkv").value().dtype(), DType::kBF16);
  EXPECT_EQ(trainer->arenas().Get("block.0.grads").value().dtype(), DType::kF32);
  // The 16-bit parameters are the master weights rounded to nearest even.
  for (int64_t i = 0; i < params.numel(); ++i) {
    ASSERT_EQ(params.data<uint16_t>()[i], FloatToBf16(master.data<float>()[i])) << i;
  }
}

TEST_F(MixedPrecisionTest, Bf16TrainsLikeFp32) {
  const auto fp32 = Train(Job(PrecisionConfig::FP32, PrecisionConfig::FP32));
  const auto bf16 = Train(Job(PrecisionConfig::BF16, PrecisionConfig::BF16));
  ASSERT_EQ(fp32.size(), bf16.size());
  // bf16 keeps 8 significant bits: the losses differ by rounding, not by trend. After 40
  // steps both have learned the pattern (ln 32 ≈ 3.47 at the start).
  EXPECT_LT(bf16.back().loss, 0.75 * bf16.front().loss);
  EXPECT_NEAR(bf16.back().loss, fp32.back().loss, 0.05 * fp32.back().loss);
  EXPECT_EQ(bf16.back().skipped, 0);
  EXPECT_EQ(bf16.back().loss_scale, 1.0);  // no loss scaling without FP16
}

TEST_F(MixedPrecisionTest, Bf16GradientsAccumulateAcrossMicroBatches) {
  zerotrain::JobSpec job = Job(PrecisionConfig::BF16, PrecisionConfig::BF16);
  job.mutable_precision()->set_grad_dtype(PrecisionConfig::BF16);
  job.mutable_train()->set_micro_batch_size(2);
  job.mutable_train()->set_grad_accum_steps(2);
  const zerotrain::JobSpec validated = ValidatedJob(job).value();
  {
    auto trainer = Trainer::Create(validated, {}).value();
    EXPECT_EQ(trainer->arenas().Get("block.0.grads").value().dtype(), DType::kBF16);
  }
  const auto bf16_grads = Train(job);
  const auto fp32 = Train(Job(PrecisionConfig::FP32, PrecisionConfig::FP32));
  // Two micro-batches summed in bf16 lose a few bits of each gradient; the run still learns
  // the pattern like fp32 does.
  EXPECT_LT(bf16_grads.back().loss, 0.75 * bf16_grads.front().loss);
  EXPECT_NEAR(bf16_grads.back().loss, fp32.back().loss, 0.08 * fp32.back().loss);
}

TEST_F(MixedPrecisionTest, Fp16LossScalerSkipsOverflowsAndBacksOff) {
  zerotrain::JobSpec job = Job(PrecisionConfig::FP16, PrecisionConfig::FP16);
  // 2^40 overflows fp16 gradients for certain: the scaler must back off step by step.
  job.mutable_precision()->mutable_loss_scale()->set_initial_power(40);
  job.mutable_precision()->mutable_loss_scale()->set_hysteresis(1);
  const auto records = Train(job);
  ASSERT_EQ(records.size(), 40u);
  EXPECT_GT(records.back().skipped, 5);
  EXPECT_LT(records.back().loss_scale, std::ldexp(1.0, 40));
  // Once the scale fits, the remaining steps train.
  EXPECT_LT(records.back().loss, 0.85 * records.front().loss);
  for (size_t i = 1; i < records.size(); ++i) {
    EXPECT_GE(records[i].skipped, records[i - 1].skipped);
  }
}

// Split master weights hold the same fp32 master as a separate copy: the same weights at the
// start bit for bit, the bf16 parameters always the master's high halves, and training that
// follows the f32-master run — the two differ only where the master's low half is exactly a
// tie (2^-16 of values), which SplitMaster rounds away from zero and Cast to even.
TEST_F(MixedPrecisionTest, SplitMasterWeightsTrainLikeASeparateMaster) {
  for (auto optimizer : {zerotrain::OptimizerConfig::ADAMW, zerotrain::OptimizerConfig::ADAMW_8BIT,
                         zerotrain::OptimizerConfig::ADAFACTOR}) {
    SCOPED_TRACE(zerotrain::OptimizerConfig::Type_Name(optimizer));
    zerotrain::JobSpec job = Job(PrecisionConfig::BF16, PrecisionConfig::BF16);
    job.mutable_precision()->set_grad_dtype(PrecisionConfig::BF16);
    job.mutable_optimizer()->set_type(optimizer);
    job.mutable_optimizer()->set_min_quantized_numel(256);
    job.mutable_optimizer()->set_quant_block_size(256);
    // Adafactor at the same explicit step size as Adam (its relative step is slower here).
    job.mutable_optimizer()->mutable_adafactor()->set_relative_step(false);
    job.mutable_optimizer()->mutable_adafactor()->set_scale_parameter(false);
    job.mutable_train()->set_max_steps(20);
    zerotrain::JobSpec split = job;
    split.mutable_precision()->set_split_master_weights(true);

    auto trainer = Trainer::Create(ValidatedJob(split).value(), {}).value();
    auto reference = Trainer::Create(ValidatedJob(job).value(), {}).value();
    EXPECT_FALSE(trainer->arenas().Get("block.0.master").ok());
    EXPECT_EQ(trainer->arenas().Get("block.0.master_low").value().dtype(), DType::kI16);
    EXPECT_EQ(trainer->FullWeights().value(), reference->FullWeights().value());
    std::vector<double> losses, reference_losses;
    ASSERT_TRUE(trainer->Run([&](const StepRecord& r) { losses.push_back(r.loss); }).ok());
    ASSERT_TRUE(
        reference->Run([&](const StepRecord& r) { reference_losses.push_back(r.loss); }).ok());
    ASSERT_EQ(losses.size(), reference_losses.size());
    // A tie moves one bf16 weight by one ulp (2^-8 relative) for a step; bf16 activations
    // already carry that noise, and MixedPrecisionCheckpointingAndUntiedHeadUnderStageThree
    // bounds the same kind of divergence by 1e-3 of the loss.
    for (size_t s = 0; s < losses.size(); ++s) {
      EXPECT_NEAR(losses[s], reference_losses[s], 1e-3 * reference_losses[s]) << "step " << s;
    }
    EXPECT_LT(losses.back(), losses.front() - 0.3);  // it trains
    // The parameters are the high halves of the joined master, element for element.
    const std::vector<std::vector<float>> master = trainer->FullWeights().value();
    for (size_t u = 0; u < master.size(); ++u) {
      const Tensor params = trainer->model().unit_params()[u];
      for (int64_t i = 0; i < params.numel(); ++i) {
        ASSERT_EQ(params.data<uint16_t>()[i], SplitMaster(master[u][i]).high) << u << " " << i;
      }
    }
  }
}

TEST_F(MixedPrecisionTest, StochasticRoundingIsDeterministic) {
  zerotrain::JobSpec job = Job(PrecisionConfig::BF16, PrecisionConfig::BF16);
  job.mutable_precision()->set_stochastic_rounding(true);
  job.mutable_train()->set_max_steps(8);
  const auto a = Train(job);
  const auto b = Train(job);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].loss, b[i].loss) << i;
}

}  // namespace
}  // namespace zt
