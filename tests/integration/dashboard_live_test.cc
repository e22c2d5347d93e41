// The Grafana dashboard against live daemons (issue 21): a real coordinator and node (`ztd`),
// four jobs — one finished, one failed, two training — and Debian's `prometheus` on loopback
// running the deployed config (deploy/prometheus/prometheus.yml, its rule files included),
// pointed at the daemons with a 1 s scrape and evaluation interval. Every variable and every
// panel's query of deploy/grafana/dashboards/zerotrain.json is then asked through Prometheus's
// HTTP API with the variables substituted as Grafana substitutes them: a multi-value variable
// becomes `(a|b)`, `$__rate_interval` max($__interval + scrape interval, 4 × scrape interval).
// Each query must return series; each per-job query (legend `{{job_id}}`) one set per training
// job, never folded into one. Grafana itself is not packaged for Debian; its provisioning files
// are checked against the names the dashboard uses.
//
// Skipped, with the reason printed, where /usr/bin/prometheus is absent. Takes ~40 s.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/daemon_cluster.h"
#include "tests/integration/loopback_http.h"

namespace zt::testing {
namespace {

using nlohmann::json;

constexpr char kPrometheus[] = "/usr/bin/prometheus";
// The test's scrape and evaluation interval, and the range queries' step ($__interval).
constexpr int kScrapeSeconds = 1;
constexpr int kStepSeconds = 1;
// Grafana's $__rate_interval: max($__interval + scrape interval, 4 × scrape interval).
const std::string kRateInterval =
    std::to_string(std::max(kStepSeconds + kScrapeSeconds, 4 * kScrapeSeconds)) + "s";

std::string UrlEncode(const std::string& text) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (const unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

// Grafana's Prometheus regex escaping of one variable value.
std::string RegexEscape(const std::string& value) {
  static const std::regex kSpecial(R"([\\^$*+?.()|{}\[\]])");
  return std::regex_replace(value, kSpecial, R"(\$&)");
}

// One target of a panel, or a variable's query.
struct Query {
  std::string panel;
  std::string expr;
  std::string legend;
  bool instant = false;
};

class DashboardLiveTest : public DaemonClusterTest {
 protected:
  void TearDown() override {
    if (prometheus_) prometheus_->Kill();
    DaemonClusterTest::TearDown();
  }

  // The deployed config, its targets pointed at the daemons, its rule files at the deployed
  // ones, scraping and evaluating every kScrapeSeconds. Fails when the deployed file no longer
  // has what is rewritten.
  std::string WriteScrapeConfig(int coordinator_port, int node_port) {
    const std::string deploy = std::string(ZT_SOURCE_DIR) + "/deploy/prometheus/";
    std::string text = ReadText(deploy + "prometheus.yml");
    auto replace = [&](const std::regex& pattern, const std::string& with, const char* what) {
      EXPECT_TRUE(std::regex_search(text, pattern)) << "prometheus.yml has no " << what;
      text = std::regex_replace(text, pattern, with, std::regex_constants::format_first_only);
    };
    const std::string interval = std::to_string(kScrapeSeconds) + "s";
    replace(std::regex(R"(scrape_interval: \S+)"), "scrape_interval: " + interval,
            "scrape_interval");
    replace(std::regex(R"(evaluation_interval: \S+)"), "evaluation_interval: " + interval,
            "evaluation_interval");
    replace(std::regex(R"(- zerotrain-rules\.yml)"), "- " + deploy + "zerotrain-rules.yml",
            "zerotrain-rules.yml");
    replace(std::regex(R"(- zerotrain-alerts\.yml)"), "- " + deploy + "zerotrain-alerts.yml",
            "zerotrain-alerts.yml");
    // The coordinator's job comes first, then the nodes'.
    replace(std::regex(R"(targets: \[[^\]]*\])"),
            "targets: [\"127.0.0.1:" + std::to_string(coordinator_port) + "\"]",
            "coordinator targets");
    replace(std::regex(R"(targets: \[[^\]]*example[^\]]*\])"),
            "targets: [\"127.0.0.1:" + std::to_string(node_port) + "\"]", "node targets");
    const std::string path = Path("prometheus.yml");
    std::ofstream(path) << text;
    return path;
  }

  void StartPrometheus(const std::string& config) {
    port_ = FreePort();
    ASSERT_GT(port_, 0);
    prometheus_ = std::make_unique<ZtProcess>(
        std::vector<std::string>{"--config.file=" + config, "--storage.tsdb.path=" + Path("tsdb"),
                                 "--web.listen-address=127.0.0.1:" + std::to_string(port_),
                                 "--log.level=warn"},
        Path("prometheus.log"), kPrometheus);
    ASSERT_TRUE(prometheus_->started());
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    while (HttpBody(HttpGet(port_, "/-/ready", std::chrono::seconds(2)).response).find("Ready") ==
           std::string::npos) {
      ASSERT_FALSE(prometheus_->Poll().has_value()) << prometheus_->Output();
      ASSERT_LT(Clock::now(), deadline) << prometheus_->Output();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

  // GET on the HTTP API; the parsed "data" of a success, or null (with a failure naming
  // `what`).
  json Api(const std::string& target, const std::string& what) {
    const Scrape got = HttpGet(port_, target, std::chrono::seconds(10));
    const json reply = json::parse(HttpBody(got.response), nullptr, /*allow_exceptions=*/false);
    if (!reply.is_object() || reply.value("status", "") != "success") {
      ADD_FAILURE() << what << ": " << target << "\n" << got.response;
      return nullptr;
    }
    return reply["data"];
  }

  // The series of `expr` over the last 20 s (Grafana asks a range query), or the instant's.
  json Series(const std::string& expr, bool instant, const std::string& what) {
    const auto now = std::chrono::duration_cast<std::chrono::seconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
    const std::string target = instant ? "/api/v1/query?query=" + UrlEncode(expr)
                                       : "/api/v1/query_range?query=" + UrlEncode(expr) +
                                             "&start=" + std::to_string(now - 20) +
                                             "&end=" + std::to_string(now) +
                                             "&step=" + std::to_string(kStepSeconds);
    const json data = Api(target, what);
    return data.is_object() ? data["result"] : json::array();
  }

  // The job_id values of `series`; "" for a series without one.
  static std::set<std::string> JobIds(const json& series) {
    std::set<std::string> ids;
    for (const json& s : series) ids.insert(s["metric"].value("job_id", ""));
    return ids;
  }

  std::unique_ptr<ZtProcess> prometheus_;
  int port_ = 0;
};

TEST_F(DashboardLiveTest, EveryPanelAndVariableReturnsSeriesPerTrainingJob) {
  if (!std::filesystem::exists(kPrometheus)) {
    GTEST_SKIP() << "no " << kPrometheus << " (apt-get install prometheus)";
  }
  // The failed job's data is there when `zt submit` checks it and gone when the node does.
  ASSERT_NO_FATAL_FAILURE(StartCoordinator());
  auto Submit = [](const std::string& job_file) {
    const RunResult r = Zt("submit " + job_file + " --json");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    const json j = json::parse(r.output, nullptr, false);
    return j.is_object() ? j.value("id", "") : "";
  };
  std::filesystem::copy_file(Path("train.bin"), Path("gone.bin"));
  std::string failing_text = ReadText(WriteJob("failing", Path("ckpt-failing"), 1, 5, 1000));
  const std::string train = "train: [" + Path("train.bin") + "]";
  failing_text.replace(failing_text.find(train), train.size(),
                       "train: [\"" + Path("gone.bin") + "\"]");
  std::ofstream(Path("failing.yaml")) << failing_text;
  const std::string failed = Submit(Path("failing.yaml"));
  std::filesystem::remove(Path("gone.bin"));
  const std::string finished = Submit(WriteJob("finished", Path("ckpt-finished"), 1, 3, 2));
  ASSERT_NO_FATAL_FAILURE(StartNode("node-a", 2));
  auto state = [](const json& s) { return s.is_object() ? s.value("state", "") : ""; };
  auto ended = [&](const json& s) { return state(s) == "SUCCEEDED" || state(s) == "FAILED"; };
  ASSERT_EQ(state(WaitFor(failed, ended, std::chrono::seconds(60))), "FAILED");
  ASSERT_EQ(state(WaitFor(finished, ended, std::chrono::seconds(60))), "SUCCEEDED");
  // The two training jobs, one per device, evaluated every 2 steps, saving every 5.
  const std::vector<std::string> training = {
      Submit(WriteJob("alpha", Path("ckpt-alpha"), 1, 1000000, 5, /*eval_interval=*/2)),
      Submit(WriteJob("beta", Path("ckpt-beta"), 1, 1000000, 5, /*eval_interval=*/2))};
  for (const std::string& id : training) {
    ASSERT_GE(StepOf(WaitFor(
                  id, [](const json& s) { return StepOf(s) >= 3; }, std::chrono::seconds(60))),
              3)
        << id;
  }
  const std::set<std::string> running(training.begin(), training.end());
  const std::set<std::string> every_job = {failed, finished, training[0], training[1]};

  ASSERT_NO_FATAL_FAILURE(StartPrometheus(
      WriteScrapeConfig(MetricsPort(*coordinator_), MetricsPort(*nodes_["node-a"]))));
  // Both targets up, the recording rules evaluated for both jobs, rates over
  // $__rate_interval at a range query's whole-second steps (enough scrapes in the window), and
  // the alerts evaluated (the failed job's fires at once).
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (Series("up == 1", true, "targets").size() < 2 ||
         JobIds(Series("job_id:zt_tokens_per_second:max", true, "rules")) != running ||
         Series("rate(zt_step_seconds_total[" + kRateInterval + "])", false, "rates").empty() ||
         Series("increase(zt_job_restarts_total[1h])", false, "increase").empty() ||
         Series(R"(ALERTS{alertname="ZeroTrainJobFailed",alertstate="firing"})", true, "alerts")
             .empty()) {
    ASSERT_LT(Clock::now(), deadline) << prometheus_->Output();
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  // The scrape adds `job` (the scrape job) and `instance`: nothing of ours was renamed.
  EXPECT_TRUE(Series(R"({__name__=~"zt_.+",exported_job!=""})", true, "exported_job").empty());
  EXPECT_TRUE(
      Series(R"({__name__=~"zt_.+",exported_instance!=""})", true, "exported_instance").empty());

  const json dashboard = json::parse(
      ReadText(std::string(ZT_SOURCE_DIR) + "/deploy/grafana/dashboards/zerotrain.json"));
  // Variables, in order: each later one sees the earlier ones' values (all selected).
  std::map<std::string, std::vector<std::string>> values;
  auto substitute = [&](std::string text) {
    for (const auto& [name, selected] : values) {
      std::string joined;
      for (const std::string& v : selected) joined += (joined.empty() ? "" : "|") + RegexEscape(v);
      const std::string with = selected.size() == 1 ? joined : "(" + joined + ")";
      text = std::regex_replace(text, std::regex("\\$" + name + "\\b"), with);
    }
    return std::regex_replace(text, std::regex(R"(\$__rate_interval)"), kRateInterval);
  };
  static const std::regex kLabelValues(R"(^label_values\((.+), *([a-z_]+)\)$)");
  for (const json& variable : dashboard["templating"]["list"]) {
    const std::string name = variable["name"].get<std::string>();
    const std::string query = variable["query"].is_object()
                                  ? variable["query"]["query"].get<std::string>()
                                  : variable["query"].get<std::string>();
    std::smatch m;
    ASSERT_TRUE(std::regex_match(query, m, kLabelValues)) << "variable " << name << ": " << query;
    const json data =
        Api("/api/v1/label/" + std::string(m[2]) + "/values?match[]=" + UrlEncode(substitute(m[1])),
            "variable " + name);
    ASSERT_TRUE(data.is_array() && !data.empty()) << "variable " << name << ": " << query;
    values[name] = data.get<std::vector<std::string>>();
  }
  // The job variable lists every job the coordinator holds (finished and failed too).
  ASSERT_TRUE(values.contains("job_id"));
  EXPECT_EQ(std::set<std::string>(values["job_id"].begin(), values["job_id"].end()), every_job);

  std::vector<Query> queries;
  std::set<std::string> datasource_uids;
  for (const json& panel : dashboard["panels"]) {
    if (panel.contains("datasource")) datasource_uids.insert(panel["datasource"].value("uid", ""));
    for (const json& target : panel.value("targets", json::array())) {
      queries.push_back({.panel = panel["title"].get<std::string>(),
                         .expr = target["expr"].get<std::string>(),
                         .legend = target.value("legendFormat", ""),
                         .instant = target.value("instant", false)});
    }
  }
  EXPECT_GT(queries.size(), 25u);
  for (const Query& q : queries) {
    const std::string expr = substitute(q.expr);
    const std::string what = "panel \"" + q.panel + "\", query " + expr;
    const json series = Series(expr, q.instant, what);
    EXPECT_FALSE(series.empty()) << what << " returned no series";
    if (q.legend.find("{{job_id}}") == std::string::npos) continue;
    // A per-job query: one set of series per job, none folded into a series without job_id.
    // Node series exist for the training jobs; the coordinator's for every job it holds.
    const bool coordinator_series = expr.find("zt_job_") != std::string::npos;
    EXPECT_EQ(JobIds(series), coordinator_series ? every_job : running)
        << what << ": job_id of each series";
  }

  // Grafana provisioning: the data source is the one every panel names, at the Prometheus the
  // deployed config describes; the dashboard provider loads the folder the dashboard goes in.
  const std::string provisioning = std::string(ZT_SOURCE_DIR) + "/deploy/grafana/provisioning/";
  const std::string datasources = ReadText(provisioning + "datasources.yaml");
  ASSERT_EQ(datasource_uids.size(), 1u);
  EXPECT_NE(datasources.find("uid: " + *datasource_uids.begin()), std::string::npos)
      << "datasources.yaml does not provision uid " << *datasource_uids.begin();
  for (const json& variable : dashboard["templating"]["list"]) {
    EXPECT_EQ(variable["datasource"].value("uid", ""), *datasource_uids.begin())
        << variable["name"];
  }
  EXPECT_NE(datasources.find("type: prometheus"), std::string::npos);
  const std::string providers = ReadText(provisioning + "dashboards.yaml");
  static const std::regex kPath(R"(path: (\S+))");
  std::smatch path;
  ASSERT_TRUE(std::regex_search(providers, path, kPath)) << providers;
  const std::string readme = ReadText(std::string(ZT_SOURCE_DIR) + "/deploy/README.md");
  EXPECT_NE(readme.find(path[1].str()), std::string::npos)
      << "deploy/README.md does not say to copy the dashboard to " << path[1];
  EXPECT_EQ(dashboard.value("uid", ""), "zerotrain-training");
}

}  // namespace
}  // namespace zt::testing
