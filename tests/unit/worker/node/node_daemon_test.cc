// NodeDaemon against an in-test coordinator: registration with its devices, heartbeats, a
// 2-rank job run to the end (its losses the same as the same job trained in-process), a cancel,
// a preemption, a path outside the allowed roots, and re-registration.
#include "worker/node/node_daemon.h"

#include <atomic>
#include <cmath>
#include <filesystem>
#include <sstream>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"
#include "tests/unit/worker/node/fake_coordinator.h"
#include "tests/unit/worker/trainer/pattern_corpus.h"
#include "tests/unit/worker/trainer/small_sharded_job.h"
#include "worker/checkpoint/checkpoint_directory.h"
#include "worker/comm/store.h"
#include "worker/data/token_shard.h"
#include "worker/job/job_loading.h"
#include "worker/train/trainer.h"

namespace zt {
namespace {

using ::testing::HasSubstr;
using zerotrain::RankExit;
using zerotrain::RankReport;

constexpr int64_t kDeviceMemory = int64_t{1} << 30;

// The step of the checkpoint `latest` names in `dir`.
int64_t LatestStepOf(const std::string& dir) {
  absl::StatusOr<std::string> latest = FindLatest(dir);
  EXPECT_TRUE(latest.ok()) << latest.status();
  if (!latest.ok()) return -1;
  return std::stoll(std::filesystem::path(*latest).filename().string().substr(5));
}

class NodeDaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TestScratchDir("zt-node-test");
    ASSERT_TRUE(WriteTokenShard((dir_ / "train.bin").string(), testing::PatternTokens(), 32).ok());
    coordinator_.state().heartbeat_interval_ms = 50;
    coordinator_.Start();
  }
  void TearDown() override {
    if (daemon_) daemon_->Shutdown();
    daemon_.reset();
    coordinator_.Stop();
    std::filesystem::remove_all(dir_);
  }

  void StartDaemon(std::vector<std::string> allowed_roots = {}) {
    NodeDaemonOptions options;
    options.coordinator.address = coordinator_.address();
    options.token = "secret";
    options.inventory = {.node_id = "node-a",
                         .cpu_devices = 2,
                         .device_memory_bytes = kDeviceMemory,
                         .force_cpu = true};
    options.allowed_roots = std::move(allowed_roots);
    options.registry = &registry_;
    absl::StatusOr<std::unique_ptr<NodeDaemon>> daemon = NodeDaemon::Create(options);
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = std::move(*daemon);
    ASSERT_TRUE(daemon_->Start().ok());
  }

  zerotrain::JobSpec Job(int64_t max_steps) {
    zerotrain::JobSpec job = testing::SmallShardedJob((dir_ / "train.bin").string(), 2, 3, 2);
    job.mutable_train()->set_max_steps(max_steps);
    job.mutable_checkpoint()->set_dir((dir_ / "ckpt").string());
    job.mutable_checkpoint()->set_interval_steps(1000);
    return ValidatedJob(job).value();
  }

  void Assign(const zerotrain::JobSpec& job, int attempt = 1) {
    zerotrain::Assignment a;
    zerotrain::StartRanks& start = *a.mutable_start();
    start.set_job_id("job-1");
    start.set_attempt(attempt);
    *start.mutable_spec() = job;
    for (int r = 0; r < 2; ++r) {
      zerotrain::RankPlacement& p = *start.add_ranks();
      p.set_rank(r);
      p.set_node_id("node-a");
      p.set_device(r);
    }
    start.set_run_dir((dir_ / "run").string());
    start.set_store_scope(absl::StrCat("job-1/", attempt));
    coordinator_.state().Push(std::move(a));
  }

  void Stop(zerotrain::StopRanks::Reason reason, int attempt = 1) {
    zerotrain::Assignment a;
    a.mutable_stop()->set_job_id("job-1");
    a.mutable_stop()->set_attempt(attempt);
    a.mutable_stop()->set_reason(reason);
    coordinator_.state().Push(std::move(a));
  }

  // Both ranks' exits, by rank.
  std::map<int, RankExit> WaitForExits() {
    EXPECT_TRUE(coordinator_.state().WaitFor([&] {
      int exits = 0;
      for (const RankReport& r : coordinator_.state().reports) exits += r.has_exit();
      return exits == 2;
    })) << "the ranks did not exit";
    std::map<int, RankExit> exits;
    for (const RankReport& r : coordinator_.state().Reports()) {
      if (r.has_exit()) exits[r.rank()] = r.exit();
    }
    return exits;
  }

  std::string MetricsText() {
    std::ostringstream text;
    prometheus::TextSerializer().Serialize(text, registry_.Collect());
    return text.str();
  }

