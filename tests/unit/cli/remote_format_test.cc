// Tests of cli/remote_format.h: what `zt list`, `zt nodes`, `zt status` and `zt watch` print.
#include "cli/remote_format.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace zt::cli {
namespace {

zerotrain::Progress Halfway() {
  zerotrain::Progress p;
  p.set_step(150);
  p.set_max_steps(300);
  p.set_loss(2.45312);
  p.set_tokens_per_s(1234);
  p.set_step_ms(1000);
  p.set_memory_bytes(int64_t{650} << 20);
  return p;
}

TEST(FormatProgressLineTest, BarFillsTheWidthInProportionToTheSteps) {
  const std::string line = FormatProgressLine(Halfway(), 100);
  EXPECT_LE(line.size(), 100u);
  EXPECT_EQ(line.rfind("step 150/300 [", 0), 0u) << line;
  const size_t open = line.find('['), close = line.find(']');
  ASSERT_NE(close, std::string::npos);
  const std::string bar = line.substr(open + 1, close - open - 1);
  EXPECT_GE(bar.size(), 10u);
  // 150 of 300 steps: half the bar, rounded down.
  EXPECT_EQ(std::count(bar.begin(), bar.end(), '#'), static_cast<long>(bar.size() / 2)) << bar;
  EXPECT_NE(line.find(" 50%"), std::string::npos) << line;
  EXPECT_NE(line.find("loss 2.4531"), std::string::npos) << line;
  EXPECT_NE(line.find("1.2k tok/s"), std::string::npos) << line;
  EXPECT_NE(line.find("mem 650 MiB"), std::string::npos) << line;
  // 150 steps left at 1000 ms a step.
  EXPECT_NE(line.find("ETA 2m30s"), std::string::npos) << line;
  // The bar takes what the text leaves: the line uses the whole width.
  EXPECT_EQ(line.size(), 100u);
}

TEST(FormatProgressLineTest, NarrowTerminalsDropTheBarAndTruncate) {
  const std::string narrow = FormatProgressLine(Halfway(), 40);
  EXPECT_EQ(narrow.find('['), std::string::npos) << narrow;
  EXPECT_EQ(narrow.size(), 40u);
  EXPECT_EQ(narrow.rfind("step 150/300  50%", 0), 0u) << narrow;

  zerotrain::Progress open_ended = Halfway();
  open_ended.set_max_steps(0);
  const std::string line = FormatProgressLine(open_ended, 100);
  EXPECT_EQ(line.find('['), std::string::npos) << line;
  EXPECT_NE(line.find("ETA -"), std::string::npos) << line;
}

std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(text, '\n', absl::SkipEmpty());
}

