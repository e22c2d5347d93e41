// Tests of `zt offload probe` (cli/offload_command.cc): it measures a temporary directory and
// prints its GB/s, and refuses bad flags and paths naming them.
#include <unistd.h>

#include <filesystem>
#include <string>

#include "cli/commands.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace zt::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;

class OffloadProbeCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("zt_offload_probe_cli_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  OffloadProbeFlags Flags() const {
    return {.path = dir_.string(), .block_size = "64KiB", .queue_depth = 4, .bytes = "1MiB"};
  }
  std::filesystem::path dir_;
};

TEST_F(OffloadProbeCommandTest, PrintsWriteAndReadBandwidthOfTheDirectory) {
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();  // a tmpfs refuses O_DIRECT, with a warning
  const absl::Status status = RunOffloadProbe(Flags());
  const std::string out = ::testing::internal::GetCapturedStdout();
  ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_THAT(out, MatchesRegex(dir_.string() +
                                ": write [0-9]+\\.[0-9]{3} GB/s, read [0-9]+\\.[0-9]{3} GB/s "
                                "\\(1\\.00 MiB at block size 64\\.0 KiB, queue depth 4; .*\\)\n"));
  EXPECT_TRUE(std::filesystem::is_empty(dir_));
}

TEST_F(OffloadProbeCommandTest, JsonHasEveryFigure) {
  OffloadProbeFlags flags = Flags();
  flags.json = true;
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  const absl::Status status = RunOffloadProbe(flags);
  const std::string out = ::testing::internal::GetCapturedStdout();
  ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(status.ok()) << status;
  const nlohmann::json j = nlohmann::json::parse(out);
  EXPECT_EQ(j["path"], dir_.string());
  EXPECT_EQ(j["bytes"], 1 << 20);
  EXPECT_EQ(j["block_size"], 64 << 10);
  EXPECT_EQ(j["queue_depth"], 4);
  EXPECT_GT(j["write_gb_per_s"].get<double>(), 0);
  EXPECT_GT(j["read_gb_per_s"].get<double>(), 0);
  EXPECT_TRUE(j["direct_io"].is_boolean());
  EXPECT_TRUE(j["io_uring"].is_boolean());
}

TEST_F(OffloadProbeCommandTest, RefusesBadSizesAndMissingDirectories) {
  OffloadProbeFlags flags = Flags();
  flags.block_size = "1000";
  absl::Status status = RunOffloadProbe(flags);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("block_size: 1000 is not a positive multiple of 4096"));

  flags = Flags();
  flags.bytes = "lots";
  status = RunOffloadProbe(flags);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("--bytes"));

  flags = Flags();
  flags.path = (dir_ / "missing").string();
  status = RunOffloadProbe(flags);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr(flags.path));
}

}  // namespace
}  // namespace zt::cli
