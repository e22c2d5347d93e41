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

}  // namespace
}  // namespace zt
