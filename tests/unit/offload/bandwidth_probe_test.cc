#include "offload/bandwidth_probe.h"

#include <filesystem>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/offload/offload_test_util.h"

namespace zt::offload {
namespace {

using ::testing::HasSubstr;
using testing::TempDir;

TEST(BandwidthProbeTest, MeasuresAndRemovesItsFile) {
  TempDir dir;
  auto result = ProbeBandwidth(
      {.path = dir.path(), .bytes = 6 << 20, .block_size = 1 << 20, .queue_depth = 4});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->bytes, uint64_t{6} << 20);
  EXPECT_GT(result->write_gb_per_s, 0);
  EXPECT_GT(result->read_gb_per_s, 0);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(BandwidthProbeTest, BadOptionsAndPathsAreNamed) {
  TempDir dir;
  const std::string missing = dir.path() + "/missing";
  auto r = ProbeBandwidth({.path = missing, .bytes = 1 << 20});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr(missing));
  r = ProbeBandwidth({.path = dir.path(), .bytes = 1 << 20, .block_size = 1000});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("block_size 1000"));
  r = ProbeBandwidth({.path = dir.path(), .bytes = 1 << 20, .queue_depth = 0});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("queue_depth 0"));
}

}  // namespace
}  // namespace zt::offload
