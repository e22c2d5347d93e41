// The step loop end to end on the CPU: gradient accumulation, determinism, learning.
#include "worker/train/trainer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/worker/trainer/pattern_corpus.h"
#include "worker/data/token_shard.h"
#include "worker/job/job_loading.h"

namespace zt {
namespace {

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TestScratchDir("zt-trainer-test");
    const std::vector<int32_t> tokens = testing::PatternTokens();
    ASSERT_TRUE(WriteTokenShard((dir_ / "train.bin").string(), tokens, 32).ok());
    ASSERT_TRUE(WriteTokenShard((dir_ / "val.bin").string(),
                                std::vector<int32_t>(tokens.begin(), tokens.begin() + 4000), 32)
                    .ok());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  zerotrain::JobSpec Job(zerotrain::ModelConfig::Family family, int micro_batch, int accum) {
    zerotrain::JobSpec job;
    job.set_name("trainer");
    auto* m = job.mutable_model();
    m->set_family(family);
    m->set_n_layer(2);
    m->set_n_head(4);
    if (family == zerotrain::ModelConfig::LLAMA) m->set_n_kv_head(2);
    m->set_d_model(32);
    m->set_vocab_size(32);
    m->set_max_seq_len(16);
    job.mutable_data()->add_train((dir_ / "train.bin").string());
    job.mutable_data()->add_val((dir_ / "val.bin").string());
    job.mutable_data()->set_seq_len(16);
    job.mutable_train()->set_micro_batch_size(micro_batch);
    job.mutable_train()->set_grad_accum_steps(accum);
    job.mutable_train()->set_max_steps(30);
    job.mutable_train()->set_eval_interval(10);
    job.mutable_train()->set_eval_steps(2);
    job.mutable_optimizer()->set_lr(3e-3f);
    job.mutable_resources()->set_cpu_threads(2);
    return ValidatedJob(job).value();
  }

  std::unique_ptr<Trainer> Make(const zerotrain::JobSpec& job, const std::string& run) {
    TrainOptions options;
    options.run_dir = run.empty() ? "" : (dir_ / run).string();
    auto t = Trainer::Create(job, options);
    EXPECT_TRUE(t.ok()) << t.status();
    return std::move(t).value();
  }

