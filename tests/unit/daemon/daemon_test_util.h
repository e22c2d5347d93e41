// Shared by the daemon tests: temporary state directories, a small valid job, and a
// coordinator served over real gRPC on 127.0.0.1:0 with a fake node driven by the test.
#pragma once

#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/auth.h"
#include "daemon/control_server.h"
#include "daemon/coordinator.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/control.grpc.pb.h"
#include "proto/job.pb.h"

namespace zt::testing {

// A directory removed with everything in it when the object goes away.
class TempDir {
 public:
  TempDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "zt-daemon-test-XXXXXX").string();
    char* made = ::mkdtemp(pattern.data());
    EXPECT_NE(made, nullptr);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }
  std::string Sub(const std::string& name) const { return absl::StrCat(path_, "/", name); }

 private:
  std::string path_;
};

// A tiny GPT-2 that validates and plans in milliseconds: `world_size` CPU ranks, data under
// `root` (the files need not exist: the coordinator does not check them).
inline zerotrain::JobSpec SmallJob(const std::string& name, const std::string& root,
                                   int world_size) {
  zerotrain::JobSpec spec;
  spec.set_name(name);
  zerotrain::ModelConfig* model = spec.mutable_model();
  model->set_family(zerotrain::ModelConfig::GPT2);
  model->set_n_layer(2);
  model->set_n_head(4);
  model->set_d_model(64);
  model->set_vocab_size(256);
  model->set_max_seq_len(64);
  spec.mutable_data()->add_train(absl::StrCat(root, "/train.bin"));
  spec.mutable_data()->set_seq_len(32);
  spec.mutable_train()->set_micro_batch_size(2);
  spec.mutable_train()->set_max_steps(5);
  spec.mutable_optimizer()->set_lr(1e-3f);
  spec.mutable_parallel()->set_world_size(world_size);
  spec.mutable_resources()->set_device(zerotrain::ResourceConfig::CPU);
  return spec;
}

inline zerotrain::NodeInfo NodeWithDevices(const std::string& id, int devices,
                                           int64_t memory_bytes) {
  zerotrain::NodeInfo info;
  info.set_id(id);
  info.set_hostname(id);
  for (int i = 0; i < devices; ++i) {
    zerotrain::DeviceInfo* d = info.add_devices();
    d->set_index(i);
    d->set_kind(zerotrain::ResourceConfig::CPU);
    d->set_name("cpu");
    d->set_memory_bytes(memory_bytes);
  }
  return info;
}

inline std::shared_ptr<grpc::Channel> LoopbackChannel(int port) {
  grpc::ChannelArguments args;
  // gRPC would send loopback calls through http_proxy when it is set.
  args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
  args.SetMaxSendMessageSize(64 << 20);
  return grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                   grpc::InsecureChannelCredentials(), args);
}

// A coordinator over `state_dir` served on 127.0.0.1:0, and stubs that carry its token.
class Harness {
 public:
  explicit Harness(const std::string& state_dir, CoordinatorOptions options = {}) {
    options.state_dir = state_dir;
    absl::StatusOr<std::string> token = EnsureToken(state_dir);
    EXPECT_TRUE(token.ok()) << token.status();
    token_ = token.value_or("");
    absl::StatusOr<std::unique_ptr<Coordinator>> coordinator = Coordinator::Create(options);
    EXPECT_TRUE(coordinator.ok()) << coordinator.status();
    if (!coordinator.ok()) return;
    coordinator_ = *std::move(coordinator);
    absl::StatusOr<std::unique_ptr<ControlServer>> server =
        StartControlServer({.listen_address = "127.0.0.1:0"}, coordinator_.get(), token_);
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) return;
    server_ = *std::move(server);
    channel_ = LoopbackChannel(server_->port());
    jobs = zerotrain::JobService::NewStub(channel_);
    nodes = zerotrain::NodeService::NewStub(channel_);
    store = zerotrain::RendezvousService::NewStub(channel_);
  }
  ~Harness() {
    if (server_ != nullptr) server_->Shutdown();
    if (coordinator_ != nullptr) coordinator_->Shutdown();
  }

  bool ok() const { return server_ != nullptr; }
  Coordinator& coordinator() { return *coordinator_; }
  const std::string& token() const { return token_; }
  int port() const { return server_->port(); }

  // A context with the token and a deadline.
  std::unique_ptr<grpc::ClientContext> Context(
      std::chrono::milliseconds timeout = std::chrono::seconds(20)) const {
    auto context = std::make_unique<grpc::ClientContext>();
    context->AddMetadata("authorization", absl::StrCat("Bearer ", token_));
    context->set_deadline(std::chrono::system_clock::now() + timeout);
    return context;
  }

  std::unique_ptr<zerotrain::JobService::Stub> jobs;
  std::unique_ptr<zerotrain::NodeService::Stub> nodes;
  std::unique_ptr<zerotrain::RendezvousService::Stub> store;

 private:
  std::string token_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<ControlServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

