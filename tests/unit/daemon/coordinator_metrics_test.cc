#include "daemon/coordinator_metrics.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "tests/unit/daemon/daemon_test_util.h"

namespace zt {
namespace {

// The value of the sample of `family` whose labels include `label`=`value` (any when empty).
double Sample(prometheus::Registry& registry, const std::string& family, const std::string& label,
              const std::string& value) {
  for (const prometheus::MetricFamily& f : registry.Collect()) {
    if (f.name != family) continue;
    for (const prometheus::ClientMetric& m : f.metric) {
      bool match = label.empty();
      for (const prometheus::ClientMetric::Label& l : m.label) {
        match = match || (l.name == label && l.value == value);
      }
      if (!match) continue;
      if (f.type == prometheus::MetricType::Histogram) {
        return static_cast<double>(m.histogram.sample_count);
      }
      return f.type == prometheus::MetricType::Counter ? m.counter.value : m.gauge.value;
    }
  }
  ADD_FAILURE() << "no sample " << family << "{" << label << "=" << value << "}";
  return -1;
}

TEST(CoordinatorMetricsTest, JobsNodesRestartsAndRpcLatency) {
  testing::TempDir state;
  testing::TempDir data;
  prometheus::Registry registry;
  CoordinatorMetrics metrics(registry);
  // Every state is exported from the start, at 0.
  EXPECT_EQ(Sample(registry, "zt_jobs", "state", "RESTARTING"), 0);

  absl::StatusOr<std::string> token = EnsureToken(state.path());
  ASSERT_TRUE(token.ok());
  absl::StatusOr<std::unique_ptr<Coordinator>> coordinator =
      Coordinator::Create({.state_dir = state.path()}, &metrics);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  Coordinator& c = **coordinator;
  zerotrain::RegisterRequest reg;
  *reg.mutable_info() = testing::NodeWithDevices("node-a", 1, int64_t{1} << 30);
  ASSERT_TRUE(c.Register(reg).ok());
  ASSERT_TRUE(c.Submit(testing::SmallJob("m", data.path(), 1)).ok());
  ASSERT_TRUE(c.Submit(testing::SmallJob("m", data.path(), 1)).ok());
  EXPECT_EQ(Sample(registry, "zt_jobs", "state", "PLACED"), 1);
  EXPECT_EQ(Sample(registry, "zt_jobs", "state", "PENDING"), 1);
  EXPECT_EQ(Sample(registry, "zt_nodes_registered", "", ""), 1);
  EXPECT_EQ(Sample(registry, "zt_nodes_healthy", "", ""), 1);

  zerotrain::RankReport report;
  report.set_node_id("node-a");
  report.set_job_id("m-1");
  report.set_attempt(1);
  report.mutable_exit()->set_outcome(zerotrain::RankExit::FAILED);
  report.mutable_exit()->set_message("boom");
  ASSERT_TRUE(c.ReportRank(report).ok());
  EXPECT_EQ(Sample(registry, "zt_job_restarts_total", "job_id", "m-1"), 1);
  EXPECT_EQ(Sample(registry, "zt_job_state", "job_id", "m-2"), 1);
  EXPECT_EQ(Sample(registry, "zt_node_healthy", "node", "node-a"), 1);
  // A restarted job keeps its submission order: m-1 takes the freed device again ahead of m-2.
  EXPECT_EQ(Sample(registry, "zt_jobs", "state", "PLACED"), 1);
  EXPECT_EQ(Sample(registry, "zt_jobs", "state", "PENDING"), 1);
  EXPECT_EQ(c.GetJob("m-1")->attempts_size(), 2);

  absl::StatusOr<std::unique_ptr<ControlServer>> server =
      StartControlServer({.listen_address = "127.0.0.1:0"}, &c, *token, &metrics);
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = zerotrain::JobService::NewStub(testing::LoopbackChannel((*server)->port()));
  for (int i = 0; i < 3; ++i) {
    grpc::ClientContext context;
    context.AddMetadata("authorization", absl::StrCat("Bearer ", *token));
    zerotrain::ListJobsResponse response;
    ASSERT_TRUE(stub->ListJobs(&context, {}, &response).ok());
  }
  EXPECT_EQ(Sample(registry, "zt_rpc_duration_seconds", "method", "ListJobs"), 3);
  // Prometheus owns `job` and `instance` (it would rename ours exported_job).
  for (const prometheus::MetricFamily& f : registry.Collect()) {
    for (const prometheus::ClientMetric& m : f.metric) {
      for (const prometheus::ClientMetric::Label& l : m.label) {
        EXPECT_NE(l.name, "job") << f.name;
        EXPECT_NE(l.name, "instance") << f.name;
      }
    }
  }
  (*server)->Shutdown();
}

// Each job's and node's series follow their changes at once (not at the next background
// pass), label by label: the per-change updates that keep SubmitJob and Register independent
// of the number of nodes and jobs.
TEST(CoordinatorMetricsTest, PerJobAndPerNodeSeriesFollowEachChange) {
  testing::TempDir state;
  testing::TempDir data;
  prometheus::Registry registry;
  CoordinatorMetrics metrics(registry);
  absl::StatusOr<std::unique_ptr<Coordinator>> coordinator =
      Coordinator::Create({.state_dir = state.path()}, &metrics);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  Coordinator& c = **coordinator;
  ASSERT_TRUE(c.Submit(testing::SmallJob("m", data.path(), 1)).ok());
  auto state_of = [&](const std::string& job_id) {
    std::string found;
    for (const prometheus::MetricFamily& f : registry.Collect()) {
      if (f.name != "zt_job_state") continue;
      for (const prometheus::ClientMetric& m : f.metric) {
        std::string id, state;
        for (const prometheus::ClientMetric::Label& l : m.label) {
          if (l.name == "job_id") id = l.value;
          if (l.name == "state") state = l.value;
        }
        if (id == job_id) {
          EXPECT_TRUE(found.empty()) << job_id << " has two state series";
          found = state;
        }
      }
    }
    return found;
  };
  EXPECT_EQ(state_of("m-1"), "PENDING");  // no node yet
  zerotrain::RegisterRequest reg;
  *reg.mutable_info() = testing::NodeWithDevices("node-a", 1, int64_t{1} << 30);
  ASSERT_TRUE(c.Register(reg).ok());
  EXPECT_EQ(Sample(registry, "zt_node_healthy", "node", "node-a"), 1);
  EXPECT_EQ(Sample(registry, "zt_nodes_registered", "", ""), 1);
  EXPECT_EQ(state_of("m-1"), "PLACED");  // the registration's scheduling pass placed it
  zerotrain::RankReport started;
  started.set_node_id("node-a");
  started.set_job_id("m-1");
  started.set_attempt(1);
  started.mutable_started();
  ASSERT_TRUE(c.ReportRank(started).ok());
  ASSERT_EQ(c.GetJob("m-1")->state(), zerotrain::Job::RUNNING);
  EXPECT_EQ(state_of("m-1"), "RUNNING");  // and the PLACED series is gone
  EXPECT_EQ(Sample(registry, "zt_jobs", "state", "RUNNING"), 1);
  EXPECT_EQ(Sample(registry, "zt_jobs", "state", "PLACED"), 0);
}

}  // namespace
}  // namespace zt
