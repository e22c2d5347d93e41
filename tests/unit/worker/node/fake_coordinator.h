// A coordinator for the node daemon's tests: the parts of NodeService and RendezvousService a
// node uses, served over real gRPC on loopback, recording what the node sends. Its state lives
// apart from the server, so the server can stop and start again on the same port (a
// coordinator restart) while the rendezvous keys survive, as they do in the real coordinator's
// RocksDB.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/control.grpc.pb.h"
#include "worker/comm/store.h"

namespace zt::testing {

struct FakeCoordinatorState {
  explicit FakeCoordinatorState(std::string t) : token(std::move(t)) {}

  // Waits up to `timeout` for `done` (called with mu held) to hold.
  bool WaitFor(const std::function<bool()>& done,
               std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, timeout, done);
  }
  void Push(zerotrain::Assignment assignment) {
    std::lock_guard<std::mutex> lock(mu);
    queue.push_back(std::move(assignment));
    cv.notify_all();
  }
  InProcessStore& StoreOf(const std::string& scope) {
    std::lock_guard<std::mutex> lock(mu);
    std::unique_ptr<InProcessStore>& s = stores[scope];
    if (!s) s = std::make_unique<InProcessStore>();
    return *s;
  }
  std::vector<zerotrain::RankReport> Reports() {
    std::lock_guard<std::mutex> lock(mu);
    return reports;
  }

  const std::string token;
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, std::unique_ptr<InProcessStore>> stores;
  std::vector<zerotrain::RegisterRequest> registrations;
  int heartbeats = 0;
  int heartbeat_interval_ms = 100;
  // The next heartbeat answers register_again (then this resets).
  bool ask_register_again = false;
  std::vector<zerotrain::RankReport> reports;
  std::deque<zerotrain::Assignment> queue;
  // Called with every report, outside mu, before it is recorded; its result is the answer's
  // `stop`.
  std::function<bool(const zerotrain::RankReport&)> on_report;
};

inline grpc::Status Authorize(const grpc::ServerContext* context, const std::string& token) {
  const auto& metadata = context->client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing authorization metadata");
  }
  if (std::string(it->second.data(), it->second.size()) != "Bearer " + token) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "wrong token");
  }
  return grpc::Status::OK;
}

class FakeNodeService : public zerotrain::NodeService::Service {
 public:
  explicit FakeNodeService(FakeCoordinatorState* state) : state_(state) {}

  grpc::Status Register(grpc::ServerContext* context, const zerotrain::RegisterRequest* request,
                        zerotrain::RegisterResponse* response) override {
    if (grpc::Status s = Authorize(context, state_->token); !s.ok()) return s;
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->registrations.push_back(*request);
    response->set_heartbeat_interval_ms(state_->heartbeat_interval_ms);
    state_->cv.notify_all();
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(grpc::ServerContext* context, const zerotrain::HeartbeatRequest*,
                         zerotrain::HeartbeatResponse* response) override {
    if (grpc::Status s = Authorize(context, state_->token); !s.ok()) return s;
    std::lock_guard<std::mutex> lock(state_->mu);
    ++state_->heartbeats;
    response->set_register_again(state_->ask_register_again);
    state_->ask_register_again = false;
    state_->cv.notify_all();
    return grpc::Status::OK;
  }
  grpc::Status Assignments(grpc::ServerContext* context, const zerotrain::AssignmentsRequest*,
                           grpc::ServerWriter<zerotrain::Assignment>* writer) override {
    if (grpc::Status s = Authorize(context, state_->token); !s.ok()) return s;
    while (!context->IsCancelled()) {
      zerotrain::Assignment next;
      {
        std::unique_lock<std::mutex> lock(state_->mu);
        if (!state_->cv.wait_for(lock, std::chrono::milliseconds(20),
                                 [&] { return !state_->queue.empty(); })) {
          continue;
        }
        next = state_->queue.front();
        state_->queue.pop_front();
      }
      if (!writer->Write(next)) break;
    }
    return grpc::Status::OK;
  }
  grpc::Status ReportRank(grpc::ServerContext* context, const zerotrain::RankReport* request,
                          zerotrain::RankReportResponse* response) override {
    if (grpc::Status s = Authorize(context, state_->token); !s.ok()) return s;
    std::function<bool(const zerotrain::RankReport&)> hook;
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      hook = state_->on_report;
    }
    if (hook && hook(*request)) response->set_stop(true);
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->reports.push_back(*request);
    state_->cv.notify_all();
    return grpc::Status::OK;
  }

