// The node's check of a job's inputs before its ranks start (worker/node/job_inputs_check.h):
// each problem with its own code, naming the field and the path.
#include "worker/node/job_inputs_check.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/data/token_shard.h"

namespace zt {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class JobInputsCheckTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("zt-inputs-" + std::to_string(::getpid()));
    fs::create_directories(dir_ / "data");
    fs::create_directories(dir_ / "outside");
    ASSERT_TRUE(WriteTokenShard(P("data/shard_0.bin"), {1, 2, 3}, 64).ok());
    ASSERT_TRUE(WriteTokenShard(P("data/shard_1.bin"), {4, 5}, 64).ok());
    ASSERT_TRUE(WriteTokenShard(P("outside/secret.bin"), {6}, 64).ok());
    spec_.mutable_data()->add_train(P("data/shard_*.bin"));
    spec_.mutable_checkpoint()->set_dir(P("ckpt/run"));
  }
  void TearDown() override {
    fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::add);
    fs::remove_all(dir_);
  }
  std::string P(const std::string& rel) const { return (dir_ / rel).string(); }
  AllowedRoots Roots() const { return AllowedRoots::Create({dir_.string()}).value(); }

  fs::path dir_;
  zerotrain::JobSpec spec_;
};

TEST_F(JobInputsCheckTest, GoodInputsPassAndTheCheckpointDirectoryIsCreated) {
  ASSERT_TRUE(CheckJobInputsOnNode(spec_, Roots()).ok());
  EXPECT_TRUE(fs::is_directory(P("ckpt/run")));
}

TEST_F(JobInputsCheckTest, APatternMatchingNothingIsNotFoundNamingIt) {
  spec_.mutable_data()->add_val(P("data/val_*.bin"));
  const absl::Status s = CheckJobInputsOnNode(spec_, Roots());
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("data.val[0]: pattern '" + P("data/val_*.bin") + "'"));
}

TEST_F(JobInputsCheckTest, AMatchThatIsNotAShardOrIsTruncatedNamesTheFile) {
  std::ofstream(P("data/shard_2.bin")) << "not a shard, longer than sixty-four bytes ........"
                                       << "..........................................";
  absl::Status s = CheckJobInputsOnNode(spec_, Roots());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("data.train[0]: '" + P("data/shard_2.bin") + "'"));
  fs::remove(P("data/shard_2.bin"));
  fs::resize_file(P("data/shard_1.bin"), fs::file_size(P("data/shard_1.bin")) - 1);
  s = CheckJobInputsOnNode(spec_, Roots());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr(P("data/shard_1.bin")));
}

TEST_F(JobInputsCheckTest, AMatchThatLinksOutOfTheRootsIsRefused) {
  fs::create_symlink(P("outside/secret.bin"), P("data/shard_9.bin"));
  const AllowedRoots roots = AllowedRoots::Create({P("data")}).value();
  spec_.mutable_checkpoint()->clear_dir();
  const absl::Status s = CheckJobInputsOnNode(spec_, roots);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("data.train[0] " + P("data/shard_9.bin")));
}

TEST_F(JobInputsCheckTest, ACheckpointDirectoryThatIsAFileIsRefused) {
  std::ofstream(P("ckpt-file")) << "x";
  spec_.mutable_checkpoint()->set_dir(P("ckpt-file"));
  const absl::Status s = CheckJobInputsOnNode(spec_, Roots());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("checkpoint.dir '" + P("ckpt-file") + "'"));
}

TEST_F(JobInputsCheckTest, AReadOnlyCheckpointDirectoryIsRefused) {
  if (::geteuid() == 0) GTEST_SKIP() << "root writes into a read-only directory";
  fs::create_directories(P("ro"));
  fs::permissions(P("ro"), fs::perms::owner_read | fs::perms::owner_exec);
  spec_.mutable_checkpoint()->set_dir(P("ro"));
  const absl::Status s = CheckJobInputsOnNode(spec_, Roots());
  fs::permissions(P("ro"), fs::perms::owner_all);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("checkpoint.dir '" + P("ro") + "' is not writable"));
}

}  // namespace
}  // namespace zt
