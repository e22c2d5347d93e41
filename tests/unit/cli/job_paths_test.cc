// Tests of cli/job_paths.h: what `zt submit` sends.
#include "cli/job_paths.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace zt::cli {
namespace {

TEST(AbsolutizeJobPathsTest, RelativePathsJoinTheDirectoryAbsoluteOnesStay) {
  zerotrain::JobSpec job;
  job.mutable_data()->add_train("data/train.bin");
  job.mutable_data()->add_train("/srv/shards/b.bin");
  job.mutable_data()->add_val("../val/./v.bin");
  job.mutable_model()->set_init_from("base");
  job.mutable_checkpoint()->set_dir("ckpt/");
  AbsolutizeJobPaths(&job, "/home/u/run");
  EXPECT_EQ(job.data().train(0), "/home/u/run/data/train.bin");
  EXPECT_EQ(job.data().train(1), "/srv/shards/b.bin");
  EXPECT_EQ(job.data().val(0), "/home/u/val/v.bin");
  EXPECT_EQ(job.model().init_from(), "/home/u/run/base");
  EXPECT_EQ(job.checkpoint().dir(), "/home/u/run/ckpt/");

  zerotrain::JobSpec empty;
  AbsolutizeJobPaths(&empty, "/home/u/run");
  EXPECT_TRUE(empty.model().init_from().empty());
  EXPECT_TRUE(empty.checkpoint().dir().empty());
}

class JobToSubmitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        std::filesystem::temp_directory_path() / ("zt_job_to_submit_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    old_cwd_ = std::filesystem::current_path();
    std::filesystem::current_path(dir_);
    std::ofstream("train.bin") << "tokens";
  }
  void TearDown() override {
    std::filesystem::current_path(old_cwd_);
    std::filesystem::remove_all(dir_);
  }
  void Write(const std::string& text) { std::ofstream("job.yaml") << text; }

  std::filesystem::path dir_, old_cwd_;
};

constexpr char kJob[] = R"(
name: tiny
model: {family: GPT2, n_layer: 2, n_head: 2, d_model: 64, vocab_size: 256, max_seq_len: 64}
data: {train: [train.bin], seq_len: 64}
train: {micro_batch_size: 2, max_steps: 3}
optimizer: {lr: 1.0e-3}
)";

TEST_F(JobToSubmitTest, SendsTheFileWithoutDefaultsAndWithAbsolutePaths) {
  Write(kJob);
  const absl::StatusOr<zerotrain::JobSpec> job = JobToSubmit("job.yaml");
  ASSERT_TRUE(job.ok()) << job.status();
  // The coordinator plans what the file leaves open.
  EXPECT_FALSE(job->parallel().has_zero_stage());
  EXPECT_EQ(job->memory().activation_checkpointing(),
            zerotrain::MemoryConfig::CHECKPOINTING_UNSPECIFIED);
  EXPECT_FALSE(job->parallel().has_world_size());
  EXPECT_EQ(job->data().train(0), (dir_ / "train.bin").lexically_normal().string());
}

TEST_F(JobToSubmitTest, RefusesMissingDataAndBadFieldsBeforeSending) {
  Write(std::string(kJob) + "parallel: {zero_stage: 7}\n");
  const absl::StatusOr<zerotrain::JobSpec> bad = JobToSubmit("job.yaml");
  ASSERT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("parallel.zero_stage"), std::string::npos);
  EXPECT_NE(bad.status().message().find("job.yaml"), std::string::npos);

  std::filesystem::remove("train.bin");
  Write(kJob);
  const absl::StatusOr<zerotrain::JobSpec> missing = JobToSubmit("job.yaml");
  ASSERT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("data.train[0]"), std::string::npos);
}

// `zt submit --deepspeed`: the config's settings travel in the spec; what neither file sets is
// still left for the coordinator to plan.
TEST_F(JobToSubmitTest, LaysTheDeepSpeedConfigOverTheFile) {
  Write(kJob);
  std::ofstream("ds.json") << R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4,
                                 "bf16": {"enabled": true}})";
  const absl::StatusOr<zerotrain::JobSpec> job = JobToSubmit("job.yaml", "ds.json");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->train().micro_batch_size(), 4);
  EXPECT_EQ(job->train().grad_accum_steps(), 4);
  EXPECT_EQ(job->precision().param_dtype(), zerotrain::PrecisionConfig::BF16);
  EXPECT_FALSE(job->parallel().has_zero_stage());
  EXPECT_FALSE(job->optimizer().has_beta1());

  std::ofstream("ds.json") << R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4,
                                 "gradient_accumulation_steps": 2})";
  const absl::StatusOr<zerotrain::JobSpec> bad = JobToSubmit("job.yaml", "ds.json");
  ASSERT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("ds.json: train_batch_size: 16 does not equal"),
            std::string::npos)
      << bad.status();
}

}  // namespace
}  // namespace zt::cli
