// Tests of `zt estimate` with offload (cli/estimate_command.cc, cli/estimate_plan.cc): the
// three tiers (device, pinned host, NVMe) add up to the plan's total, and --plan shows the
// offload the planner chose, why, and every candidate's tiers.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_format.h"
#include "cli/commands.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace zt::cli {
namespace {

using ::testing::HasSubstr;

constexpr char kJob[] = R"(
name: offl
model: {family: GPT2, n_layer: 4, n_head: 4, d_model: 256, vocab_size: 256, max_seq_len: 64}
data: {train: [train.bin], seq_len: 16}
train: {micro_batch_size: 1, max_steps: 3}
optimizer: {lr: 1.0e-3}
precision: {param_dtype: BF16, grad_dtype: BF16}
parallel: {world_size: 2}
resources: {cpu_threads: 1, device_memory_bytes: 20000000}
)";

class EstimateOffloadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("zt_estimate_offload_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& text) {
    const std::string path = (dir_ / "job.yaml").string();
    std::ofstream(path) << text;
    return path;
  }
  std::string Run(const EstimateFlags& flags) {
    ::testing::internal::CaptureStdout();
    const absl::Status status = RunEstimate(flags);
    const std::string out = ::testing::internal::GetCapturedStdout();
    EXPECT_TRUE(status.ok()) << status;
    return out;
  }
  std::filesystem::path dir_;
};

TEST_F(EstimateOffloadTest, TiersAddUpToTheTotal) {
  std::string job = kJob;
  job.replace(job.find("parallel: {world_size: 2}"),
              std::string("parallel: {world_size: 2}").size(),
              "parallel: {world_size: 2, zero_stage: 2}");
  const std::string path = Write(
      job +
      "offload: {optimizer: NVME, nvme_path: /swap, buffer_count: 2, buffer_size: 2097152}\n");
  const nlohmann::json j = nlohmann::json::parse(Run({.job_file = path, .json = true}));
  const nlohmann::json& tiers = j["per_rank_by_tier"];
  EXPECT_EQ(j["offload"]["optimizer"], "NVME");
  EXPECT_EQ(tiers["pinned_host"], 2 * 2097152);  // the ring alone: the states are on NVMe
  EXPECT_EQ(tiers["nvme"], j["per_rank"]["nvme"]);
  EXPECT_GT(tiers["nvme"].get<int64_t>(), 0);
  EXPECT_EQ(j["per_rank"]["optimizer"], 0);
  EXPECT_EQ(tiers["device"].get<int64_t>() + tiers["pinned_host"].get<int64_t>() +
                tiers["nvme"].get<int64_t>(),
            j["per_rank"]["total"].get<int64_t>());
  EXPECT_EQ(j["device_memory_bytes"], 20000000);

  const std::string text = Run({.job_file = path});
  EXPECT_THAT(text, HasSubstr("where (offload.optimizer NVME, offload.params NONE):"));
  EXPECT_THAT(text, HasSubstr(absl::StrFormat("  %-14s %18d", "pinned host", 2 * 2097152)));
  EXPECT_THAT(text, HasSubstr("device budget (resources.device_memory_bytes) 19.1 MiB: "));
}

TEST_F(EstimateOffloadTest, ZeroStageFlagIsTheStageValidationSees) {
  // The job leaves the stage at its default 0, which optimizer offload does not allow;
  // --zero-stage 1 is what the estimate plans, so validation checks that.
  const std::string path =
      Write(std::string(kJob) + "offload: {optimizer: CPU, buffer_size: 2097152}\n");
  EXPECT_EQ(RunEstimate({.job_file = path, .json = true}).code(),
            absl::StatusCode::kInvalidArgument);
  const nlohmann::json j =
      nlohmann::json::parse(Run({.job_file = path, .zero_stage = 1, .json = true}));
  EXPECT_EQ(j["zero_stage"], 1);
  EXPECT_EQ(j["offload"]["optimizer"], "CPU");
}