 private:
  FakeCoordinatorState* const state_;
};

class FakeRendezvousService : public zerotrain::RendezvousService::Service {
 public:
  explicit FakeRendezvousService(FakeCoordinatorState* state) : state_(state) {}

  grpc::Status StoreSet(grpc::ServerContext* context, const zerotrain::StoreSetRequest* request,
                        zerotrain::StoreSetResponse*) override {
    if (grpc::Status s = Authorize(context, state_->token); !s.ok()) return s;
    return ToGrpc(state_->StoreOf(request->scope()).Set(request->key(), request->value()));
  }
  grpc::Status StoreGet(grpc::ServerContext* context, const zerotrain::StoreGetRequest* request,
                        zerotrain::StoreGetResponse* response) override {
    if (grpc::Status s = Authorize(context, state_->token); !s.ok()) return s;
    absl::StatusOr<std::string> value = state_->StoreOf(request->scope()).Get(request->key());
    if (!value.ok()) return ToGrpc(value.status());
    response->set_value(*value);
    return grpc::Status::OK;
  }
  // Polls, so that a server shutting down (which cancels the call) is not held up.
  grpc::Status StoreWait(grpc::ServerContext* context, const zerotrain::StoreWaitRequest* request,
                         zerotrain::StoreWaitResponse*) override {
    if (grpc::Status s = Authorize(context, state_->token); !s.ok()) return s;
    InProcessStore& store = state_->StoreOf(request->scope());
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(request->timeout_ms());
    while (true) {
      std::vector<std::string> missing;
      for (const std::string& key : request->keys()) {
        if (!store.Contains(key).value()) missing.push_back(key);
      }
      if (missing.empty()) return grpc::Status::OK;
      if (context->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
      if (std::chrono::steady_clock::now() >= deadline) {
        return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                            absl::StrCat("keys not set: ", absl::StrJoin(missing, ", ")));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  grpc::Status StoreAdd(grpc::ServerContext* context, const zerotrain::StoreAddRequest* request,
                        zerotrain::StoreAddResponse* response) override {
    if (grpc::Status s = Authorize(context, state_->token); !s.ok()) return s;
    absl::StatusOr<int64_t> value =
        state_->StoreOf(request->scope()).Add(request->key(), request->delta());
    if (!value.ok()) return ToGrpc(value.status());
    response->set_value(*value);
    return grpc::Status::OK;
  }

 private:
  static grpc::Status ToGrpc(const absl::Status& s) {
    return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
  }
  FakeCoordinatorState* const state_;
};

// The server around the services; Start/Stop as often as a test likes.
class FakeCoordinator {
 public:
  explicit FakeCoordinator(std::string token) : state_(std::move(token)) {}
  ~FakeCoordinator() { Stop(); }

  // Listens on 127.0.0.1:`port` (0: any free port, kept for later restarts).
  void Start(int port = 0) {
    node_ = std::make_unique<FakeNodeService>(&state_);
    rendezvous_ = std::make_unique<FakeRendezvousService>(&state_);
    grpc::ServerBuilder builder;
    builder.AddListeningPort(absl::StrCat("127.0.0.1:", port), grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(node_.get());
    builder.RegisterService(rendezvous_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr) << "cannot listen on 127.0.0.1:" << port;
    ASSERT_GT(port_, 0);
  }
  void Stop() {
    if (!server_) return;
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(100));
    server_->Wait();
    server_.reset();
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  int port() const { return port_; }
  FakeCoordinatorState& state() { return state_; }

 private:
  FakeCoordinatorState state_;
  std::unique_ptr<FakeNodeService> node_;
  std::unique_ptr<FakeRendezvousService> rendezvous_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace zt::testing