// A node as the test drives it: registered, with its assignment stream open.
class FakeNode {
 public:
  FakeNode(Harness& harness, zerotrain::NodeInfo info,
           const std::vector<zerotrain::RunningAttempt>& running = {})
      : harness_(harness), info_(info) {
    Register(running);
    zerotrain::AssignmentsRequest request;
    request.set_node_id(info_.id());
    stream_context_ = harness_.Context(std::chrono::seconds(60));
    stream_ = harness_.nodes->Assignments(stream_context_.get(), request);
  }
  ~FakeNode() { Close(); }

  void Close() {
    if (stream_ == nullptr) return;
    stream_context_->TryCancel();
    (void)stream_->Finish();
    stream_.reset();
  }

  void Register(const std::vector<zerotrain::RunningAttempt>& running = {}) {
    zerotrain::RegisterRequest request;
    *request.mutable_info() = info_;
    for (const auto& r : running) *request.add_running() = r;
    zerotrain::RegisterResponse response;
    grpc::Status status = harness_.nodes->Register(harness_.Context().get(), request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
  }

  bool Heartbeat() {
    zerotrain::HeartbeatRequest request;
    request.set_node_id(info_.id());
    zerotrain::HeartbeatResponse response;
    grpc::Status status = harness_.nodes->Heartbeat(harness_.Context().get(), request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return !response.register_again();
  }

  // The next assignment (fails the test when the stream ends first).
  zerotrain::Assignment Next() {
    zerotrain::Assignment assignment;
    EXPECT_TRUE(stream_->Read(&assignment)) << "assignment stream of " << info_.id() << " ended";
    return assignment;
  }

  grpc::Status Report(const std::string& job_id, int attempt, int rank,
                      const std::function<void(zerotrain::RankReport*)>& fill,
                      zerotrain::RankReportResponse* response = nullptr) {
    zerotrain::RankReport report;
    report.set_node_id(info_.id());
    report.set_job_id(job_id);
    report.set_attempt(attempt);
    report.set_rank(rank);
    fill(&report);
    zerotrain::RankReportResponse ignored;
    return harness_.nodes->ReportRank(harness_.Context().get(), report,
                                      response != nullptr ? response : &ignored);
  }
  grpc::Status Started(const std::string& job_id, int attempt, int rank) {
    return Report(job_id, attempt, rank, [](zerotrain::RankReport* r) { r->mutable_started(); });
  }
  grpc::Status Exit(const std::string& job_id, int attempt, int rank,
                    zerotrain::RankExit::Outcome outcome, const std::string& message = "",
                    bool preempted = false) {
    return Report(job_id, attempt, rank, [&](zerotrain::RankReport* r) {
      r->mutable_exit()->set_outcome(outcome);
      r->mutable_exit()->set_message(message);
      r->mutable_exit()->set_preempted(preempted);
    });
  }

  // A FAILED exit as a node sends it: the status's text and its code.
  grpc::Status ExitFailed(const std::string& job_id, int attempt, int rank,
                          const absl::Status& status) {
    return Report(job_id, attempt, rank, [&](zerotrain::RankReport* r) {
      r->mutable_exit()->set_outcome(zerotrain::RankExit::FAILED);
      r->mutable_exit()->set_message(status.ToString());
      r->mutable_exit()->set_status_code(static_cast<int32_t>(status.code()));
    });
  }

 private:
  Harness& harness_;
  zerotrain::NodeInfo info_;
  std::unique_ptr<grpc::ClientContext> stream_context_;
  std::unique_ptr<grpc::ClientReader<zerotrain::Assignment>> stream_;
};

}  // namespace zt::testing
