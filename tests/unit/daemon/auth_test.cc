#include "daemon/auth.h"

#include <sys/stat.h>

#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/daemon/daemon_test_util.h"

namespace zt {
namespace {

using ::testing::HasSubstr;

TEST(AuthTest, TokenIsCreatedPrivateAndReused) {
  testing::TempDir dir;
  absl::StatusOr<std::string> first = EnsureToken(dir.path());
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->size(), 64u);
  EXPECT_EQ(first->find_first_not_of("0123456789abcdef"), std::string::npos);
  struct stat st;
  ASSERT_EQ(::stat(dir.Sub("token").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600);
  absl::StatusOr<std::string> second = EnsureToken(dir.path());
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(*second, *first);

  testing::TempDir other;
  // 32 random bytes: two directories sharing a token would mean the bytes are not random.
  EXPECT_NE(*EnsureToken(other.path()), *first);
}

TEST(AuthTest, TokenReadableByOthersIsRefusedNamingFileAndMode) {
  testing::TempDir dir;
  ASSERT_TRUE(EnsureToken(dir.path()).ok());
  ASSERT_EQ(::chmod(dir.Sub("token").c_str(), 0644), 0);
  absl::StatusOr<std::string> token = EnsureToken(dir.path());
  EXPECT_EQ(token.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(token.status().message(), HasSubstr(dir.Sub("token")));
  EXPECT_THAT(token.status().message(), HasSubstr("0644"));
}

TEST(AuthTest, GarbledTokenIsDataLoss) {
  testing::TempDir dir;
  {
    std::ofstream out(dir.Sub("token"));
    out << "not a token\n";
  }
  ASSERT_EQ(::chmod(dir.Sub("token").c_str(), 0600), 0);
  absl::StatusOr<std::string> token = EnsureToken(dir.path());
  EXPECT_EQ(token.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(token.status().message(), HasSubstr(dir.Sub("token")));
}

}  // namespace
}  // namespace zt
