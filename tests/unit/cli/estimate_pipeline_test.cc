// Tests of `zt estimate` for a pipelined ZeRO-3 job (cli/estimate_command.cc): each pipeline
// stage's plan is shown, with the bytes of its gathered units, which a stage that reshards
// after each forward keeps to a pool of prefetch_units + 1 while a stage that keeps its units
// gathered for the step holds them all.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "cli/commands.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "worker/job/job_loading.h"
#include "worker/parallel/parallel_layout.h"
#include "worker/plan/gathered_units.h"
#include "worker/plan/memory_plan.h"

namespace zt::cli {
namespace {

using ::testing::HasSubstr;

constexpr char kJob[] = R"(
name: pp
model: {family: GPT2, n_layer: 4, n_head: 4, d_model: 64, vocab_size: 256, max_seq_len: 64}
data: {train: [train.bin], seq_len: 16}
train: {micro_batch_size: 1, max_steps: 3}
optimizer: {lr: 1.0e-3}
parallel: {world_size: 4, pipeline_parallel: 2, zero_stage: 3, micro_batches: 4, )";

// `zt estimate` of the job file at `path` (its text output, or its JSON with `json`).
std::string Estimate(const std::string& path, bool json) {
  ::testing::internal::CaptureStdout();
  const absl::Status status = RunEstimate({.job_file = path, .json = json});
  std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

TEST(EstimatePipelineTest, ShowsEachStagesGatheredUnits) {
  const std::filesystem::path path = std::filesystem::path(::testing::TempDir()) /
                                     absl::StrCat("zt_estimate_pipeline_", ::getpid(), ".yaml");
  int64_t gathered[2][2] = {};  // [reshard][stage]
  for (const bool reshard : {false, true}) {
    std::ofstream(path) << kJob << "reshard_after_forward: " << (reshard ? "true" : "false")
                        << "}\n";
    const nlohmann::json j = nlohmann::json::parse(Estimate(path.string(), /*json=*/true));
    const zerotrain::JobSpec job =
        LoadValidatedJob(path.string(), {.check_paths = false, .check_engine_support = false})
            .value();
    ASSERT_EQ(j["per_pipeline_stage"].size(), 2u);
    for (int s = 0; s < 2; ++s) {
      // The stage's first rank (tensor 0, data 0): rank s · dp.
      const MemoryPlan plan = PlanMemory(job, ParallelLayout::ForJob(job, 2 * s));
      EXPECT_EQ(j["per_pipeline_stage"][s]["total"], plan.TotalBytes()) << reshard << s;
      EXPECT_EQ(j["per_pipeline_stage"][s]["gathered_units"], GatheredUnitBytes(plan))
          << reshard << s;
      gathered[reshard][s] = GatheredUnitBytes(plan);
      EXPECT_GT(gathered[reshard][s], 0);
    }
    EXPECT_EQ(j["gathered_units_per_rank"], gathered[reshard][0]);
    const std::string text = Estimate(path.string(), /*json=*/false);
    EXPECT_THAT(text, HasSubstr("per pipeline stage:"));
    EXPECT_THAT(text, HasSubstr("gathered units"));
  }
  std::filesystem::remove(path);
  for (int s = 0; s < 2; ++s) EXPECT_LT(gathered[1][s], gathered[0][s]) << "stage " << s;
}

}  // namespace
}  // namespace zt::cli
