// The control plane end to end: real `ztd` daemons on loopback (a coordinator and two nodes of
// two CPU devices each), jobs submitted and watched with `zt`, node and coordinator failures,
// the security rules, a Python client that knows only the .proto files, and /metrics.
//
// Every job here is a stage-3 job over 4 ranks with resources.cpu_threads 1, so a run split
// over two node processes computes exactly what `zt train` computes with 4 threads in one
// process: the final weights are compared byte for byte.
#include <sys/wait.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "proto/control.grpc.pb.h"
#include "tests/integration/daemon_cluster.h"
#include "worker/node/control_channel.h"

namespace zt::testing {
namespace {

using nlohmann::json;

std::string JobIdOf(const RunResult& submitted) {
  const json j = json::parse(submitted.output, nullptr, /*allow_exceptions=*/false);
  return j.is_object() && j.contains("id") ? j["id"].get<std::string>() : "";
}

std::string StateOf(const json& status) {
  return status.is_object() && status.contains("state") ? status["state"].get<std::string>() : "";
}

bool Ended(const json& status) {
  const std::string state = StateOf(status);
  return state == "SUCCEEDED" || state == "FAILED" || state == "CANCELLED";
}

class DaemonTest : public DaemonClusterTest {
 protected:
  void StartCluster() {
    ASSERT_NO_FATAL_FAILURE(StartCoordinator());
    ASSERT_NO_FATAL_FAILURE(StartNode("node-a"));
    ASSERT_NO_FATAL_FAILURE(StartNode("node-b"));
  }

  // The final weights of `zt train` on the same job in one process (the uninterrupted run).
  std::string ReferenceWeights(int steps, int interval) {
    return ZtTrainWeights(4, steps, interval);
  }

  std::string Submit(const std::string& job_file) {
    const RunResult r = Zt("submit " + job_file + " --json");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return JobIdOf(r);
  }

  std::unique_ptr<zerotrain::JobService::Stub> JobStub() {
    auto channel = ConnectControlPlane({.address = address_});
    EXPECT_TRUE(channel.ok()) << channel.status();
    return zerotrain::JobService::NewStub(*channel);
  }

  // The job ends FAILED after its first attempt, its failure_reason holding each of `words`.
  static void ExpectFailedAfterOneAttempt(const std::string& id,
                                          const std::vector<std::string>& words) {
    const json done = WaitFor(
        id, [](const json& s) { return StateOf(s) == "FAILED" || StateOf(s) == "SUCCEEDED"; });
    ASSERT_EQ(StateOf(done), "FAILED") << done.dump(2);
    EXPECT_EQ(done["attempts"].size(), 1u) << done.dump(2);
    const std::string reason = done.value("failure_reason", "");
    for (const std::string& word : words) {
      EXPECT_NE(reason.find(word), std::string::npos) << word << " in " << reason;
    }
    // A batch script learns not to resubmit: exit 2, as `zt train` gives for the same error.
    const RunResult watched = Zt("watch " + id);
    EXPECT_EQ(watched.exit_code, 2) << watched.output;
  }

  std::string Token() {
    std::string t = ReadText(state_dir_ + "/token");
    while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.pop_back();
    return t;
  }
};

TEST_F(DaemonTest, Stage3JobOverTwoNodesSucceedsWithTheWeightsOfOneProcess) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  const std::string job = WriteJob("e2e", Path("ckpt"), 4, 12, 6);
  const RunResult watched = Zt("submit " + job + " --watch");
  ASSERT_EQ(watched.exit_code, 0) << watched.output;
  EXPECT_NE(watched.output.find("SUCCEEDED"), std::string::npos) << watched.output;

