// Data patterns (worker/job/data_paths.h): expansion order, what a pattern may not do, and how
// validation, CheckJobPaths and the allowed roots treat one.
#include "worker/job/data_paths.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/job/test_jobs.h"
#include "worker/job/allowed_roots.h"
#include "worker/job/job_validation.h"

namespace zt {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class DataPathsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("zt-data-paths-" + std::to_string(::getpid()));
    fs::create_directories(dir_ / "d" / "shard_dir.bin");  // a directory the pattern matches
    for (const char* name : {"shard_10.bin", "shard_2.bin", "shard_1.bin", "other.txt"}) {
      std::ofstream(dir_ / "d" / name) << "x";
    }
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string P(const std::string& rel) const { return (dir_ / rel).string(); }
  fs::path dir_;
};

TEST_F(DataPathsTest, PatternsExpandInByteOrderSkippingDirectoriesAndKeepEntryOrder) {
  absl::StatusOr<std::vector<std::string>> files = ExpandDataPaths(
      std::vector<std::string>{P("d/other.txt"), P("d/shard_*.bin"), P("d/missing-plain.bin")},
      "data.train");
  ASSERT_TRUE(files.ok()) << files.status();
  // A plain path stays as written, unchecked: opening it names the missing file.
  EXPECT_THAT(*files, ElementsAre(P("d/other.txt"), P("d/shard_1.bin"), P("d/shard_10.bin"),
                                  P("d/shard_2.bin"), P("d/missing-plain.bin")));
  absl::StatusOr<std::vector<std::string>> one =
      ExpandDataPaths(std::vector<std::string>{P("d/shard_?.bin")}, "data.val");
  ASSERT_TRUE(one.ok());
  EXPECT_THAT(*one, ElementsAre(P("d/shard_1.bin"), P("d/shard_2.bin")));
}

TEST_F(DataPathsTest, APatternThatMatchesNothingIsNotFoundNamingIt) {
  const absl::Status s =
      ExpandDataPaths(std::vector<std::string>{P("d/shard_1.bin"), P("d/train_*.bin")},
                      "data.train")
          .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(),
              HasSubstr("data.train[1]: pattern '" + P("d/train_*.bin") + "' matches no file"));
  EXPECT_EQ(ExpandDataEntry(P("nodir/*.bin"), "data.val[0]").status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(DataPathsTest, AWildcardInTheDirectoryPartIsRefusedEverywhere) {
  EXPECT_EQ(ExpandDataEntry(P("*/shard_1.bin"), "data.train[0]").status().code(),
            absl::StatusCode::kInvalidArgument);
  zerotrain::JobSpec job = testing::JobWithDefaults(testing::kMinimalYaml);
  job.mutable_data()->add_train(P("d*/shard_*.bin"));
  const absl::Status s = ValidateJobSpec(job);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("data.train[1]: '" + P("d*/shard_*.bin") +
                                     "' has a wildcard in its directory part"));
}

TEST_F(DataPathsTest, CheckJobPathsExpandsPatterns) {
  zerotrain::JobSpec job;
  job.mutable_data()->add_train(P("d/shard_*.bin"));
  EXPECT_TRUE(CheckJobPaths(job).ok());
  job.mutable_data()->add_val(P("d/val_*.bin"));
  const absl::Status s = CheckJobPaths(job);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(),
              HasSubstr("data.val[0]: pattern '" + P("d/val_*.bin") + "' matches no file"));
}

TEST_F(DataPathsTest, AllowedRootsJudgeAPatternByItsDirectory) {
  fs::create_directories(dir_ / "outside");
  fs::create_symlink(dir_ / "outside", dir_ / "d" / "escape");
  const AllowedRoots roots = AllowedRoots::Create({P("d")}).value();
  zerotrain::JobSpec job;
  job.mutable_data()->add_train(P("d/shard_*.bin"));
  EXPECT_TRUE(roots.CheckJob(job).ok());
  job.mutable_data()->add_train(P("d/escape/*.bin"));
  const absl::Status s = roots.CheckJob(job);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("data.train[1] (the directory of pattern"));
}

}  // namespace
}  // namespace zt
