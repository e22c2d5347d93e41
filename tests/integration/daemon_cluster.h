// Real daemons on loopback for the control-plane tests: a `ztd --coordinator` and any number
// of `ztd --node` processes sharing a scratch directory, and `zt` commands pointed at them
// through $ZT_STATE_DIR (the coordinator writes its address and token there).
#pragma once

#include <stdlib.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/scratch_dir_test.h"
#include "tests/integration/zt_process.h"

namespace zt::testing {

class DaemonClusterTest : public ScratchDirTest {
 protected:
  DaemonClusterTest() : ScratchDirTest("zt-daemons") {}

  void SetUp() override {
    ScratchDirTest::SetUp();
    state_dir_ = Path("state");
    ::setenv("ZT_STATE_DIR", state_dir_.c_str(), 1);
    ::unsetenv("ZT_COORDINATOR");
    ::unsetenv("ZT_TOKEN");
  }
  void TearDown() override {
    nodes_.clear();
    coordinator_.reset();
    ScratchDirTest::TearDown();
  }

  // Starts the coordinator (on `port`, 0: any; `extra` flags after the others) and waits until
  // it serves.
  void StartCoordinator(int port = 0, const std::vector<std::string>& extra = {}) {
    std::filesystem::remove(state_dir_ + "/address");
    std::vector<std::string> args = {"--coordinator",
                                     "--listen",
                                     "127.0.0.1:" + std::to_string(port),
                                     "--state-dir",
                                     state_dir_,
                                     "--metrics-addr",
                                     "127.0.0.1:0",
                                     "--heartbeat-interval-ms",
                                     "300",
                                     "--allowed-root",
                                     dir_.string()};
    args.insert(args.end(), extra.begin(), extra.end());
    coordinator_ = std::make_unique<ZtProcess>(
        args, Path("coordinator." + std::to_string(++coordinator_starts_) + ".log"), "ztd");
    ASSERT_TRUE(coordinator_->started());
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    // ztd writes the address file just before it prints its "listening on" line (which tests
    // read): wait for the line too.
    while (!std::filesystem::exists(state_dir_ + "/address") || MetricsPort(*coordinator_) == 0 ||
           coordinator_->Output().find("coordinator listening on") == std::string::npos) {
      ASSERT_FALSE(coordinator_->Poll().has_value()) << coordinator_->Output();
      ASSERT_LT(Clock::now(), deadline) << coordinator_->Output();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    address_ = ReadText(state_dir_ + "/address");
    while (!address_.empty() && address_.back() == '\n') address_.pop_back();
  }

  int CoordinatorPort() const { return std::stoi(address_.substr(address_.rfind(':') + 1)); }

  // Starts a node daemon with `devices` CPU devices of `device_memory` bytes each and waits
  // until it registered.
  void StartNode(const std::string& id, int devices = 2, int64_t device_memory = int64_t{4} << 30,
                 const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {"--node",
                                     "--coordinator-addr",
                                     address_,
                                     "--token-file",
                                     state_dir_ + "/token",
                                     "--node-id",
                                     id,
                                     "--cpu-devices",
                                     std::to_string(devices),
                                     "--device-memory",
                                     std::to_string(device_memory),
                                     "--metrics-addr",
                                     "127.0.0.1:0",
                                     "--allowed-root",
                                     dir_.string()};
    args.insert(args.end(), extra.begin(), extra.end());
    auto node = std::make_unique<ZtProcess>(
        args, Path("node-" + id + "." + std::to_string(++node_starts_[id]) + ".log"), "ztd");
    ASSERT_TRUE(node->started());
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    while (node->Output().find("registered") == std::string::npos) {
      ASSERT_FALSE(node->Poll().has_value()) << node->Output();
      ASSERT_LT(Clock::now(), deadline) << node->Output();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    nodes_[id] = std::move(node);
  }

  // The port of a daemon's Prometheus endpoint, from its start-up line (0 until printed).
  static int MetricsPort(const ZtProcess& process) {
    static const std::regex kLine(R"(metrics on http://[0-9.]+:([0-9]+)/metrics)");
    std::smatch m;
    const std::string out = process.Output();
    return std::regex_search(out, m, kLine) ? std::stoi(m[1]) : 0;
  }

  // `zt ARGS` against the cluster.
  static RunResult Zt(const std::string& args) { return RunZtCommand(args); }

  // `zt status JOB --json` parsed; null on failure.
  static nlohmann::json Status(const std::string& job_id) {
    const RunResult r = Zt("status " + job_id + " --json");
    if (r.exit_code != 0) return nullptr;
    return nlohmann::json::parse(r.output, nullptr, /*allow_exceptions=*/false);
  }

  // Polls the job until `done(status)` or the deadline; the last status.
  template <typename Pred>
  static nlohmann::json WaitFor(const std::string& job_id, Pred done,
                                std::chrono::seconds timeout = std::chrono::seconds(120)) {
    const auto deadline = Clock::now() + timeout;
    nlohmann::json s;
    while (Clock::now() < deadline) {
      s = Status(job_id);
      if (!s.is_null() && done(s)) return s;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return s;
  }

  // An integer field: protobuf's JSON mapping writes int64 as a string, int32 as a number.
  static int64_t Int(const nlohmann::json& value) {
    if (value.is_string()) return std::stoll(value.get<std::string>());
    return value.is_number() ? value.get<int64_t>() : 0;
  }

  static int64_t StepOf(const nlohmann::json& status) {
    if (!status.is_object() || !status.contains("progress")) return 0;
    return Int(status["progress"].value("step", nlohmann::json()));
  }

  // A stage-3 job over `world` ranks of a tiny GPT-2 on train.bin, checkpointing every
  // `interval` steps into ckpt_dir: what the daemon tests submit. With eval_interval > 0,
  // train.bin doubles as validation data, evaluated every that many steps.
  std::string WriteJob(const std::string& name, const std::string& ckpt_dir, int world, int steps,
                       int interval, int eval_interval = 0) {
    const std::string path = Path(name + ".yaml");
    std::ofstream f(path);
    f << "name: " << name << "\n"
      << "model: {family: GPT2, n_layer: 2, n_head: 2, d_model: 32, vocab_size: 64, "
         "max_seq_len: 16}\n"
      << "data: {train: [" << Path("train.bin") << "], seq_len: 16"
      << (eval_interval > 0 ? ", val: [" + Path("train.bin") + "]" : "") << "}\n"
      << "train: {micro_batch_size: 2, max_steps: " << steps << ", log_interval: 1000"
      << (eval_interval > 0 ? ", eval_steps: 1, eval_interval: " + std::to_string(eval_interval)
                            : "")
      << "}\n"
      << "optimizer: {lr: 1.0e-3}\n"
      << "parallel: {world_size: " << world << ", zero_stage: 3, comm_timeout_s: 20}\n"
      << "resources: {cpu_threads: 1}\n"
      << "checkpoint: {dir: " << ckpt_dir << ", interval_steps: " << interval << "}\n";
    return path;
  }

  // The final weights of `zt train` in one process on WriteJob's job over `world` ranks: the
  // uninterrupted run that daemons' runs of the same job must match.
  std::string ZtTrainWeights(int world, int steps, int interval) {
    const std::string ckpt = Path("reference-ckpt");
    const std::string job = WriteJob("reference", ckpt, world, steps, interval);
    const RunResult r = Zt("train " + job + " --quiet --run-dir " + Path("reference-run"));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return ExportedWeights(ckpt, Path("reference-export"));
  }

  // The weights of the latest checkpoint in `ckpt_dir`, as `zt export` writes them.
  std::string ExportedWeights(const std::string& ckpt_dir, const std::string& out) {
    const RunResult r = Zt("export " + ckpt_dir + " --out " + out + " --quiet");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return ReadText(out + "/model.safetensors");
  }

  std::string state_dir_;
  std::string address_;
  std::unique_ptr<ZtProcess> coordinator_;
  std::map<std::string, std::unique_ptr<ZtProcess>> nodes_;

 private:
  int coordinator_starts_ = 0;
  std::map<std::string, int> node_starts_;
};

}  // namespace zt::testing