  const RunResult listed = Zt("list --json");
  ASSERT_EQ(listed.exit_code, 0) << listed.output;
  const json jobs = json::parse(listed.output);
  ASSERT_EQ(jobs.size(), 1u);
  const json status = Status(jobs[0]["id"].get<std::string>());
  EXPECT_EQ(StateOf(status), "SUCCEEDED");
  ASSERT_EQ(status["attempts"].size(), 1u);
  std::set<std::string> nodes;
  for (const json& p : status["attempts"][0]["placement"]) nodes.insert(p["node_id"]);
  EXPECT_EQ(nodes, (std::set<std::string>{"node-a", "node-b"}));
  EXPECT_EQ(ExportedWeights(Path("ckpt"), Path("export")), ReferenceWeights(12, 6));
}

TEST_F(DaemonTest, KilledNodeRestartsTheJobFromItsCheckpointWithUninterruptedWeights) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  const std::string id = Submit(WriteJob("crash", Path("ckpt"), 4, 300, 10));
  ASSERT_FALSE(id.empty());
  const json running = WaitFor(id, [](const json& s) { return StepOf(s) >= 25; });
  ASSERT_GE(StepOf(running), 25) << running.dump();
  ASSERT_LT(StepOf(running), 300) << "the job ended before the node could be killed";
  nodes_["node-b"]->Kill();
  ASSERT_NO_FATAL_FAILURE(StartNode("node-b"));

  const json done = WaitFor(
      id, [](const json& s) { return StateOf(s) == "SUCCEEDED" || StateOf(s) == "FAILED"; });
  ASSERT_EQ(StateOf(done), "SUCCEEDED") << done.dump(2);
  ASSERT_GE(done["attempts"].size(), 2u);
  EXPECT_FALSE(done["attempts"][0]["end_reason"].get<std::string>().empty());
  const json& second = done["attempts"][1];
  ASSERT_TRUE(second.contains("resumed_from_step")) << second.dump();
  EXPECT_GE(Int(second["resumed_from_step"]), 10);
  EXPECT_EQ(ExportedWeights(Path("ckpt"), Path("export")), ReferenceWeights(300, 10));
}

TEST_F(DaemonTest, CoordinatorRestartKeepsTheRunningJobAndItsHistory) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  const std::string id = Submit(WriteJob("survive", Path("ckpt"), 4, 300, 50));
  const json running = WaitFor(id, [](const json& s) { return StepOf(s) >= 10; });
  ASSERT_GE(StepOf(running), 10) << running.dump();
  const int port = CoordinatorPort();
  coordinator_->Kill();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  // A minute for the nodes to report their ranks (10 s by default): on a loaded CI machine a
  // node has been seen to take longer, and this test is about keeping the attempt, not about
  // the deadline.
  ASSERT_NO_FATAL_FAILURE(StartCoordinator(port, {"--reattach-grace-ms", "60000"}));

  const json done = WaitFor(
      id, [](const json& s) { return StateOf(s) == "SUCCEEDED" || StateOf(s) == "FAILED"; });
  ASSERT_EQ(StateOf(done), "SUCCEEDED") << done.dump(2);
  // The nodes kept training: one attempt, not a restart.
  EXPECT_EQ(done["attempts"].size(), 1u) << done.dump(2);

  // The history from before the restart is intact: events numbered 1, 2, … without a gap.
  const RunResult events = Zt("watch " + id + " --json");
  ASSERT_EQ(events.exit_code, 0) << events.output;
  std::istringstream lines(events.output);
  std::string line;
  int64_t expected = 1;
  while (std::getline(lines, line)) {
    const json e = json::parse(line, nullptr, false);
    if (!e.is_object() || !e.contains("sequence")) continue;
    EXPECT_EQ(Int(e["sequence"]), expected) << line;
    ++expected;
  }
  EXPECT_GT(expected, 3) << events.output;
  EXPECT_EQ(ExportedWeights(Path("ckpt"), Path("export")), ReferenceWeights(300, 50));
}

