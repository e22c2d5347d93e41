// The model's forward against an independent reference: PyTorch in float64, implementing
// the published GPT-2 and Llama architectures from Hugging Face-layout weights
// (tests/reference/hf_model_loss.py), not from this code base. `zt train` trains a few steps,
// exports, and reports its validation loss; the reference must compute the same loss from the
// exported weights. Skipped, with the reason, where /usr/bin/python3 has no torch.

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/python_reference.h"
#include "worker/data/token_shard.h"

namespace zt {
namespace {

using testing::RunCommand;

struct Case {
  const char* family;
  int n_kv_head;
};

class ReferenceModelTest : public ::testing::TestWithParam<Case> {};

TEST_P(ReferenceModelTest, ValidationLossMatchesFloat64PyTorch) {
  if (!testing::SystemPythonHasTorch())
    GTEST_SKIP() << "/usr/bin/python3 cannot import torch (python3-torch)";
  const Case c = GetParam();
  const auto dir =
      testing::FreshScratchDir(std::string("reference-") + c.family + std::to_string(c.n_kv_head));
  const std::vector<int32_t> tokens = testing::StructuredTokens(6000, 48, 13, 4, 4);
  ASSERT_TRUE(WriteTokenShard((dir / "train.bin").string(), tokens, 48).ok());
  ASSERT_TRUE(WriteTokenShard((dir / "val.bin").string(),
                              std::vector<int32_t>(tokens.begin() + 3000, tokens.end()), 48)
                  .ok());
  const int B = 3, T = 24, steps = 6, eval_batches = 2;
  std::ofstream(dir / "job.yaml")
      << "name: reference\n"
      << "model: {family: " << c.family << ", n_layer: 2, n_head: 4, n_kv_head: " << c.n_kv_head
      << ", d_model: 32, vocab_size: 48, max_seq_len: 32, norm_eps: 1.0e-5,"
         " rope_theta: 10000, init_std: 0.1}\n"
      << "data: {train: [" << (dir / "train.bin").string() << "], val: ["
      << (dir / "val.bin").string() << "], seq_len: " << T << "}\n"
      << "train: {micro_batch_size: " << B << ", max_steps: " << steps
      << ", eval_interval: " << steps << ", eval_steps: " << eval_batches << "}\n"
      << "optimizer: {lr: 0.01}\n";
  testing::RunResult run =
      RunCommand(std::string(ZT_BINARY_DIR) + "/bin/zt train " + (dir / "job.yaml").string() +
                 " --quiet --run-dir " + (dir / "run").string() + " --export " +
                 (dir / "model.safetensors").string());
  ASSERT_EQ(run.exit_code, 0) << run.output;
  double ours = 0;
  {
    std::ifstream metrics(dir / "run" / "metrics.jsonl");
    std::string line, last;
    while (std::getline(metrics, line)) last = line;
    ours = nlohmann::json::parse(last).at("val_loss").get<double>();
  }
  std::ofstream(dir / "config.json") << nlohmann::json{
      {"family", c.family},       {"n_layer", 2},  {"n_head", 4},
      {"n_kv_head", c.n_kv_head}, {"d_model", 32}, {"eps", 1e-5},
      {"rope_theta", 10000.0},    {"batch", B},    {"seq_len", T},
      {"batches", eval_batches}}.dump();
  run = RunCommand("/usr/bin/python3 " + std::string(ZT_SOURCE_DIR) +
                   "/tests/reference/hf_model_loss.py " + (dir / "config.json").string() + " " +
                   (dir / "model.safetensors").string() + " " + (dir / "val.bin").string());
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const auto losses = nlohmann::json::parse(run.output.substr(run.output.find('{'))).at("losses");
  double reference = 0;
  for (const auto& l : losses) reference += l.get<double>();
  reference /= static_cast<double>(losses.size());
  // fp32 forward vs float64: ~1e-6 relative per op, a few dozen ops deep.
  EXPECT_NEAR(ours, reference, 1e-4 * reference) << c.family;
  // A model that learned nothing would sit at ln 48 ≈ 3.87: make sure it moved.
  EXPECT_LT(reference, 3.6);
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Families, ReferenceModelTest,
                         ::testing::Values(Case{"GPT2", 4}, Case{"LLAMA", 2}, Case{"LLAMA", 1}),
                         [](const auto& info) {
                           return std::string(info.param.family == std::string("GPT2") ? "Gpt2"
                                                                                       : "Llama") +
                                  "Kv" + std::to_string(info.param.n_kv_head);
                         });

}  // namespace
}  // namespace zt
