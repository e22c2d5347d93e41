// AllowedRoots: paths under a root after symlinks, missing tails judged by their existing
// ancestor, ".." in a missing tail refused, every job field named, and no roots = no limit.
#include "worker/job/allowed_roots.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zt {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class AllowedRootsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("zt-roots-" + std::to_string(::getpid()));
    fs::create_directories(dir_ / "root" / "data");
    fs::create_directories(dir_ / "outside");
    std::ofstream(dir_ / "root" / "data" / "a.bin") << "x";
    std::ofstream(dir_ / "outside" / "b.bin") << "x";
    fs::create_symlink(dir_ / "outside", dir_ / "root" / "escape");
    fs::create_symlink(dir_ / "root" / "data", dir_ / "outside" / "into-root");
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(AllowedRootsTest, JudgesPathsAfterSymlinks) {
  const AllowedRoots roots = AllowedRoots::Create({(dir_ / "root").string()}).value();
  EXPECT_TRUE(roots.Check("f", (dir_ / "root" / "data" / "a.bin").string()).ok());
  EXPECT_TRUE(roots.Check("f", (dir_ / "root").string()).ok()) << "the root itself";
  EXPECT_TRUE(roots.Check("f", (dir_ / "outside" / "into-root" / "a.bin").string()).ok())
      << "a link from outside into the root resolves inside";
  const absl::Status escaped =
      roots.Check("data.val[2]", (dir_ / "root" / "escape" / "b.bin").string());
  EXPECT_EQ(escaped.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(escaped.message(),
              HasSubstr("data.val[2] " + (dir_ / "root" / "escape" / "b.bin").string()));
  EXPECT_THAT(escaped.message(), HasSubstr("resolves to " + (dir_ / "outside" / "b.bin").string()));
  // A sibling whose name starts like the root is not under it.
  fs::create_directories(dir_ / "root2");
  EXPECT_FALSE(roots.Check("f", (dir_ / "root2").string()).ok());
}

TEST_F(AllowedRootsTest, MissingTailsAreJudgedByTheirExistingAncestor) {
  const AllowedRoots roots = AllowedRoots::Create({(dir_ / "root").string()}).value();
  EXPECT_TRUE(roots.Check("checkpoint.dir", (dir_ / "root" / "new" / "ckpt").string()).ok());
  EXPECT_FALSE(roots.Check("checkpoint.dir", (dir_ / "root" / "escape" / "new").string()).ok());
  EXPECT_FALSE(
      roots.Check("checkpoint.dir", (dir_ / "root" / "new" / ".." / ".." / "outside").string())
          .ok())
      << "'..' beneath a missing directory";
}

TEST_F(AllowedRootsTest, CheckJobNamesEveryField) {
  const AllowedRoots roots = AllowedRoots::Create({(dir_ / "root").string()}).value();
  zerotrain::JobSpec job;
  job.mutable_data()->add_train((dir_ / "root" / "data" / "a.bin").string());
  job.mutable_data()->add_train((dir_ / "outside" / "b.bin").string());
  job.mutable_data()->add_val((dir_ / "outside" / "b.bin").string());
  job.mutable_model()->set_init_from((dir_ / "outside").string());
  job.mutable_checkpoint()->set_dir((dir_ / "outside" / "ckpt").string());
  const absl::Status s = roots.CheckJob(job);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), ::testing::Not(HasSubstr("data.train[0]")));
  for (const char* field : {"data.train[1]", "data.val[0]", "model.init_from", "checkpoint.dir"}) {
    EXPECT_THAT(s.message(), HasSubstr(field));
  }
}

TEST_F(AllowedRootsTest, NoRootsMeansNoRestrictionAndAMissingRootIsRefused) {
  const AllowedRoots none = AllowedRoots::Create({}).value();
  EXPECT_TRUE(none.Check("f", "/etc/passwd").ok());
  const absl::Status missing = AllowedRoots::Create({(dir_ / "nope").string()}).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.message(), HasSubstr("--allowed-root " + (dir_ / "nope").string()));
}

}  // namespace
}  // namespace zt