// Slurm preemption: SIGTERM to a node makes its ranks checkpoint at the next step boundary and
// ztd exit 75; the job is requeued (a preemption is not a failure) and resumes from that
// checkpoint when a node is back, ending with the weights of an uninterrupted run.
TEST_F(DaemonTest, PreemptedNodeCheckpointsExitsSeventyFiveAndTheJobResumes) {
  ASSERT_NO_FATAL_FAILURE(StartCoordinator());
  ASSERT_NO_FATAL_FAILURE(StartNode("node-a", 4));
  std::string job = WriteJob("preempt", Path("ckpt"), 4, 300, 1000);
  {
    // No periodic checkpoint before the end: what resumes is the emergency one.
    std::ofstream f(job, std::ios::app);
    f << "scheduling: {max_restarts: 0}\n";
  }
  const std::string id = Submit(job);
  const json running = WaitFor(id, [](const json& s) { return StepOf(s) >= 20; });
  ASSERT_GE(StepOf(running), 20) << running.dump();
  ASSERT_EQ(nodes_["node-a"]->Signal(SIGTERM), 0);
  const std::optional<int> code =
      nodes_["node-a"]->WaitUntil(Clock::now() + std::chrono::seconds(60));
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 75) << nodes_["node-a"]->Output();
  const json requeued = Status(id);
  EXPECT_NE(StateOf(requeued), "FAILED") << requeued.dump(2);

  ASSERT_NO_FATAL_FAILURE(StartNode("node-a", 4));
  const json done = WaitFor(
      id, [](const json& s) { return StateOf(s) == "SUCCEEDED" || StateOf(s) == "FAILED"; });
  ASSERT_EQ(StateOf(done), "SUCCEEDED") << done.dump(2);
  ASSERT_EQ(done["attempts"].size(), 2u);
  EXPECT_GE(Int(done["attempts"][1]["resumed_from_step"]), 20);
  EXPECT_EQ(ExportedWeights(Path("ckpt"), Path("export")), ReferenceWeights(300, 1000));
}

TEST_F(DaemonTest, BadCallsAreRefusedWithTheirStatusAndTheDaemonKeepsServing) {
  ASSERT_NO_FATAL_FAILURE(StartCoordinator());
  auto stub = JobStub();

  zerotrain::ListJobsResponse list;
  {
    grpc::ClientContext no_token;
    EXPECT_EQ(stub->ListJobs(&no_token, {}, &list).error_code(), grpc::UNAUTHENTICATED);
  }
  {
    auto wrong = AuthorizedContext(std::string(64, '0'));
    EXPECT_EQ(stub->ListJobs(wrong.get(), {}, &list).error_code(), grpc::UNAUTHENTICATED);
  }
  {
    std::ofstream bad(Path("bad-token"));
    bad << "not-the-token\n";
  }
  // Owner-only, so that it is refused for its content, not for its mode.
  std::filesystem::permissions(
      Path("bad-token"), std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  EXPECT_EQ(Zt("list --token-file " + Path("bad-token")).exit_code, 5);

  // A path outside the allowed roots, named in the answer.
  zerotrain::SubmitJobRequest outside;
  auto* spec = outside.mutable_spec();
  spec->set_name("outside");
  spec->mutable_model()->set_family(zerotrain::ModelConfig::GPT2);
  spec->mutable_model()->set_n_layer(1);
  spec->mutable_model()->set_n_head(1);
  spec->mutable_model()->set_d_model(8);
  spec->mutable_model()->set_vocab_size(64);
  spec->mutable_model()->set_max_seq_len(8);
  spec->mutable_data()->add_train("/etc/hostname");
  spec->mutable_data()->set_seq_len(8);
  spec->mutable_train()->set_micro_batch_size(1);
  spec->mutable_train()->set_max_steps(1);
  spec->mutable_optimizer()->set_lr(1e-3f);
  zerotrain::Job job;
  {
    auto ctx = AuthorizedContext(Token());
    const grpc::Status s = stub->SubmitJob(ctx.get(), outside, &job);
    EXPECT_EQ(s.error_code(), grpc::PERMISSION_DENIED) << s.error_message();
    EXPECT_NE(s.error_message().find("/etc/hostname"), std::string::npos) << s.error_message();
  }
  // A malformed job: every violation named.
  {
    zerotrain::SubmitJobRequest bad = outside;
    bad.mutable_spec()->mutable_data()->set_train(0, Path("train.bin"));
    bad.mutable_spec()->mutable_model()->set_n_head(3);
    bad.mutable_spec()->mutable_train()->set_max_steps(-1);
    auto ctx = AuthorizedContext(Token());
    const grpc::Status s = stub->SubmitJob(ctx.get(), bad, &job);
    EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT);
    EXPECT_NE(s.error_message().find("model.n_head"), std::string::npos) << s.error_message();
    EXPECT_NE(s.error_message().find("train.max_steps"), std::string::npos) << s.error_message();
  }
  // Oversized: 5 MiB of name.
  {
    zerotrain::SubmitJobRequest big = outside;
    big.mutable_spec()->set_name(std::string(5 << 20, 'x'));
    auto ctx = AuthorizedContext(Token());
    EXPECT_EQ(stub->SubmitJob(ctx.get(), big, &job).error_code(), grpc::RESOURCE_EXHAUSTED);
  }
  // Bytes that are no protobuf at all, and an unknown job.
  {
    const std::string script = Path("garbage.py");
    {
      std::ofstream py(script);
      py << "import grpc\n"
         << "c = grpc.insecure_channel('" << address_
         << "', options=[('grpc.enable_http_proxy', 0)])\n"
         << "f = c.unary_unary('/zerotrain.JobService/SubmitJob')\n"
         << "try:\n"
         << "    f(b'\\xff\\xff\\xff\\xff', metadata=[('authorization', 'Bearer " << Token()
         << "')], timeout=10)\n"
         << "    print('ACCEPTED')\n"
         << "except grpc.RpcError as e:\n"
         << "    print(e.code().name)\n";
    }
    const std::string cmd = "/usr/bin/python3 " + script + " 2>&1";
    std::FILE* p = ::popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    char buf[256] = {0};
    const size_t n = std::fread(buf, 1, sizeof buf - 1, p);
    ::pclose(p);
    const std::string answer(buf, n);
    EXPECT_EQ(answer.find("ACCEPTED"), std::string::npos) << answer;
    EXPECT_TRUE(answer.find("INTERNAL") != std::string::npos ||
                answer.find("INVALID_ARGUMENT") != std::string::npos)
        << answer;
  }
  {
    auto ctx = AuthorizedContext(Token());
    zerotrain::GetJobRequest get;
    get.set_job_id("no-such-job-7");
    EXPECT_EQ(stub->GetJob(ctx.get(), get, &job).error_code(), grpc::NOT_FOUND);
  }
  // Still serving, and never crashed.
  EXPECT_FALSE(coordinator_->Poll().has_value()) << coordinator_->Output();
  EXPECT_EQ(Zt("list").exit_code, 0);
}

