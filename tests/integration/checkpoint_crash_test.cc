// A training process killed with SIGKILL at arbitrary moments — in the middle of writing a
// checkpoint, before its rename, before `latest` moves — always leaves a loadable checkpoint,
// and `zt train --resume` goes on from it.
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/zt_process.h"
#include "worker/data/token_shard.h"

namespace zt {
namespace {

using testing::Clock;
using testing::ReadText;
using testing::RunZt;
using testing::ZtProcess;

class CheckpointCrashTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("zt-crash-test-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    std::vector<int32_t> tokens(20000);
    std::mt19937 rng(5);
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % 64);
    ASSERT_TRUE(WriteTokenShard((dir_ / "train.bin").string(), tokens, 64).ok());
    // A model whose state (≈ 30 MB per save with AdamW) takes a while to write and sync, so
    // kills land inside saves as often as between them; a save after every step.
    std::ofstream(dir_ / "job.yaml")
        << "name: crash\n"
           "model: {family: GPT2, n_layer: 4, n_head: 4, d_model: "
           "256, vocab_size: 64, max_seq_len: 32}\n"
           "data: {train: ['"
        << (dir_ / "train.bin").string()
        << "'], seq_len: 32}\n"
           "train: {micro_batch_size: 2, max_steps: 100000}\n"
           "optimizer: {lr: 1.0e-3}\n"
           "parallel: {world_size: 2, zero_stage: 3, "
           "comm_timeout_s: 30}\n"
           "resources: {cpu_threads: 1}\n"
           "checkpoint: {dir: '"
        << (dir_ / "ckpt").string() << "', interval_steps: 1, keep_last: 2}\n";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Arg(const char* name) const { return (dir_ / name).string(); }

  std::filesystem::path dir_;
};

// The step `latest` names, or -1.
int64_t LatestStep(const std::filesystem::path& ckpt) {
  const std::string latest = ReadText((ckpt / "latest").string());
  if (latest.size() < 13 || latest.rfind("step-", 0) != 0) return -1;
  return std::stoll(latest.substr(5, 8));
}

TEST_F(CheckpointCrashTest, KilledMidSaveTheRunResumesFromTheLastCompleteCheckpoint) {
  std::mt19937 rng(11);
  for (int kill = 0; kill < 4; ++kill) {
    std::vector<std::string> args = {"train", Arg("job.yaml"), "--run-dir", Arg("run"), "--quiet"};
    if (kill > 0) args.push_back("--resume");
    const int64_t before = LatestStep(dir_ / "ckpt");
    ZtProcess p(args, Arg("log"));
    ASSERT_TRUE(p.started());
    // Wait for a new checkpoint to appear, then kill at a random moment of the next ones.
    const auto deadline = Clock::now() + std::chrono::seconds(120);
    while (LatestStep(dir_ / "ckpt") <= before && Clock::now() < deadline && !p.Poll()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_GT(LatestStep(dir_ / "ckpt"), before) << p.Output();
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 400));
    p.Kill();
    // Whatever the kill interrupted, the latest checkpoint loads: one more step from it.
    const int64_t latest = LatestStep(dir_ / "ckpt");
    ASSERT_GT(latest, 0);
    const auto [code, output] =
        RunZt({"train", Arg("job.yaml"), "--run-dir", Arg("check"), "--quiet", "--resume",
               "--steps", std::to_string(latest + 1)},
              Arg("check.log"));
    ASSERT_EQ(code, 0) << "after kill " << kill << " (latest step " << latest << "): " << output;
    EXPECT_EQ(LatestStep(dir_ / "ckpt"), latest + 1);
  }
}

// offload.optimizer NVME: a process killed with SIGKILL while it swaps its optimizer states
// leaves the node's swap store open; the next process verifies it at open and the job resumes
// from its checkpoint to the very weights of the run that was never killed.
TEST_F(CheckpointCrashTest, NvmeRunKilledMidSwapResumesToTheUninterruptedWeights) {
  std::filesystem::create_directories(dir_ / "swap");
  // ≈ 3.2 M fp32 parameters: 25 MB of AdamW moments written (and synced) each step.
  const auto write_job =
      [&](const std::string& name, const std::string& ckpt) {
        std::ofstream(dir_ / name)
            << "name: nvme-crash\n"
               "model: {family: GPT2, n_layer: 4, n_head: 4, d_model: 256, vocab_size: 64, "
               "max_seq_len: 32}\n"
               "data: {train: ['"
            << (dir_ / "train.bin").string()
            << "'], seq_len: 32}\n"
               "train: {micro_batch_size: 2, max_steps: 30}\n"
               "optimizer: {lr: 1.0e-3}\n"
               "parallel: {world_size: 2, zero_stage: 2, comm_timeout_s: 30}\n"
               "resources: {cpu_threads: 1}\n"
               "offload: {optimizer: NVME, nvme_path: '"
            << (dir_ / "swap").string()
            << "', buffer_count: 4}\n"
               "checkpoint: {dir: '"
            << (dir_ / ckpt).string() << "', interval_steps: 2, keep_last: 2}\n";
      };
  write_job("straight.yaml", "straight-ckpt");
  write_job("killed.yaml", "killed-ckpt");
  const auto [straight_code, straight_output] =
      RunZt({"train", Arg("straight.yaml"), "--run-dir", Arg("straight-run"), "--quiet", "--export",
             Arg("straight-export")},
            Arg("straight.log"));
  ASSERT_EQ(straight_code, 0) << straight_output;

  ZtProcess p({"train", Arg("killed.yaml"), "--run-dir", Arg("killed-run"), "--quiet"},
              Arg("killed.log"));
  ASSERT_TRUE(p.started());
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  while (LatestStep(dir_ / "killed-ckpt") < 2 && Clock::now() < deadline && !p.Poll()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_GE(LatestStep(dir_ / "killed-ckpt"), 2) << p.Output();
  // Steps go by in a few hundred milliseconds here (30 of them, so that even a fast machine
  // is still training when the kill comes), their optimizer part swapping: somewhere mid-step.
  std::this_thread::sleep_for(std::chrono::milliseconds(std::mt19937(3)() % 300));
  p.Kill();
  ASSERT_FALSE(p.Poll() == 0) << "the run ended before the kill: " << p.Output();
  ASSERT_LT(LatestStep(dir_ / "killed-ckpt"), 30);

  const auto [code, output] = RunZt({"train", Arg("killed.yaml"), "--run-dir", Arg("killed-run"),
                                     "--resume", "--export", Arg("killed-export")},
                                    Arg("resumed.log"));
  ASSERT_EQ(code, 0) << output;
  // The store the killed process held was checked before it was trusted.
  EXPECT_THAT(output, ::testing::HasSubstr("was not closed cleanly"));
  EXPECT_THAT(output, ::testing::HasSubstr("committed extents verified"));
  // The exported weights (one safetensors file), byte for byte.
  const std::string straight = ReadText(Arg("straight-export"));
  ASSERT_FALSE(straight.empty());
  EXPECT_TRUE(ReadText(Arg("killed-export")) == straight)
      << "the resumed run's exported weights differ from the uninterrupted run's";
}

}  // namespace
}  // namespace zt