  // Rank 0's losses of `job` trained in this process, every rank a thread.
  static std::vector<double> InProcessLosses(zerotrain::JobSpec job) {
    job.mutable_checkpoint()->clear_dir();  // the node's run used it; saving changes no loss
    InProcessStore store;
    std::vector<double> losses;
    std::vector<absl::Status> status(2);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        TrainOptions options{.rank = r, .store = &store};
        auto trainer = Trainer::Create(job, options);
        if (!trainer.ok()) {
          status[r] = trainer.status();
          return;
        }
        status[r] = (*trainer)->Run([&](const StepRecord& s) {
          if (r == 0) losses.push_back(s.loss);
        });
      });
    }
    for (std::thread& t : threads) t.join();
    for (const absl::Status& s : status) EXPECT_TRUE(s.ok()) << s;
    return losses;
  }

  std::filesystem::path dir_;
  testing::FakeCoordinator coordinator_{"secret"};
  prometheus::Registry registry_;
  std::unique_ptr<NodeDaemon> daemon_;
};

TEST_F(NodeDaemonTest, RegistersHeartbeatsAndRunsAJobToTheEnd) {
  std::string metrics_during_run;
  coordinator_.state().on_report = [&](const RankReport& r) {
    // Rank 0 waits for this answer, so its series exist while the text is taken.
    if (r.has_progress() && r.progress().step() == 2) metrics_during_run = MetricsText();
    return false;
  };
  StartDaemon();
  ASSERT_TRUE(coordinator_.state().WaitFor([&] {
    return !coordinator_.state().registrations.empty() && coordinator_.state().heartbeats >= 2;
  }));
  {
    const zerotrain::NodeInfo& info = coordinator_.state().registrations.front().info();
    EXPECT_EQ(info.id(), "node-a");
    ASSERT_EQ(info.devices_size(), 2);
    for (int d = 0; d < 2; ++d) {
      EXPECT_EQ(info.devices(d).index(), d);
      EXPECT_EQ(info.devices(d).kind(), zerotrain::ResourceConfig::CPU);
      EXPECT_EQ(info.devices(d).memory_bytes(), kDeviceMemory);
      EXPECT_GT(info.devices(d).peak_flops(), 0);
    }
    EXPECT_GT(info.host_memory_bytes(), 0);
  }

  const zerotrain::JobSpec job = Job(12);
  Assign(job);
  const std::map<int, RankExit> exits = WaitForExits();
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(exits.contains(r));
    EXPECT_EQ(exits.at(r).outcome(), RankExit::FINISHED) << exits.at(r).message();
    EXPECT_EQ(exits.at(r).checkpoint_step(), 12) << "the last step is always saved";
    EXPECT_FALSE(exits.at(r).preempted());
  }

  std::vector<double> reported;
  int started = 0;
  for (const RankReport& r : coordinator_.state().Reports()) {
    EXPECT_EQ(r.node_id(), "node-a");
    EXPECT_EQ(r.attempt(), 1);
    if (r.has_started()) {
      ++started;
      EXPECT_EQ(r.started().start_step(), 0);
      EXPECT_GT(r.started().planned().parameters(), 0);
      EXPECT_GT(r.started().planned().optimizer(), 0);
      // Set-up carves every model state from the arenas before the first step.
      EXPECT_EQ(r.started().measured().parameters(), r.started().planned().parameters());
      EXPECT_EQ(r.started().measured().optimizer(), r.started().planned().optimizer());
    }
    if (r.has_progress()) {
      EXPECT_EQ(r.rank(), 0) << "only rank 0 reports progress";
      EXPECT_EQ(r.progress().step(), static_cast<int64_t>(reported.size()) + 1);
      EXPECT_EQ(r.progress().max_steps(), 12);
      EXPECT_GT(r.progress().memory_bytes(), 0);
      EXPECT_GT(r.progress().tokens_per_s(), 0);
      reported.push_back(r.progress().loss());
    }
  }
  EXPECT_EQ(started, 2);
  // The node runs the engine unchanged: the same job in this process gives the same losses,
  // bit for bit (CPU runs are a function of the job file).
  EXPECT_EQ(reported, InProcessLosses(job));
  EXPECT_TRUE(std::filesystem::exists(dir_ / "run" / "metrics.jsonl"));

  for (const char* family : {"zt_step_duration_seconds_bucket", "zt_tokens_per_second",
                             "zt_model_tflops_per_second", "zt_mfu", "zt_loss", "zt_grad_norm",
                             "zt_learning_rate", "zt_loss_scale", "zt_skipped_steps_total",
                             "zt_memory_bytes", "zt_comm_bytes_total", "zt_comm_seconds_total"}) {
    EXPECT_THAT(metrics_during_run, HasSubstr(family));
  }
  EXPECT_THAT(metrics_during_run, HasSubstr(R"(job_id="job-1",node="node-a",rank="1")"));
  // The attempt ended: its series are gone.
  EXPECT_THAT(MetricsText(), ::testing::Not(HasSubstr("job-1")));
  EXPECT_TRUE(daemon_->Running().empty());
}

