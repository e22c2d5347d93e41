// Owner-only files: a token file others can read is refused with its mode and the fix, and
// files written for ztd's user are 0600 whatever the umask or an older file's mode.
#include "worker/node/secret_file.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zt {
namespace {

using ::testing::HasSubstr;

class SecretFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/zt-secret-test-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = pattern;
    ::unsetenv("ZT_TOKEN");
    ::unsetenv("ZT_STATE_DIR");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, mode_t mode) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << "secret\n";
    EXPECT_EQ(::chmod(path.c_str(), mode), 0);
    return path;
  }
  static mode_t ModeOf(const std::string& path) {
    struct stat st;
    EXPECT_EQ(::stat(path.c_str(), &st), 0);
    return st.st_mode & 07777;
  }

  std::string dir_;
};

TEST_F(SecretFileTest, FileReadableByGroupOrOthersIsRefusedWithItsModeAndTheFix) {
  for (const mode_t mode : {0644, 0640, 0604, 0602, 0660, 0601}) {
    const std::string path = Write("token", mode);
    const absl::Status status = CheckOwnerOnlyFile(path, "token file");
    EXPECT_TRUE(absl::IsFailedPrecondition(status)) << std::oct << mode << " " << status;
    std::ostringstream octal;
    octal << "0" << std::oct << mode;
    EXPECT_THAT(status.message(), HasSubstr(path));
    EXPECT_THAT(status.message(), HasSubstr(octal.str()));
    EXPECT_THAT(status.message(), HasSubstr("chmod 600"));
  }
  EXPECT_TRUE(CheckOwnerOnlyFile(Write("token", 0600), "token file").ok());
  EXPECT_TRUE(CheckOwnerOnlyFile(Write("token", 0400), "token file").ok());
  EXPECT_TRUE(CheckOwnerOnlyFile(dir_ + "/absent", "token file").ok())
      << "a missing file is for its reader to report";
}

TEST_F(SecretFileTest, TokenFileFollowsResolveTokensOrder) {
  EXPECT_EQ(TokenFileFor(""), std::nullopt);
  ::setenv("ZT_STATE_DIR", dir_.c_str(), 1);
  EXPECT_EQ(TokenFileFor(""), dir_ + "/token");
  ::setenv("ZT_TOKEN", "abc", 1);
  EXPECT_EQ(TokenFileFor(""), std::nullopt) << "$ZT_TOKEN comes before $ZT_STATE_DIR";
  EXPECT_EQ(TokenFileFor("/x/t"), "/x/t") << "the flag comes first";
  ::unsetenv("ZT_TOKEN");
  Write("token", 0644);
  EXPECT_TRUE(absl::IsFailedPrecondition(CheckTokenFile("")));
}

TEST_F(SecretFileTest, WrittenFilesAreOwnerOnlyWhateverTheUmaskOrTheOldMode) {
  const mode_t old_umask = ::umask(0);
  const std::string path = dir_ + "/address";
  ASSERT_TRUE(WriteOwnerOnlyFileAtomically(path, "127.0.0.1:1\n").ok());
  EXPECT_EQ(ModeOf(path), 0600u);
  ASSERT_EQ(::chmod(path.c_str(), 0666), 0);
  ASSERT_TRUE(WriteOwnerOnlyFileAtomically(path, "127.0.0.1:2\n").ok());
  ::umask(old_umask);
  EXPECT_EQ(ModeOf(path), 0600u);
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "127.0.0.1:2");
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

}  // namespace
}  // namespace zt