TEST(FormatJobTableTest, OneAlignedRowPerJob) {
  google::protobuf::RepeatedPtrField<zerotrain::JobSummary> jobs;
  zerotrain::JobSummary* running = jobs.Add();
  running->set_id("tiny-12");
  running->set_state(zerotrain::Job::RUNNING);
  running->set_world_size(4);
  *running->mutable_progress() = Halfway();
  running->set_attempts(1);
  running->set_created_ms(1'000'000);
  zerotrain::JobSummary* pending = jobs.Add();
  pending->set_id("a-1");
  pending->set_state(zerotrain::Job::PENDING);

  const std::vector<std::string> lines = Lines(FormatJobTable(jobs, 1'000'000 + 5 * 60'000));
  ASSERT_EQ(lines.size(), 3u);
  const size_t state_column = lines[0].find("STATE");
  EXPECT_EQ(lines[1].find("RUNNING"), state_column);
  EXPECT_EQ(lines[2].find("PENDING"), state_column);
  EXPECT_EQ(lines[1].find("150/300"), lines[0].find("STEP"));
  for (const char* cell : {"2.4531", "1.2k", " 4 ", " 1 ", "5m"}) {
    EXPECT_NE(lines[1].find(cell), std::string::npos) << cell << " in " << lines[1];
  }
  EXPECT_NE(lines[2].find(" -"), std::string::npos) << lines[2];
}

TEST(FormatNodeTableTest, FreeDevicesMemoryJobsAndHeartbeat) {
  google::protobuf::RepeatedPtrField<zerotrain::Node> nodes;
  zerotrain::Node* node = nodes.Add();
  node->mutable_info()->set_id("node-a");
  node->set_healthy(true);
  for (int i = 0; i < 2; ++i) {
    zerotrain::DeviceInfo* d = node->mutable_info()->add_devices();
    d->set_index(i);
    d->set_memory_bytes((int64_t{8} << 30) + i);
  }
  node->add_free_devices(1);
  zerotrain::RunningAttempt* a = node->add_running();
  a->set_job_id("tiny-12");
  a->add_ranks(0);
  node->set_last_heartbeat_ms(10'000);

  const std::vector<std::string> lines = Lines(FormatNodeTable(nodes, 13'500));
  ASSERT_EQ(lines.size(), 2u);
  for (const char* cell : {"node-a", "yes", "2× CPU", "1/2", "8.00 GiB", "tiny-12", "3s ago"}) {
    EXPECT_NE(lines[1].find(cell), std::string::npos) << cell << " in " << lines[1];
  }
}

TEST(FormatNodeTableTest, DevicesAreGroupedByNameWithTheirComputeCapability) {
  google::protobuf::RepeatedPtrField<zerotrain::Node> nodes;
  zerotrain::Node* node = nodes.Add();
  node->mutable_info()->set_id("gpu-node");
  node->set_healthy(true);
  for (int i = 0; i < 3; ++i) {
    zerotrain::DeviceInfo* d = node->mutable_info()->add_devices();
    d->set_index(i);
    d->set_kind(zerotrain::ResourceConfig::CUDA);
    d->set_name(i < 2 ? "NVIDIA H100 80GB HBM3" : "NVIDIA A100-SXM4-40GB");
    d->set_compute_capability(i < 2 ? "9.0" : "8.0");
    d->set_memory_bytes(int64_t{40} << 30);
  }
  const std::vector<std::string> lines = Lines(FormatNodeTable(nodes, 0));
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[1].find("2× NVIDIA H100 80GB HBM3 (sm 9.0), 1× NVIDIA A100-SXM4-40GB (sm 8.0)"),
            std::string::npos)
      << lines[1];
}

TEST(FormatJobStatusTest, ShowsPlanAttemptsAndFailure) {
  zerotrain::Job job;
  job.set_id("tiny-3");
  job.set_state(zerotrain::Job::FAILED);
  job.mutable_plan()->set_world_size(2);
  job.mutable_plan()->mutable_chosen()->set_zero_stage(3);
  job.mutable_plan()->mutable_chosen()->set_activation_checkpointing(zerotrain::MemoryConfig::FULL);
  job.mutable_plan()->mutable_chosen()->set_peak_bytes_per_rank(int64_t{3} << 30);
  job.mutable_plan()->add_pinned("parallel.zero_stage");
  zerotrain::Attempt* attempt = job.add_attempts();
  attempt->set_number(1);
  zerotrain::RankPlacement* r = attempt->add_placement();
  r->set_rank(0);
  r->set_node_id("node-a");
  r->set_device(1);
  attempt->set_started_ms(1000);
  attempt->set_ended_ms(61'000);
  attempt->set_end_reason("node node-a missed 3 heartbeats");
  job.set_failure_reason("out of restarts");

  const std::string text = FormatJobStatus(job, 100'000);
  for (const char* part :
       {"tiny-3", "FAILED", "ZeRO stage 3", "FULL", "3.00 GiB per rank on 2 ranks",
        "pinned: parallel.zero_stage", "#1 0@node-a:1", "ran 1m",
        "ended: node node-a missed 3 heartbeats", "failure:  out of restarts"}) {
    EXPECT_NE(text.find(part), std::string::npos) << part << " in\n" << text;
  }
  EXPECT_EQ(text.back(), '\n');
}

TEST(FormatEventLineTest, TimeStateAndMessage) {
  zerotrain::JobEvent event;
  event.set_time_ms((12 * 3600 + 3 * 60 + 4) * 1000LL + 999);
  event.set_state(zerotrain::Job::RUNNING);
  event.set_message("placed on node-a:0-1");
  EXPECT_EQ(FormatEventLine(event), "[12:03:04] RUNNING: placed on node-a:0-1");
  event.set_message("step 150/300");
  *event.mutable_progress() = Halfway();
  const std::string progress = FormatEventLine(event);
  EXPECT_EQ(progress.rfind("[12:03:04] RUNNING: step 150/300  50%", 0), 0u) << progress;
}

}  // namespace
}  // namespace zt::cli