TEST_F(NodeDaemonTest, CancelStopsBothRanksAtTheSameStep) {
  coordinator_.state().on_report = [&](const RankReport& r) {
    if (r.has_progress() && r.progress().step() == 3) Stop(zerotrain::StopRanks::CANCEL);
    return false;
  };
  StartDaemon();
  Assign(Job(500));
  const std::map<int, RankExit> exits = WaitForExits();
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(exits.contains(r));
    EXPECT_EQ(exits.at(r).outcome(), RankExit::STOPPED) << exits.at(r).message();
    EXPECT_EQ(exits.at(r).checkpoint_step(), 0) << "a cancel saves nothing";
  }
  int64_t last = 0;
  for (const RankReport& r : coordinator_.state().Reports()) {
    if (r.has_progress()) last = r.progress().step();
  }
  EXPECT_GE(last, 3);
  EXPECT_LT(last, 500);
}

TEST_F(NodeDaemonTest, AStopAnswerToAReportStopsTheRanks) {
  coordinator_.state().on_report = [&](const RankReport& r) {
    return r.has_progress() && r.progress().step() >= 2;
  };
  StartDaemon();
  Assign(Job(500));
  const std::map<int, RankExit> exits = WaitForExits();
  for (int r = 0; r < 2; ++r) EXPECT_EQ(exits.at(r).outcome(), RankExit::STOPPED);
}

TEST_F(NodeDaemonTest, PreemptCheckpointsAndReportsPreempted) {
  StartDaemon();
  EXPECT_FALSE(daemon_->Preempt()) << "nothing runs yet";
  Assign(Job(500));
  ASSERT_TRUE(coordinator_.state().WaitFor([&] {
    for (const RankReport& r : coordinator_.state().reports) {
      if (r.has_progress() && r.progress().step() >= 3) return true;
    }
    return false;
  }));
  EXPECT_TRUE(daemon_->Preempt());
  // Preempt returns after both exits were reported.
  const std::map<int, RankExit> exits = WaitForExits();
  const int64_t saved = LatestStepOf((dir_ / "ckpt").string());
  EXPECT_GT(saved, 3);
  EXPECT_LT(saved, 500);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(exits.at(r).outcome(), RankExit::STOPPED) << exits.at(r).message();
    EXPECT_TRUE(exits.at(r).preempted());
    EXPECT_EQ(exits.at(r).checkpoint_step(), saved);
  }
  EXPECT_TRUE(daemon_->Running().empty());
}

TEST_F(NodeDaemonTest, APathOutsideTheAllowedRootsFailsNamingTheFieldAndPath) {
  std::filesystem::create_directories(dir_ / "allowed");
  // A symlink inside the root to data outside it is outside too.
  std::filesystem::create_symlink(dir_ / "train.bin", dir_ / "allowed" / "link.bin");
  StartDaemon({(dir_ / "allowed").string()});
  zerotrain::JobSpec job = Job(5);
  job.mutable_data()->set_train(0, (dir_ / "allowed" / "link.bin").string());
  job.mutable_checkpoint()->set_dir((dir_ / "allowed" / "ckpt").string());
  Assign(job);
  const std::map<int, RankExit> exits = WaitForExits();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(exits.at(r).outcome(), RankExit::FAILED);
    EXPECT_THAT(exits.at(r).message(), HasSubstr("PERMISSION_DENIED: data.train[0] "));
    EXPECT_THAT(exits.at(r).message(), HasSubstr((dir_ / "allowed" / "link.bin").string()));
    EXPECT_THAT(exits.at(r).message(), HasSubstr("outside the allowed roots"));
    EXPECT_THAT(exits.at(r).message(), ::testing::Not(HasSubstr("checkpoint.dir")))
        << "a checkpoint.dir that does not exist yet is judged by its parent";
  }
  for (const RankReport& r : coordinator_.state().Reports()) EXPECT_FALSE(r.has_started());
}

