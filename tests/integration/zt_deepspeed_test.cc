// `zt estimate JOB --deepspeed DS_CONFIG` as a user runs it: the plan and the training settings
// follow the DeepSpeed config (worker/job/deepspeed_config.h), and a bad config exits 2 naming
// the field and the rule.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
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

  // --json carries the whole spec the config produced.
  const testing::RunResult j = RunZtCommand(
      "estimate " + job_ + " --json --world-size 2 --deepspeed " + Data("zero2_tutorial.json"));
  ASSERT_EQ(j.exit_code, 0) << j.output;
  const nlohmann::json out = nlohmann::json::parse(j.output);
  EXPECT_EQ(out.at("zero_stage"), 2);
  const nlohmann::json& spec = out.at("spec");
  EXPECT_EQ(spec.at("train").at("micro_batch_size"), 4);
  EXPECT_EQ(spec.at("train").at("grad_accum_steps"), 8);
  EXPECT_EQ(spec.at("precision").at("param_dtype"), "FP16");
  EXPECT_EQ(spec.at("parallel").at("bucket_bytes"), "100000000");  // int64: a JSON string
}

// (step, loss, lr) of every line of a run's metrics.jsonl.
std::vector<std::tuple<int64_t, double, double>> LossCurve(const std::filesystem::path& run_dir) {
  std::vector<std::tuple<int64_t, double, double>> curve;
  std::ifstream in(run_dir / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    curve.emplace_back(j.at("step").get<int64_t>(), j.at("loss").get<double>(),
                       j.at("lr").get<double>());
  }
  return curve;
}

// The mapping is the training: a job plus a DeepSpeed config trains bit for bit as the job file
// that writes the same settings out in ZeroTrain's own fields (the CPU is deterministic).
TEST_F(ZtDeepSpeedTest, TrainWithTheConfigEqualsTheJobFileThatSpellsItOut) {
  std::string text;
  for (int i = 0; i < 400; ++i)
    text += "line " + std::to_string(i * 7919 % 1000) + " of the corpus\n";
  std::ofstream(dir_ / "corpus.txt") << text;
  const std::string shard = (dir_ / "train.bin").string();
  testing::RunResult r = RunZtCommand("prepare " + (dir_ / "corpus.txt").string() +
                                      " --tokenizer bytes --out " + shard);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string model =
      "model: {family: GPT2, n_layer: 2, n_head: 2, d_model: 32, vocab_size: 256,"
      " max_seq_len: 32}\n"
      "data: {train: [" +
      shard + "], seq_len: 32}\n";
  const std::string job = (dir_ / "job.yaml").string();
  std::ofstream(job) << "name: ds\n"
                     << model
                     << "train: {micro_batch_size: 1, max_steps: 6}\noptimizer: {lr: 1.0e-3}\n";
  const std::string ds = (dir_ / "ds.json").string();
  std::ofstream(ds) << R"({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "betas": [0.9, 0.95],
                                               "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 6,
      "warmup_num_steps": 2, "cos_min_ratio": 0.1, "warmup_type": "linear"}},
    "gradient_clipping": 0.5, "zero_optimization": {"stage": 1}, "steps_per_print": 1})";
  const std::string spelled = (dir_ / "spelled.yaml").string();
  std::ofstream(spelled) << "name: ds\n"
                         << model
                         << "train: {micro_batch_size: 2, grad_accum_steps: 4, max_steps: 6}\n"
                            "optimizer: {type: ADAMW, lr: 2.0e-3, beta1: 0.9, beta2: 0.95,"
                            " eps: 1.0e-8, weight_decay: 0.1, grad_clip: 0.5,"
                            " schedule: {warmup_steps: 2, decay: COSINE, min_lr_ratio: 0.1}}\n"
                            "parallel: {zero_stage: 1}\n";
  r = RunZtCommand("train " + job + " --quiet --deepspeed " + ds + " --run-dir " +
                   (dir_ / "with-ds").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = RunZtCommand("train " + spelled + " --quiet --run-dir " + (dir_ / "spelled").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto with_ds = LossCurve(dir_ / "with-ds");
  ASSERT_EQ(with_ds.size(), 6u);
  EXPECT_EQ(with_ds, LossCurve(dir_ / "spelled"));
  // And the config did change the run: the job file alone trains another curve.
  r = RunZtCommand("train " + job + " --quiet --run-dir " + (dir_ / "job-only").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(with_ds, LossCurve(dir_ / "job-only"));
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

// A job id keeps the spec it was submitted with: a config beside it would be ignored, so it is
// refused before any coordinator is asked.
TEST_F(ZtDeepSpeedTest, ResumeTakesAConfigOnlyWithAJobFile) {
  const testing::RunResult r =
      RunZtCommand("resume no-such-job-7 --deepspeed " + Data("zero2_tutorial.json") +
                   " --coordinator 127.0.0.1:1 --timeout 1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--deepspeed: only with --job and a checkpoint directory"));
}

}  // namespace
}  // namespace zt
