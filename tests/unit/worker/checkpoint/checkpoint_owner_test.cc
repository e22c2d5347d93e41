// The owner record of a checkpoint directory (issue 20): which job's checkpoints it holds,
// so that no other job resumes from, interleaves with or prunes them unless asked to.
#include "worker/checkpoint/checkpoint_owner.h"

#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/checkpoint/checkpoint_test_util.h"

namespace zt {
namespace {

using ::testing::HasSubstr;

class CheckpointOwnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::temp_directory_path() /
            ("zt-owner-test-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(root_);
    dir_ = (root_ / "ckpt").string();
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  // A published step and `latest` naming it, as a save leaves them.
  void SaveStep() {
    std::filesystem::create_directories(dir_ + "/step-00000003");
    std::ofstream(dir_ + "/step-00000003/manifest.json") << "{}";
    std::ofstream(dir_ + "/latest") << "step-00000003";
  }

  std::filesystem::path root_;
  std::string dir_;
};

TEST_F(CheckpointOwnerTest, ARecordReadsBackAndAnAbsentOneIsNone) {
  absl::StatusOr<std::optional<CheckpointOwner>> none = ReadCheckpointOwner(dir_);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->has_value());
  ASSERT_TRUE(WriteCheckpointOwner(dir_, {.job_id = "train-7", .job_name = "train"}).ok());
  absl::StatusOr<std::optional<CheckpointOwner>> owner = ReadCheckpointOwner(dir_);
  ASSERT_TRUE(owner.ok() && owner->has_value()) << owner.status();
  EXPECT_EQ((*owner)->job_id, "train-7");
  EXPECT_EQ((*owner)->job_name, "train");
  EXPECT_GT((*owner)->claimed_unix_ms, 0);
  EXPECT_EQ(DescribeOwner(**owner), "job train-7 (train)");
  // Written through a temporary name that nothing is left under.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir_),
                          std::filesystem::directory_iterator()),
            1);
}

TEST_F(CheckpointOwnerTest, ACorruptRecordIsDataLossNamingTheFile) {
  std::filesystem::create_directories(dir_);
  for (const char* text : {"", "not json", "[1]", "{\"job_id\": 3}", "{\"job_id\": \"\"}"}) {
    std::ofstream(dir_ + "/owner") << text;
    absl::StatusOr<std::optional<CheckpointOwner>> owner = ReadCheckpointOwner(dir_);
    EXPECT_EQ(owner.status().code(), absl::StatusCode::kDataLoss) << text;
    EXPECT_THAT(owner.status().message(), HasSubstr(dir_ + "/owner")) << text;
  }
}

TEST_F(CheckpointOwnerTest, AnotherJobsCheckpointsAreRefusedUnlessTakenOver) {
  // An empty directory, or one only claimed, is anyone's to use.
  EXPECT_TRUE(CheckCheckpointOwnership(dir_, "b-2", false).ok());
  ASSERT_TRUE(WriteCheckpointOwner(dir_, {.job_id = "a-1", .job_name = "a"}).ok());
  EXPECT_TRUE(CheckCheckpointOwnership(dir_, "b-2", false).ok());

  SaveStep();
  EXPECT_TRUE(CheckCheckpointOwnership(dir_, "a-1", false).ok());
  const absl::Status refused = CheckCheckpointOwnership(dir_, "b-2", false);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("'" + dir_ + "' holds the checkpoints of job a-1 (a)"));
  EXPECT_THAT(refused.message(), HasSubstr("model.init_from"));
  EXPECT_TRUE(CheckCheckpointOwnership(dir_, "b-2", /*take_over=*/true).ok());

  // Claiming refuses the same way, and a take-over rewrites the record.
  EXPECT_EQ(ClaimCheckpointDirectory(dir_, {.job_id = "b-2"}, false).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(ClaimCheckpointDirectory(dir_, {.job_id = "b-2", .job_name = "b"}, true).ok());
  EXPECT_EQ((*ReadCheckpointOwner(dir_))->job_id, "b-2");
}

TEST_F(CheckpointOwnerTest, CheckpointsNoRecordClaimsAreRefused) {
  SaveStep();
  const absl::Status refused = CheckCheckpointOwnership(dir_, "local:x", false);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("holds checkpoints that no job claims"));
  EXPECT_TRUE(ClaimCheckpointDirectory(dir_, LocalRunOwner("x"), /*take_over=*/true).ok());
  EXPECT_EQ((*ReadCheckpointOwner(dir_))->job_id, "local:x");
}

}  // namespace
}  // namespace zt