TEST_F(NodeDaemonTest, RegistersAgainWhenAskedReportingWhatRuns) {
  coordinator_.state().on_report = [&](const RankReport& r) {
    if (r.has_progress() && r.progress().step() == 2) {
      std::lock_guard<std::mutex> lock(coordinator_.state().mu);
      coordinator_.state().ask_register_again = true;
    }
    return false;
  };
  StartDaemon();
  Assign(Job(400));
  ASSERT_TRUE(
      coordinator_.state().WaitFor([&] { return coordinator_.state().registrations.size() >= 2; }));
  Stop(zerotrain::StopRanks::ABORT);
  WaitForExits();
  std::lock_guard<std::mutex> lock(coordinator_.state().mu);
  const zerotrain::RegisterRequest& again = coordinator_.state().registrations[1];
  ASSERT_EQ(again.running_size(), 1);
  EXPECT_EQ(again.running(0).job_id(), "job-1");
  EXPECT_EQ(again.running(0).attempt(), 1);
  EXPECT_THAT(again.running(0).ranks(), ::testing::ElementsAre(0, 1));
}

TEST_F(NodeDaemonTest, AWrongTokenIsRefusedAtStart) {
  NodeDaemonOptions options;
  options.coordinator.address = coordinator_.address();
  options.token = "wrong";
  options.inventory.force_cpu = true;
  auto daemon = NodeDaemon::Create(options);
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  absl::Status started = (*daemon)->Start();
  EXPECT_EQ(started.code(), absl::StatusCode::kUnauthenticated) << started;
  EXPECT_THAT(started.message(), HasSubstr(coordinator_.address()));
}

// offload.optimizer NVME through the node: the daemon opens the node's swap store once for the
// attempt and its two ranks (threads) share it; the run is the same job without offload, in
// this process, bit for bit.
TEST_F(NodeDaemonTest, RunsAJobWithOptimizerStatesOnNvmeOverOneSharedStore) {
  std::filesystem::create_directories(dir_ / "swap");
  zerotrain::JobSpec spec = testing::SmallShardedJob((dir_ / "train.bin").string(), 2, 2, 2);
  spec.mutable_train()->set_max_steps(4);
  spec.mutable_offload()->set_optimizer(zerotrain::OffloadConfig::NVME);
  spec.mutable_offload()->set_nvme_path((dir_ / "swap").string());
  spec.mutable_offload()->set_buffer_count(4);
  spec.mutable_offload()->set_buffer_size(64 * 4096);
  const zerotrain::JobSpec job = ValidatedJob(spec).value();
  std::string metrics_during_run;
  const std::filesystem::path store = dir_ / "swap" / "zerotrain-swap";
  std::atomic<bool> index_during_run = false, second_file_during_run = false,
                    third_file_during_run = false;
  coordinator_.state().on_report = [&](const RankReport& r) {
    if (r.has_progress() && r.progress().step() == 2) {
      metrics_during_run = MetricsText();
      index_during_run = std::filesystem::is_directory(store / "index");
      second_file_during_run = std::filesystem::exists(store / "swap-001.zts");
      third_file_during_run = std::filesystem::exists(store / "swap-002.zts");
    }
    return false;
  };
  StartDaemon();
  Assign(job);
  const std::map<int, RankExit> exits = WaitForExits();
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(exits.contains(r));
    EXPECT_EQ(exits.at(r).outcome(), RankExit::FINISHED) << exits.at(r).message();
  }
  std::vector<double> reported;
  for (const RankReport& r : coordinator_.state().Reports()) {
    if (r.has_progress()) reported.push_back(r.progress().loss());
  }
  zerotrain::JobSpec plain = spec;
  plain.mutable_offload()->set_optimizer(zerotrain::OffloadConfig::NONE);
  EXPECT_EQ(reported, InProcessLosses(ValidatedJob(plain).value()));
  // One store, a swap file per rank, under offload.nvme_path while the job runs; deleted when
  // the job's ranks have ended (its preallocated bytes do not outlive it).
  EXPECT_TRUE(index_during_run);
  EXPECT_TRUE(second_file_during_run);
  EXPECT_FALSE(third_file_during_run);
  EXPECT_FALSE(std::filesystem::exists(store));
  EXPECT_TRUE(std::filesystem::is_directory(dir_ / "swap"));
  // The swap's bytes reach the node's metrics: rank 0's written bytes after two steps.
  double swapped_out = 0;
  std::istringstream lines(metrics_during_run);
  for (std::string line; std::getline(lines, line);) {
    if (line.starts_with("zt_offload_bytes_total{") &&
        line.find(R"(direction="swap_out")") != std::string::npos &&
        line.find(R"(rank="0")") != std::string::npos) {
      swapped_out = std::stod(line.substr(line.rfind(' ') + 1));
    }
  }
  EXPECT_GT(swapped_out, 0) << metrics_during_run;
}

}  // namespace
}  // namespace zt
