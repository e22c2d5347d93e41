// Tests of worker/offload/swap_probe.h: the options a job configures, the checks naming each
// option, and a real probe of a temporary directory.
#include "worker/offload/swap_probe.h"

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/job/job_defaults.h"

namespace zt {
namespace {

using ::testing::HasSubstr;

class SwapProbeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("zt_swap_probe_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  SwapProbeOptions Small() const {
    return {.path = dir_.string(),
            .bytes = 100'000,
            .block_size = 64 << 10,
            .queue_depth = 4,
            .warn = [this](absl::string_view line) { warnings_.emplace_back(line); }};
  }
  std::filesystem::path dir_;
  mutable std::vector<std::string> warnings_;
};

TEST_F(SwapProbeTest, OptionsForAJobAreItsNvmePathAndAio) {
  zerotrain::JobSpec job;
  job.mutable_offload()->set_nvme_path("/mnt/nvme0");
  job.mutable_offload()->mutable_aio()->set_queue_depth(32);
  ApplyJobDefaults(&job);
  const SwapProbeOptions options = SwapProbeOptionsFor(job);
  EXPECT_EQ(options.path, "/mnt/nvme0");
  EXPECT_EQ(options.block_size, kDeepSpeedAioBlockSize);
  EXPECT_EQ(options.queue_depth, 32);
}

TEST_F(SwapProbeTest, WritesAndReadsBackWholeBlocksAndRemovesItsFile) {
  absl::StatusOr<SwapProbeResult> result = ProbeSwapBandwidth(Small());
  ASSERT_TRUE(result.ok()) << result.status();
  // 100000 bytes round up to two 64 KiB blocks.
  EXPECT_EQ(result->bytes, 2 * (64 << 10));
  EXPECT_GT(result->write_gb_per_s, 0);
  EXPECT_GT(result->read_gb_per_s, 0);
  // A filesystem that refuses O_DIRECT (tmpfs) is measured buffered, and says so.
  if (!result->direct_io) EXPECT_THAT(warnings_, ::testing::Contains(HasSubstr("O_DIRECT")));
  EXPECT_TRUE(std::filesystem::is_empty(dir_)) << "the probe's file must be removed";
}

TEST_F(SwapProbeTest, BadOptionsAndPathsAreRefusedNamingThem) {
  SwapProbeOptions options = Small();
  options.block_size = 1000;
  absl::StatusOr<SwapProbeResult> result = ProbeSwapBandwidth(options);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(result.status().message(),
              HasSubstr("block_size: 1000 is not a positive multiple of 4096"));

  options = Small();
  options.queue_depth = 0;
  result = ProbeSwapBandwidth(options);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(result.status().message(), HasSubstr("queue_depth: 0 is outside 1..4096"));

  options = Small();
  options.bytes = 0;
  result = ProbeSwapBandwidth(options);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(result.status().message(), HasSubstr("bytes: 0 is outside"));

  options = Small();
  options.path = (dir_ / "missing").string();
  result = ProbeSwapBandwidth(options);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(result.status().message(), HasSubstr(options.path));
}

}  // namespace
}  // namespace zt
