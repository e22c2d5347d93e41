// `zt estimate` of a LoRA job (cli/estimate_command.cc): the frozen base by dtype, the
// adapters, their gradients and optimizer state, and the activations, in text and JSON; an
// NF4 and an INT8 base, and an INT8 base divided over the ranks at ZeRO stage 3.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "cli/commands.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace zt::cli {
namespace {

using ::testing::HasSubstr;

constexpr char kJob[] = R"(
name: qlora
model: {family: LLAMA, n_layer: 2, n_head: 4, d_model: 128, vocab_size: 256, max_seq_len: 64,
        base_dtype: NF4, lora: {rank: 8, target_modules: [q_proj, v_proj]}}
data: {train: [train.bin], seq_len: 16}
train: {micro_batch_size: 1, max_steps: 3}
optimizer: {lr: 1.0e-3}
resources: {cpu_threads: 1}
)";

class EstimateLoraTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        std::filesystem::temp_directory_path() / ("zt_estimate_lora_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / "job.yaml").string();
    std::ofstream(path_) << kJob;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Run(const EstimateFlags& flags) {
    ::testing::internal::CaptureStdout();
    const absl::Status status = RunEstimate(flags);
    const std::string out = ::testing::internal::GetCapturedStdout();
    EXPECT_TRUE(status.ok()) << status;
    return out;
  }
  std::filesystem::path dir_;
  std::string path_;
};

TEST_F(EstimateLoraTest, ShowsBaseAdaptersTheirStatesAndActivations) {
  const std::string text = Run({.job_file = path_});
  // Per block: q and v each A (8, 128) + B (128, 8) (v: n_kv_head 4 · head size 32): 4096.
  EXPECT_THAT(text, HasSubstr("LoRA (rank 8 on 8192 adapter parameters; base NF4, frozen):"));
  for (const char* row : {"base", "adapters", "adapter grads", "adapter optim", "activations"}) {
    EXPECT_THAT(text, HasSubstr(std::string("  ") + row + " ")) << row;
  }

  const nlohmann::json j = nlohmann::json::parse(Run({.job_file = path_, .json = true}));
  const nlohmann::json& lora = j["lora"];
  EXPECT_EQ(lora["base_dtype"], "NF4");
  // Every parameter counts, the NF4 weights outside the flat buffers included.
  EXPECT_EQ(j["parameters"],
            2 * 256 * 128 + 5 * 128 + 2 * (384 * 128 + 128 * 128 + 768 * 128 + 128 * 384));
  EXPECT_EQ(lora["adapter_parameters"], 8192);
  EXPECT_EQ(lora["adapter_bytes"], 8192 * 4);           // f32, 64-byte aligned already
  EXPECT_EQ(lora["adapter_gradient_bytes"], 8192 * 4);  // the job's only gradients
  EXPECT_EQ(j["per_rank"]["gradients"], 8192 * 4);
  EXPECT_EQ(lora["adapter_optimizer_bytes"], 2 * 8192 * 4);  // AdamW m and v
  EXPECT_EQ(j["per_rank"]["optimizer"], 2 * 8192 * 4);
  EXPECT_EQ(lora["activation_bytes"], j["per_rank"]["activations"]);
  // The base: NF4 blocks (~0.52 bytes per linear weight) plus f32 embeddings, norms and head.
  // Per block: qkv (384, 128), o (128, 128), gate|up (768, 128), down (128, 384); d_ff 384.
  const int64_t linear = 2 * (384 * 128 + 128 * 128 + 768 * 128 + 128 * 384);
  const int64_t rest = 4 * (2 * 256 * 128 + 5 * 128);
  EXPECT_GT(lora["base_bytes"].get<int64_t>(), rest + linear / 2);
  EXPECT_LT(lora["base_bytes"].get<int64_t>(), rest + linear * 6 / 10);
}

// An INT8 base: shown by its dtype, and exactly one byte per linear weight and an f32 scale per
// output row (each buffer placed 64-byte aligned) beside the f32 rest.
TEST_F(EstimateLoraTest, ShowsAnInt8BaseByteForByte) {
  std::string job = kJob;
  job.replace(job.find("base_dtype: NF4"), 15, "base_dtype: INT8");
  std::ofstream(path_, std::ios::trunc) << job;
  EXPECT_THAT(Run({.job_file = path_}),
              HasSubstr("LoRA (rank 8 on 8192 adapter parameters; base INT8, frozen):"));
  const nlohmann::json j = nlohmann::json::parse(Run({.job_file = path_, .json = true}));
  EXPECT_EQ(j["lora"]["base_dtype"], "INT8");
  auto aligned = [](int64_t bytes) { return (bytes + 63) / 64 * 64; };
  // Per block: qkv (384, 128), o (128, 128), gate|up (768, 128), down (128, 384): codes and
  // scales; the block's two RMSNorm weights stay f32 in "<block>.params".
  int64_t block = aligned(2 * 128 * 4);
  for (const auto& [rows, cols] :
       {std::pair<int64_t, int64_t>{384, 128}, {128, 128}, {768, 128}, {128, 384}}) {
    block += aligned(rows * cols) + aligned(4 * rows);
  }
  const int64_t rest = aligned(4 * 256 * 128) + aligned(4 * (128 + 256 * 128));  // wte; ln_f, head
  EXPECT_EQ(j["lora"]["base_bytes"], rest + 2 * block);
}

// At ZeRO stage 3 on 2 ranks each rank holds half of every unit: the f32 rest's shards and each
// block's quantized bytes (codes and scales laid end to end, 64-byte aligned pieces) padded to
// the shard quantum (64 elements a rank) and halved.
TEST_F(EstimateLoraTest, ShowsAnInt8BaseDividedOverTheRanksAtStageThree) {
  std::string job = kJob;
  job.replace(job.find("base_dtype: NF4"), 15, "base_dtype: INT8");
  job += "parallel: {world_size: 2, zero_stage: 3}\n";
  std::ofstream(path_, std::ios::trunc) << job;
  const nlohmann::json j = nlohmann::json::parse(Run({.job_file = path_, .json = true}));
  auto aligned = [](int64_t bytes) { return (bytes + 63) / 64 * 64; };
  auto half = [&](int64_t elements) {  // f32 elements (or words) of one unit: a rank's shard
    const int64_t padded = (elements + 127) / 128 * 128;
    return aligned(4 * (padded / 2));
  };
  int64_t quantized = 0;  // one block's INT8 bytes
  for (const auto& [rows, cols] :
       {std::pair<int64_t, int64_t>{384, 128}, {128, 128}, {768, 128}, {128, 384}}) {
    quantized += aligned(rows * cols) + aligned(4 * rows);
  }
  const int64_t block = half(2 * 128) + half(quantized / 4);
  const int64_t rest = half(256 * 128) + half(128 + 256 * 128);  // wte; ln_f and head
  EXPECT_EQ(j["lora"]["base_bytes"], rest + 2 * block);
}

}  // namespace
}  // namespace zt::cli