// offload.delayed_update: the estimate says it is on, from which step, and the pinned host
// its buffers add (the plan's difference, exactly).
TEST_F(EstimateOffloadTest, ShowsTheDelayedUpdateAndItsHostBuffers) {
  std::string job = kJob;
  job.replace(job.find("parallel: {world_size: 2}"),
              std::string("parallel: {world_size: 2}").size(),
              "parallel: {world_size: 2, zero_stage: 1}");
  const nlohmann::json serial = nlohmann::json::parse(
      Run({.job_file = Write(job + "offload: {optimizer: CPU, buffer_size: 2097152}\n"),
           .json = true}));
  EXPECT_EQ(serial["offload"]["delayed_update"]["enabled"], false);
  EXPECT_EQ(serial["offload"]["delayed_update"]["pinned_host_bytes"], 0);
  const std::string path = Write(job +
                                 "offload: {optimizer: CPU, buffer_size: 2097152, "
                                 "delayed_update: {enabled: true, after_steps: 5}}\n");
  const nlohmann::json j = nlohmann::json::parse(Run({.job_file = path, .json = true}));
  EXPECT_EQ(j["offload"]["delayed_update"]["enabled"], true);
  EXPECT_EQ(j["offload"]["delayed_update"]["after_steps"], 5);
  const int64_t added = j["offload"]["delayed_update"]["pinned_host_bytes"].get<int64_t>();
  EXPECT_GT(added, 0);
  EXPECT_EQ(j["per_rank_by_tier"]["pinned_host"].get<int64_t>(),
            serial["per_rank_by_tier"]["pinned_host"].get<int64_t>() + added);
  EXPECT_EQ(j["per_rank_by_tier"]["device"], serial["per_rank_by_tier"]["device"]);
  EXPECT_THAT(Run({.job_file = path}),
              HasSubstr("delayed update (offload.delayed_update): after step 5, "));
  // NVMe offload: the serial step stages gradients through the ring, so both host banks are
  // the delayed update's.
  const auto nvme_job = [&](const std::string& delayed) {
    return Write(job + "offload: {optimizer: NVME, nvme_path: /tmp, buffer_count: 4, "
                       "buffer_size: 2097152" + delayed + "}\n");
  };
  const nlohmann::json nvme_serial =
      nlohmann::json::parse(Run({.job_file = nvme_job(""), .json = true}));
  const nlohmann::json nvme = nlohmann::json::parse(Run(
      {.job_file = nvme_job(", delayed_update: {enabled: true, after_steps: 5}"), .json = true}));
  const int64_t nvme_added = nvme["offload"]["delayed_update"]["pinned_host_bytes"].get<int64_t>();
  EXPECT_EQ(nvme_added, added / 2 * 3) << "a third bank's worth: the first gradient bank";
  EXPECT_EQ(nvme["per_rank_by_tier"]["pinned_host"].get<int64_t>(),
            nvme_serial["per_rank_by_tier"]["pinned_host"].get<int64_t>() + nvme_added);
}

// The layout is pinned to one tensor and one pipeline rank: this test is about the offload
// ladder, which --plan climbs only when no layout fits without offload (layouts:
// tests/unit/worker/plan/sharding_planner_layout_test.cc).
std::string WithOwnLayout(std::string job) {
  const std::string from = "parallel: {world_size: 2}";
  job.replace(job.find(from), from.size(),
              "parallel: {world_size: 2, tensor_parallel: 1, pipeline_parallel: 1}");
  return job;
}

TEST_F(EstimateOffloadTest, PlanShowsTheChosenOffloadAndWhy) {
  const std::string path = Write(WithOwnLayout(kJob) + "offload: {buffer_size: 2097152}\n");
  const std::string text = Run({.job_file = path, .plan = true});
  EXPECT_THAT(text, HasSubstr("devices of 19.1 MiB (resources.device_memory_bytes)"));
  EXPECT_THAT(text, HasSubstr("why: no candidate without offload fits"));
  EXPECT_THAT(text, HasSubstr("offload: optimizer CPU"));
  EXPECT_THAT(text, HasSubstr("NONE/NONE"));
  EXPECT_THAT(text, HasSubstr("offloading to NVME needs offload.nvme_path"));
  // Without the job's own budget, on a device large enough: no offload, and the reason
  // says so. (With it, the planner plans against the smaller of the two.)
  std::string unbudgeted = kJob;
  unbudgeted.erase(unbudgeted.find(", device_memory_bytes: 20000000"),
                   std::string(", device_memory_bytes: 20000000").size());
  const std::string roomy =
      Run({.job_file = Write(WithOwnLayout(unbudgeted) + "offload: {buffer_size: 2097152}\n"),
           .plan = true,
           .device_memory = "1GiB"});
  EXPECT_THAT(roomy, HasSubstr("why: the cheapest candidate that fits; no offload needed"));
  EXPECT_THAT(roomy, ::testing::Not(HasSubstr("CPU/NONE")));
}

}  // namespace
}  // namespace zt::cli