// Mutual TLS: a CA, a server certificate for 127.0.0.1 and a client certificate, made with
// openssl. Clients with the client certificate get in; without it, or in plaintext, they do not.
TEST_F(DaemonTest, MutualTlsAdmitsOnlyClientsWithACertificateFromTheCa) {
  const std::string d = dir_.string();
  const std::string make_certs =
      "cd " + d +
      " && openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2"
      " -subj /CN=zt-test-ca"
      " && openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr"
      " -subj /CN=127.0.0.1"
      " && printf 'subjectAltName=IP:127.0.0.1,DNS:localhost' > san.ext"
      " && openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial"
      " -out server.pem -days 2 -extfile san.ext"
      " && openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr -subj /CN=node"
      " && openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial"
      " -out client.pem -days 2 > certs.log 2>&1";
  ASSERT_EQ(std::system(make_certs.c_str()), 0) << ReadText(Path("certs.log"));
  ASSERT_NO_FATAL_FAILURE(StartCoordinator(0, {"--tls-cert", Path("server.pem"), "--tls-key",
                                               Path("server.key"), "--tls-ca", Path("ca.pem")}));
  EXPECT_NE(coordinator_->Output().find("(TLS)"), std::string::npos) << coordinator_->Output();
  const std::string client_tls = " --tls-ca " + Path("ca.pem") + " --tls-cert " +
                                 Path("client.pem") + " --tls-key " + Path("client.key");
  const RunResult with_cert = Zt("list" + client_tls);
  EXPECT_EQ(with_cert.exit_code, 0) << with_cert.output;
  // Refused clients wait for a connection until their deadline: keep it short.
  EXPECT_NE(Zt("list --timeout 3 --tls-ca " + Path("ca.pem")).exit_code, 0);
  EXPECT_NE(Zt("list --timeout 3").exit_code, 0);
  ASSERT_NO_FATAL_FAILURE(StartNode("node-tls", 1, int64_t{4} << 30,
                                    {"--tls-ca", Path("ca.pem"), "--tls-cert", Path("client.pem"),
                                     "--tls-key", Path("client.key")}));
  const RunResult nodes = Zt("nodes --json" + client_tls);
  ASSERT_EQ(nodes.exit_code, 0) << nodes.output;
  EXPECT_NE(nodes.output.find("node-tls"), std::string::npos) << nodes.output;
}

