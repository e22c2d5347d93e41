// NodeMetrics: the values a step and a memory report put into the series, the model-FLOPs
// formula against a float64 evaluation by hand, counters that advance by differences, removal
// of a job's series, and `promtool check metrics` on the text.
#include "worker/node/node_metrics.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"
#include "worker/job/job_loading.h"
#include "worker/model/param_layout.h"

namespace zt {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const prometheus::ClientMetric* Find(const std::vector<prometheus::MetricFamily>& families,
                                     const std::string& name,
                                     const std::map<std::string, std::string>& labels) {
  for (const prometheus::MetricFamily& f : families) {
    if (f.name != name) continue;
    for (const prometheus::ClientMetric& m : f.metric) {
      int matched = 0;
      for (const prometheus::ClientMetric::Label& l : m.label) {
        auto it = labels.find(l.name);
        if (it != labels.end() && it->second == l.value) ++matched;
      }
      if (matched == static_cast<int>(labels.size())) return &m;
    }
  }
  return nullptr;
}

std::string Text(prometheus::Registry& registry) {
  std::ostringstream text;
  prometheus::TextSerializer().Serialize(text, registry.Collect());
  return text.str();
}

TEST(NodeMetrics, ModelFlopsPerTokenIsSixNPlusAttention) {
  zerotrain::JobSpec job;
  job.mutable_model()->set_n_layer(12);
  job.mutable_model()->set_d_model(768);
  job.mutable_data()->set_seq_len(1024);
  // GPT-2 small: 124,439,808 parameters (tied). Float64 by hand: 6N + 12·L·T·C.
  const double expected = 6.0 * 124439808.0 + 12.0 * 12.0 * 1024.0 * 768.0;
  // Both sides are sums of a few exactly representable products: equal to the last bit.
  EXPECT_EQ(ModelFlopsPerToken(job, 124439808), expected);
}

TEST(NodeMetrics, RecordsStepsMemoryAndCommunicationAndRemovesAJob) {
  prometheus::Registry registry;
  NodeMetrics metrics(registry);
  const RankSeriesKey key{.job = "job-1", .rank = 1, .node = "node-a", .device = 1};
  const RankSeriesKey other{.job = "job-2", .rank = 0, .node = "node-a", .device = 0};

  StepRecord step;
  step.step = 1;
  step.loss = 3.25;
  step.lr = 0.5f;
  step.grad_norm = 1.5;
  step.tokens_per_s = 2000;
  step.step_ms = 40;
  step.loss_scale = 1024;
  step.skipped = 2;
  step.val_loss = 3.5;
  CommStats comm;
  comm[CommKind::kAllGather].bytes_sent = 1000;
  comm[CommKind::kAllGather].seconds = 0.25;
  const double flops_per_token = 1e6, peak = 8e9;
  step.compute_s = 0.025;
  step.comm_wait_s = 0.0078125;
  step.optimizer_s = 0.00390625;
  step.data_wait_s = 0.001953125;
  step.checkpoint_s = 0.5;
  step.checkpoint_bytes = 4096;
  step.offload_bytes_to_host = 3000;
  step.offload_bytes_to_device = 1500;
  step.offload_to_host_s = 0.125;
  step.offload_to_device_s = 0.0625;
  step.host_optimizer_s = 0.25;
  step.swap_bytes_in = 8192;
  step.swap_bytes_out = 12288;
  step.swap_in_s = 0.03125;
  step.swap_out_s = 0.015625;
  step.param_upload_bytes = 2048;
  step.param_upload_s = 0.00390625;
  step.param_uploads_ahead = 7;
  step.param_uploads_at_gather = 1;
  metrics.RecordStart(
      key, {.load_seconds = 0.25, .step = 0, .checkpoint_interval_steps = 5, .unix_time = 1000});
  metrics.RecordStep(key, step, comm, flops_per_token, peak, /*unix_time=*/1001);
  metrics.RecordStep(other, step, comm, flops_per_token, peak, 1001);
  // The second step: counters advance by what changed since the first.
  step.step = 2;
  step.skipped = 3;
  step.val_loss.reset();
  step.checkpoint_bytes = 0;
  comm[CommKind::kAllGather].bytes_sent = 2500;
  comm[CommKind::kAllGather].seconds = 0.75;
  metrics.RecordStep(key, step, comm, flops_per_token, peak, 1002);

  std::vector<prometheus::MetricFamily> families = registry.Collect();
  const std::map<std::string, std::string> labels{
      {"job_id", "job-1"}, {"rank", "1"}, {"node", "node-a"}, {"device", "1"}};
  auto value = [&](const std::string& name, std::map<std::string, std::string> extra = {}) {
    extra.insert(labels.begin(), labels.end());
    const prometheus::ClientMetric* m = Find(families, name, extra);
    EXPECT_NE(m, nullptr) << name;
    if (m == nullptr) return -1.0;
    return name.ends_with("_total") ? m->counter.value : m->gauge.value;
  };
  // Gauges hold exactly the doubles set (lr is a float widened exactly).
  EXPECT_EQ(value("zt_loss"), 3.25);
  EXPECT_EQ(value("zt_validation_loss"), 3.5) << "kept from the last evaluation";
  EXPECT_EQ(value("zt_learning_rate"), 0.5);
  EXPECT_EQ(value("zt_grad_norm"), 1.5);
  EXPECT_EQ(value("zt_loss_scale"), 1024);
  EXPECT_EQ(value("zt_tokens_per_second"), 2000);
  // 1e6 FLOP/token · 2000 tokens/s = 2e9 FLOP/s: 0.002 TFLOP/s and 25% of 8e9. One rounding
  // each (a product and a quotient of doubles): 1 ulp.
  EXPECT_DOUBLE_EQ(value("zt_model_tflops_per_second"), 2e9 / 1e12);
  EXPECT_DOUBLE_EQ(value("zt_mfu"), 0.25);
  EXPECT_EQ(value("zt_skipped_steps_total"), 3);
  EXPECT_EQ(value("zt_comm_bytes_total", {{"collective", "AllGather"}}), 2500);
  // 0.25 + 0.5: exact in binary.
  EXPECT_EQ(value("zt_comm_seconds_total", {{"collective", "AllGather"}}), 0.75);
  EXPECT_EQ(value("zt_comm_bytes_total", {{"collective", "ReduceScatter"}}), 0);
  EXPECT_EQ(value("zt_step"), 2);
  // Each part twice; powers of two, so the sums are exact.
  EXPECT_EQ(value("zt_step_seconds_total", {{"part", "compute"}}), 0.05);
  EXPECT_EQ(value("zt_step_seconds_total", {{"part", "comm_wait"}}), 2 * 0.0078125);
  EXPECT_EQ(value("zt_step_seconds_total", {{"part", "optimizer"}}), 2 * 0.00390625);
  EXPECT_EQ(value("zt_step_seconds_total", {{"part", "data_wait"}}), 2 * 0.001953125);
  EXPECT_EQ(value("zt_comm_wait_seconds_total"), 2 * 0.0078125);
  // The host optimizer's figures are per step: each counter advances by them twice.
  EXPECT_EQ(value("zt_offload_bytes_total", {{"direction", "to_host"}}), 6000);
  EXPECT_EQ(value("zt_offload_bytes_total", {{"direction", "to_device"}}), 3000);
  EXPECT_EQ(value("zt_offload_seconds_total", {{"direction", "to_host"}}), 0.25);
  EXPECT_EQ(value("zt_offload_seconds_total", {{"direction", "to_device"}}), 0.125);
  EXPECT_EQ(value("zt_host_optimizer_seconds_total"), 0.5);
  // offload.optimizer NVME's swap, in the same families.
  EXPECT_EQ(value("zt_offload_bytes_total", {{"direction", "swap_in"}}), 2 * 8192);
  EXPECT_EQ(value("zt_offload_bytes_total", {{"direction", "swap_out"}}), 2 * 12288);
  EXPECT_EQ(value("zt_offload_seconds_total", {{"direction", "swap_in"}}), 2 * 0.03125);
  EXPECT_EQ(value("zt_offload_seconds_total", {{"direction", "swap_out"}}), 2 * 0.015625);
  // offload.params' uploads of the parameter shards into the gathers, and when they went up.
  EXPECT_EQ(value("zt_offload_bytes_total", {{"direction", "param_upload"}}), 2 * 2048);
  EXPECT_EQ(value("zt_offload_seconds_total", {{"direction", "param_upload"}}), 2 * 0.00390625);
  EXPECT_EQ(value("zt_param_uploads_total", {{"when", "ahead"}}), 2 * 7);
  EXPECT_EQ(value("zt_param_uploads_total", {{"when", "at_gather"}}), 2 * 1);
  // The save after step 1 (step 2 saved nothing): its time, step and bytes.
  EXPECT_EQ(value("zt_checkpoint_save_seconds"), 0.5);
  EXPECT_EQ(value("zt_checkpoint_saved_bytes_total"), 4096);
  EXPECT_EQ(value("zt_checkpoint_last_save_timestamp_seconds"), 1001);
  EXPECT_EQ(value("zt_checkpoint_last_step"), 1);
  EXPECT_EQ(value("zt_checkpoint_last_save_bytes"), 4096);
  EXPECT_EQ(value("zt_checkpoint_interval_steps"), 5);
  EXPECT_EQ(value("zt_checkpoint_load_seconds"), 0.25);
  const prometheus::ClientMetric* hist = Find(families, "zt_step_duration_seconds", labels);
  ASSERT_NE(hist, nullptr);
  EXPECT_EQ(hist->histogram.sample_count, 2u);
  // 0.04 s twice; the sum of two identical doubles is exact.
  EXPECT_EQ(hist->histogram.sample_sum, 2 * 0.04);

  // Prometheus owns `job` and `instance`: a label of either name would be renamed
  // exported_job / exported_instance on scrape, and the dashboard could not tell jobs apart.
  for (const prometheus::MetricFamily& f : families) {
    for (const prometheus::ClientMetric& m : f.metric) {
      for (const prometheus::ClientMetric::Label& l : m.label) {
        EXPECT_NE(l.name, "job") << f.name;
        EXPECT_NE(l.name, "instance") << f.name;
      }
    }
  }

  metrics.RemoveJob("job-1");
  const std::string text = Text(registry);
  EXPECT_THAT(text, Not(HasSubstr("job-1")));
  EXPECT_THAT(text, HasSubstr(R"(job_id="job-2")"));
}

TEST(NodeMetrics, MemorySeriesHoldThePlanAndTheArenasByCategory) {
  prometheus::Registry registry;
  NodeMetrics metrics(registry);
  zerotrain::JobSpec spec;
  spec.set_name("metrics");
  auto* m = spec.mutable_model();
  m->set_family(zerotrain::ModelConfig::GPT2);
  m->set_n_layer(1);
  m->set_n_head(2);
  m->set_d_model(16);
  m->set_vocab_size(32);
  m->set_max_seq_len(8);
  spec.mutable_data()->add_train("unused.bin");
  spec.mutable_data()->set_seq_len(8);
  spec.mutable_train()->set_micro_batch_size(1);
  spec.mutable_train()->set_max_steps(1);
  spec.mutable_optimizer()->set_lr(1e-3f);
  spec.mutable_resources()->set_cpu_threads(1);
  const zerotrain::JobSpec job =
      ValidatedJob(spec, {.check_paths = false, .check_engine_support = false}).value();
  const MemoryPlan plan = PlanMemory(job, 0);
  absl::StatusOr<std::unique_ptr<Arenas>> arenas = Arenas::Create(plan);
  ASSERT_TRUE(arenas.ok()) << arenas.status();
  const RankSeriesKey key{.job = "j", .rank = 0, .node = "n", .device = 0};
  metrics.RecordMemory(key, plan, **arenas);
  const std::vector<prometheus::MetricFamily> families = registry.Collect();
  // The categories hold different byte counts, so a series under the wrong category would
  // differ from the plan's figure for its label.
  for (int c = 0; c < kMemoryCategoryCount; ++c) {
    const auto category = static_cast<MemoryCategory>(c);
    const std::string name = MemoryCategoryName(category);
    const auto* planned = Find(families, "zt_memory_bytes",
                               {{"job_id", "j"}, {"category", name}, {"source", "plan"}});
    const auto* measured = Find(families, "zt_memory_bytes",
                                {{"job_id", "j"}, {"category", name}, {"source", "measured"}});
    ASSERT_NE(planned, nullptr) << name;
    ASSERT_NE(measured, nullptr) << name;
    EXPECT_EQ(planned->gauge.value, static_cast<double>(plan.CategoryBytes(category))) << name;
    EXPECT_EQ(measured->gauge.value, static_cast<double>((*arenas)->BytesInUse(category))) << name;
  }
}

TEST(NodeMetrics, TextPassesPromtool) {
  if (!std::filesystem::exists("/usr/bin/promtool")) GTEST_SKIP() << "no /usr/bin/promtool";
  prometheus::Registry registry;
  NodeMetrics metrics(registry);
  StepRecord step;
  step.step_ms = 10;
  step.val_loss = 1;
  metrics.RecordStep({.job = "j", .rank = 0, .node = "n", .device = 0}, step, CommStats{}, 1, 1, 1);
  const auto path = std::filesystem::temp_directory_path() /
                    ("zt-node-metrics-" + std::to_string(::getpid()) + ".txt");
  { std::ofstream(path) << Text(registry); }
  const std::string command = "/usr/bin/promtool check metrics < " + path.string() + " 2>&1";
  std::FILE* pipe = ::popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[512];
  while (std::fgets(buffer, sizeof(buffer), pipe) != nullptr) output += buffer;
  const int rc = ::pclose(pipe);
  std::filesystem::remove(path);
  EXPECT_EQ(rc, 0) << output;
  EXPECT_EQ(output, "") << "promtool's lint findings";
}

}  // namespace
}  // namespace zt