  std::filesystem::path dir_;
};

TEST_F(TrainerTest, GradientAccumulationMatchesOneLargeMicroBatch) {
  // micro-batch 2 × 4 accumulation steps reads exactly the tokens of one micro-batch of 8.
  auto small = Make(Job(zerotrain::ModelConfig::GPT2, 2, 4), "");
  auto large = Make(Job(zerotrain::ModelConfig::GPT2, 8, 1), "");
  for (int s = 0; s < 3; ++s) {
    auto a = small->Step();
    auto b = large->Step();
    ASSERT_TRUE(a.ok() && b.ok());
    // The same sums in another order: fp32 reduction-order noise only.
    EXPECT_NEAR(a->loss, b->loss, 1e-5 * b->loss);
    EXPECT_NEAR(a->grad_norm, b->grad_norm, 1e-4 * b->grad_norm);
  }
  const auto& pa = small->model().unit_params();
  const auto& pb = large->model().unit_params();
  double worst = 0;
  for (size_t u = 0; u < pa.size(); ++u) {
    for (int64_t i = 0; i < pa[u].numel(); ++i) {
      worst = std::max<double>(worst, std::abs(pa[u].data<float>()[i] - pb[u].data<float>()[i]));
    }
  }
  // Adam normalises each update to ~lr (3e-3) per step; reduction-order differences in the
  // gradients (~1e-6 relative) move parameters by far less than 1e-5 over 3 steps.
  EXPECT_LT(worst, 1e-5);
}

std::vector<std::string> LossLines(const std::filesystem::path& metrics) {
  std::ifstream f(metrics);
  std::vector<std::string> out;
  std::string line;
  while (std::getline(f, line)) {
    nlohmann::json j = nlohmann::json::parse(line);
    // Timing fields differ between runs; everything else must not.
    j.erase("tokens_per_s");
    j.erase("step_ms");
    j.erase("comm_s");
    j.erase("comm_wait_s");
    j.erase("data_wait_s");
    j.erase("optimizer_s");
    j.erase("compute_s");
    out.push_back(j.dump());
  }
  return out;
}

TEST_F(TrainerTest, SameJobTwiceGivesBitwiseIdenticalMetrics) {
  for (auto family : {zerotrain::ModelConfig::GPT2, zerotrain::ModelConfig::LLAMA}) {
    zerotrain::JobSpec job = Job(family, 2, 2);
    job.mutable_data()->set_shuffle(true);
    job.mutable_train()->set_max_steps(8);
    ASSERT_TRUE(Make(job, "a")->Run().ok());
    ASSERT_TRUE(Make(job, "b")->Run().ok());
    const auto a = LossLines(dir_ / "a" / "metrics.jsonl");
    const auto b = LossLines(dir_ / "b" / "metrics.jsonl");
    ASSERT_EQ(a.size(), 8u);
    EXPECT_EQ(a, b);
  }
}

// A data.train pattern over the corpus cut into shards trains exactly as the one file: the
// matches are read in byte order (part_0, part_1, part_10, part_11, part_2, ...), the order the
// chunks were written in here.
TEST_F(TrainerTest, APatternOverShardsTrainsAsTheirConcatenation) {
  const std::vector<int32_t> tokens = testing::PatternTokens();
  constexpr int kParts = 12;
  std::vector<std::string> names;
  for (int i = 0; i < kParts; ++i) names.push_back("part_" + std::to_string(i) + ".bin");
  std::sort(names.begin(), names.end());
  const size_t chunk = (tokens.size() + kParts - 1) / kParts;
  std::filesystem::create_directories(dir_ / "parts");
  for (int k = 0; k < kParts; ++k) {
    const size_t begin = std::min(tokens.size(), k * chunk);
    const size_t end = std::min(tokens.size(), begin + chunk);
    ASSERT_TRUE(WriteTokenShard((dir_ / "parts" / names[k]).string(),
                                std::vector<int32_t>(tokens.begin() + begin, tokens.begin() + end),
                                32)
                    .ok());
  }
  zerotrain::JobSpec job = Job(zerotrain::ModelConfig::GPT2, 2, 1);
  job.mutable_data()->set_shuffle(true);
  job.mutable_train()->set_max_steps(8);
  ASSERT_TRUE(Make(job, "file")->Run().ok());
  job.mutable_data()->set_train(0, (dir_ / "parts" / "part_*.bin").string());
  ASSERT_TRUE(Make(job, "pattern")->Run().ok());
  const auto file = LossLines(dir_ / "file" / "metrics.jsonl");
  ASSERT_EQ(file.size(), 8u);
  EXPECT_EQ(LossLines(dir_ / "pattern" / "metrics.jsonl"), file);
}

TEST_F(TrainerTest, LossFallsAndValidationIsRecorded) {
  for (auto family : {zerotrain::ModelConfig::GPT2, zerotrain::ModelConfig::LLAMA}) {
    auto t = Make(Job(family, 4, 1), "run");
    std::vector<StepRecord> records;
    ASSERT_TRUE(t->Run([&](const StepRecord& r) { records.push_back(r); }).ok());
    ASSERT_EQ(records.size(), 30u);
    // The pattern is 7/8 predictable: 30 steps take the loss well below ln(32) ≈ 3.47.
    EXPECT_NEAR(records.front().loss, std::log(32.0), 0.3);
    EXPECT_LT(records.back().loss, 0.75 * records.front().loss);
    EXPECT_TRUE(records[9].val_loss.has_value());
    EXPECT_FALSE(records[10].val_loss.has_value());
    EXPECT_TRUE(records.back().val_loss.has_value());
  }
}

TEST_F(TrainerTest, StopAfterStepKeepsTheSchedule) {
  zerotrain::JobSpec job = Job(zerotrain::ModelConfig::GPT2, 2, 1);
  job.mutable_optimizer()->mutable_schedule()->set_decay(zerotrain::OptimizerConfig::COSINE);
  TrainOptions options;
  options.stop_after_step = 5;
  auto t = Trainer::Create(job, options).value();
  std::vector<StepRecord> records;
  ASSERT_TRUE(t->Run([&](const StepRecord& r) { records.push_back(r); }).ok());
  ASSERT_EQ(records.size(), 5u);
  auto full = Make(job, "");
  for (int s = 0; s < 5; ++s) {
    auto r = full->Step().value();
    EXPECT_EQ(r.lr, records[s].lr);
    EXPECT_EQ(r.loss, records[s].loss);
  }
}

// Issue 21: the step's parts, as zt_step_seconds_total{part} exports them, are each
// non-negative and add up to the step's wall time.
TEST_F(TrainerTest, StepTimePartsAddUpToTheStep) {
  auto t = Make(Job(zerotrain::ModelConfig::GPT2, 2, 1), "");
  for (int s = 0; s < 3; ++s) {
    const StepRecord r = t->Step().value();
    EXPECT_GE(r.data_wait_s, 0);
    EXPECT_GE(r.optimizer_s, 0);
    EXPECT_GE(r.comm_wait_s, 0);
    EXPECT_GT(r.compute_s, 0) << "forward and backward take time";
    // Sums of doubles of a few ms: far below a microsecond of rounding.
    EXPECT_NEAR(r.data_wait_s + r.optimizer_s + r.comm_wait_s + r.compute_s, r.step_ms / 1e3,
                1e-6);
  }
}

}  // namespace
}  // namespace zt