TEST_F(DaemonTest, PythonClientFromTheProtoFilesSubmitsAndWatches) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  const std::string job_json = Path("py.json");
  {
    std::ofstream f(job_json);
    f << json{{"name", "py"},
              {"model",
               {{"family", "GPT2"},
                {"nLayer", 1},
                {"nHead", 2},
                {"dModel", 16},
                {"vocabSize", 64},
                {"maxSeqLen", 16}}},
              {"data", {{"train", {Path("train.bin")}}, {"seqLen", 16}}},
              {"train", {{"microBatchSize", 2}, {"maxSteps", 5}}},
              {"optimizer", {{"lr", 1e-3}}},
              {"parallel", {{"worldSize", 2}}}}
             .dump();
  }
  const std::string cmd = "/usr/bin/python3 " + std::string(ZT_SOURCE_DIR) +
                          "/examples/python/zt_client.py --coordinator " + address_ +
                          " --token-file " + state_dir_ + "/token " + job_json + " 2>&1";
  std::FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  EXPECT_EQ(WEXITSTATUS(status), 0) << out;
  EXPECT_NE(out.find("final state: SUCCEEDED"), std::string::npos) << out;
}

// `zt_memory_bytes` samples of one rank: category → bytes, for source plan or measured.
std::map<std::string, int64_t> MemorySeries(const std::string& text, const std::string& rank,
                                            const std::string& source) {
  std::map<std::string, int64_t> out;
  static const std::regex kSample(R"(^zt_memory_bytes\{([^}]*)\} ([0-9.e+]+)$)");
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::smatch m;
    if (!std::regex_match(line, m, kSample)) continue;
    const std::string labels = m[1];
    if (labels.find("rank=\"" + rank + "\"") == std::string::npos) continue;
    if (labels.find("source=\"" + source + "\"") == std::string::npos) continue;
    std::smatch c;
    if (std::regex_search(labels, c, std::regex(R"re(category="([a-z_]+)")re"))) {
      out[c[1]] = static_cast<int64_t>(std::stod(m[2]));
    }
  }
  return out;
}

std::string Fetch(int port, const std::string& save_to) {
  const std::string cmd =
      "/usr/bin/python3 -c \"import urllib.request,sys; "
      "sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:" +
      std::to_string(port) + "/metrics', timeout=10).read().decode())\" > " + save_to;
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  return ReadText(save_to);
}

