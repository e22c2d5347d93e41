// `zt estimate JOB --deepspeed DS_CONFIG` as a user runs it: the plan and the training settings
// follow the DeepSpeed config (worker/job/deepspeed_config.h), and a bad config exits 2 naming
// the field and the rule.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/zt_process.h"

namespace zt {
namespace {

using ::testing::HasSubstr;
using testing::RunZtCommand;

class ZtDeepSpeedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("zt-deepspeed-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    job_ = (dir_ / "job.yaml").string();
    // Estimating reads no data: the data file need not exist.
    std::ofstream(job_) << "name: ds-job\n"
                           "model: {family: GPT2, n_layer: 2, n_head: 4, d_model: 64,"
                           " vocab_size: 256, max_seq_len: 64}\n"
                           "data: {train: [missing.bin], seq_len: 32}\n"
                           "train: {micro_batch_size: 2, max_steps: 100}\n"
                           "optimizer: {lr: 1.5e-4}\n";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  static std::string Data(const std::string& name) {
    return std::string(ZT_SOURCE_DIR) + "/tests/data/deepspeed/" + name;
  }

  std::filesystem::path dir_;
  std::string job_;
};

TEST_F(ZtDeepSpeedTest, EstimateShowsThePlanTheConfigGives) {
  const testing::RunResult plain = RunZtCommand("estimate " + job_ + " --world-size 2");
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  EXPECT_THAT(plain.output, HasSubstr("world size 2, ZeRO stage 0"));

  const testing::RunResult r = RunZtCommand("estimate " + job_ + " --world-size 2 --deepspeed " +
                                            Data("zero2_tutorial.json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("world size 2, ZeRO stage 2"));
  // 64 sequences = 4 per rank × 8 × 2 ranks; fp16 halves the parameters' bytes.
  EXPECT_THAT(r.output,
              HasSubstr("batch: 4 per rank × 8 accumulation steps × 2 ranks = 64 sequences"));
  EXPECT_THAT(r.output, HasSubstr("precision: parameters FP16"));
  EXPECT_THAT(r.output, HasSubstr("optimizer: ADAMW lr 0.00015, betas (0.9, 0.95)"));
  EXPECT_THAT(r.output, HasSubstr("bytes/param\n  parameters"));
  EXPECT_NE(r.output, plain.output);
}

TEST_F(ZtDeepSpeedTest, BadConfigsExitTwoNamingTheFieldAndTheRule) {
  const std::string contradiction = (dir_ / "ds.json").string();
  std::ofstream(contradiction) << R"({"train_batch_size": 32,
    "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2})";
  testing::RunResult r = RunZtCommand("estimate " + job_ + " --deepspeed " + contradiction);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr(contradiction +
                                  ": train_batch_size: 32 does not equal "
                                  "train_micro_batch_size_per_gpu 4 × gradient_accumulation_steps "
                                  "2 × world size 1 = 8 (DeepSpeed's rule"));

  r = RunZtCommand("estimate " + job_ + " --deepspeed " + Data("bing_bert_lamb.json"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("optimizer.type: \"Lamb\" has no ZeroTrain equivalent"));

  std::ofstream(contradiction) << "{\"fp16\": {\"enabled\": true,}}";
  r = RunZtCommand("train " + job_ + " --deepspeed " + contradiction);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr(contradiction + ": malformed JSON: parse error at line 1"));
}

}  // namespace
}  // namespace zt