TEST_F(DaemonTest, MetricsPassPromtoolAndMemoryGaugesEqualThePlan) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  const std::string job = WriteJob("metrics", Path("ckpt"), 4, 100000, 5, /*eval_interval=*/2);
  const std::string id = Submit(job);
  const json running = WaitFor(id, [](const json& s) { return StepOf(s) >= 3; });
  ASSERT_EQ(StateOf(running), "RUNNING") << running.dump();

  const std::string node_text = Fetch(MetricsPort(*nodes_["node-a"]), Path("node.prom"));
  const std::string coordinator_text = Fetch(MetricsPort(*coordinator_), Path("coord.prom"));
  for (const std::string& file : {Path("node.prom"), Path("coord.prom")}) {
    const RunResult r{
        std::system(("promtool check metrics < " + file + " > " + file + ".check 2>&1").c_str()),
        ReadText(file + ".check")};
    EXPECT_EQ(r.exit_code, 0) << file << ":\n" << r.output;
  }
  EXPECT_NE(coordinator_text.find("zt_jobs{"), std::string::npos);
  // The deployed scrape config is valid, and every series the Grafana dashboard queries is
  // one the daemons export (a family is listed by its # TYPE line even before its first
  // sample, e.g. validation loss before the first evaluation).
  const std::string deploy = std::string(ZT_SOURCE_DIR) + "/deploy";
  EXPECT_EQ(std::system(
                ("promtool check config " + deploy + "/prometheus/prometheus.yml > /dev/null 2>&1")
                    .c_str()),
            0);
  const std::string dashboard = ReadText(deploy + "/grafana/dashboards/zerotrain.json");
  ASSERT_FALSE(json::parse(dashboard, nullptr, false).is_discarded());
  // A name after a colon is a recording rule's (level:zt_metric:operation), not a series.
  static const std::regex kSeries(R"(([a-z_:]*)(zt_[a-z_]+))");
  int queried = 0;
  for (auto it = std::sregex_iterator(dashboard.begin(), dashboard.end(), kSeries);
       it != std::sregex_iterator(); ++it, ++queried) {
    if ((*it)[1].str().ends_with(":")) continue;
    std::string family = (*it)[2].str();
    if (family.ends_with("_bucket")) family.resize(family.size() - 7);
    EXPECT_TRUE(node_text.find("# TYPE " + family + " ") != std::string::npos ||
                coordinator_text.find("# TYPE " + family + " ") != std::string::npos)
        << family << " is on the dashboard but no daemon exports it";
  }
  EXPECT_GT(queried, 10);
  EXPECT_NE(node_text.find("zt_tokens_per_second{"), std::string::npos);

  // node-a runs ranks 0 and 1 (gang placement packs consecutive ranks onto a node).
  const auto plan = MemorySeries(node_text, "0", "plan");
  const auto measured = MemorySeries(node_text, "0", "measured");
  ASSERT_EQ(plan.size(), 8u) << node_text;
  EXPECT_EQ(plan, measured);
  const RunResult estimate = Zt("estimate " + job + " --json");
  ASSERT_EQ(estimate.exit_code, 0) << estimate.output;
  const json per_rank = json::parse(estimate.output)["per_rank"];
  for (const auto& [category, bytes] : plan) {
    EXPECT_EQ(bytes, per_rank[category].get<int64_t>()) << category;
  }

  // Cancel stops every rank within seconds and leaves the last checkpoint loadable.
  const auto cancel_start = Clock::now();
  ASSERT_EQ(Zt("cancel " + id).exit_code, 0);
  const json cancelled = WaitFor(
      id, [](const json& s) { return StateOf(s) == "CANCELLED"; }, std::chrono::seconds(30));
  EXPECT_EQ(StateOf(cancelled), "CANCELLED") << cancelled.dump(2);
  EXPECT_LT(Clock::now() - cancel_start, std::chrono::seconds(15));
  const RunResult exported = Zt("export " + Path("ckpt") + " --out " + Path("export") + " --quiet");
  EXPECT_EQ(exported.exit_code, 0) << exported.output;
}

// Issue 20, regression: a data path missing on the node (NOT_FOUND) was restarted until every
// restart was spent (4 attempts). The node checks the job's inputs before its ranks start and
// reports a permanent code: the job fails after its first attempt, naming the path. The same
// for a pattern that matches nothing there.
TEST_F(DaemonTest, DataMissingOnTheNodeFailsTheJobAfterOneAttemptNamingThePath) {
  ASSERT_NO_FATAL_FAILURE(StartCoordinator());
  std::filesystem::create_directories(Path("shards"));
  std::filesystem::copy_file(Path("train.bin"), Path("gone.bin"));
  std::filesystem::copy_file(Path("train.bin"), Path("shards/shard_0.bin"));
  auto job_on = [&](const std::string& name, const std::string& data) {
    std::string text = ReadText(WriteJob(name, Path("ckpt-" + name), 4, 5, 1000));
    const std::string train = "train: [" + Path("train.bin") + "]";
    text.replace(text.find(train), train.size(), "train: [\"" + data + "\"]");
    std::ofstream(Path(name + ".yaml")) << text;
    return Path(name + ".yaml");
  };
  // `zt submit` checks the paths where it runs: they exist there, then vanish before placement.
  const std::string plain = Submit(job_on("plain", Path("gone.bin")));
  const std::string pattern = Submit(job_on("pattern", Path("shards/shard_*.bin")));
  ASSERT_FALSE(plain.empty());
  ASSERT_FALSE(pattern.empty());
  std::filesystem::remove(Path("gone.bin"));
  std::filesystem::remove(Path("shards/shard_0.bin"));
  ASSERT_NO_FATAL_FAILURE(StartNode("node-a", 4));
  for (const auto& [id, expected] :
       {std::pair<std::string, std::string>{
            plain, "data.train[0]: '" + Path("gone.bin") + "' does not exist"},
        {pattern, "data.train[0]: pattern '" + Path("shards/shard_*.bin") + "' matches no file"}}) {
    ExpectFailedAfterOneAttempt(id, {"NOT_FOUND", expected});
  }
}

// Issue 20, regression: resuming from a checkpoint written for another configuration fails
// FAILED_PRECONDITION in every rank; that was restarted until the restarts were spent.
TEST_F(DaemonTest, CheckpointOfAnotherConfigurationFailsTheJobAfterOneAttempt) {
  ASSERT_NO_FATAL_FAILURE(StartCoordinator());
  const std::string ckpt = Path("ckpt");
  const RunResult trained =
      Zt("train " + WriteJob("first", ckpt, 4, 2, 1) + " --quiet --run-dir " + Path("run"));
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  // The same job with another learning rate: the optimizer's configuration differs.
  std::string text = ReadText(WriteJob("other", Path("other-ckpt"), 4, 4, 1));
  const std::string lr = "lr: 1.0e-3";
  text.replace(text.find(lr), lr.size(), "lr: 2.0e-3");
  std::ofstream(Path("other.yaml")) << text;
  const RunResult resumed = Zt("resume " + ckpt + " --job " + Path("other.yaml") + " --json");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const std::string id = JobIdOf(resumed);
  ASSERT_FALSE(id.empty()) << resumed.output;
  ASSERT_NO_FATAL_FAILURE(StartNode("node-a", 4));
  ExpectFailedAfterOneAttempt(id, {"FAILED_PRECONDITION", "another optimizer configuration"});
}

// Issue 20: job `owner` saved steps 3 and 6 into D; job `intruder`, another name, the same D,
// was accepted, resumed from owner's step 6, and its pruning deleted owner's steps.
TEST_F(DaemonTest, AnotherJobsCheckpointsAreNeverTakenOverUnlessAskedFor) {
  ASSERT_NO_FATAL_FAILURE(StartCoordinator());
  ASSERT_NO_FATAL_FAILURE(StartNode("node-a", 2));
  const std::string ckpt = Path("ckpt");
  const std::string owner = Submit(WriteJob("owner", ckpt, 2, 6, 3));
  ASSERT_FALSE(owner.empty());
  const json done = WaitFor(owner, [](const json& s) { return Ended(s); });
  ASSERT_EQ(StateOf(done), "SUCCEEDED") << done.dump(2);
  const std::string weights = ExportedWeights(ckpt, Path("owner-export"));
  const std::string owner_record = ReadText(ckpt + "/owner");
  EXPECT_NE(owner_record.find("\"" + owner + "\""), std::string::npos) << owner_record;

  const RunResult intruder = Zt("submit " + WriteJob("intruder", ckpt, 2, 12, 3) + " --json");
  EXPECT_NE(intruder.exit_code, 0) << intruder.output;
  EXPECT_NE(intruder.output.find("'" + ckpt + "' holds the checkpoints of job " + owner),
            std::string::npos)
      << intruder.output;
  EXPECT_TRUE(std::filesystem::exists(ckpt + "/step-00000003")) << "owner's step 3 pruned";
  EXPECT_TRUE(std::filesystem::exists(ckpt + "/step-00000006")) << "owner's step 6 pruned";
  EXPECT_EQ(ExportedWeights(ckpt, Path("after-export")), weights);

  // Continuing is explicit: zt resume D --job FILE takes the directory over from step 6.
  const RunResult resumed = Zt("resume " + ckpt + " --job " + Path("intruder.yaml") + " --json");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const std::string continued = JobIdOf(resumed);
  const json ended = WaitFor(continued, [](const json& s) { return Ended(s); });
  ASSERT_EQ(StateOf(ended), "SUCCEEDED") << ended.dump(2);
  EXPECT_EQ(Int(ended["attempts"][0].value("resumed_from_step", json())), 6) << ended.dump(2);
  EXPECT_NE(ReadText(ckpt + "/owner").find("\"" + continued + "\""), std::string::npos);
}

}  // namespace
}  // namespace zt::testing
