// gRPC clients of a real coordinator for the robustness tests: job-API callers whose calls wait
// for the channel to be ready within their deadline, simulated nodes that register and
// heartbeat, and a tiny job spec that validates and plans in milliseconds.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "proto/control.grpc.pb.h"
#include "worker/node/control_channel.h"

namespace zt::testing {

// A context with the token and a deadline. wait_for_ready: a call made while the channel is
// still connecting (many clients at once) waits for it instead of failing at once; the
// deadline still bounds it.
inline std::unique_ptr<grpc::ClientContext> ReadyContext(const std::string& token,
                                                         std::chrono::milliseconds timeout) {
  auto context = AuthorizedContext(token, timeout);
  context->set_wait_for_ready(true);
  return context;
}

struct JobClient {
  JobClient(const std::string& address, const std::string& token) : token(token) {
    auto made = ConnectControlPlane({.address = address});
    if (made.ok()) {
      channel = *made;
      jobs = zerotrain::JobService::NewStub(channel);
    }
  }
  std::unique_ptr<grpc::ClientContext> Context(
      std::chrono::milliseconds timeout = std::chrono::seconds(20)) const {
    return ReadyContext(token, timeout);
  }
  std::string token;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<zerotrain::JobService::Stub> jobs;
};

// A tiny GPT-2 job of `world_size` CPU ranks reading `root`/train.bin (the coordinator does
// not open it).
inline zerotrain::JobSpec TinySpec(const std::string& name, const std::string& root,
                                   int world_size = 1) {
  zerotrain::JobSpec spec;
  spec.set_name(name);
  zerotrain::ModelConfig* model = spec.mutable_model();
  model->set_family(zerotrain::ModelConfig::GPT2);
  model->set_n_layer(2);
  model->set_n_head(2);
  model->set_d_model(32);
  model->set_vocab_size(64);
  model->set_max_seq_len(16);
  spec.mutable_data()->add_train(absl::StrCat(root, "/train.bin"));
  spec.mutable_data()->set_seq_len(16);
  spec.mutable_train()->set_micro_batch_size(2);
  spec.mutable_train()->set_max_steps(5);
  spec.mutable_optimizer()->set_lr(1e-3f);
  spec.mutable_parallel()->set_world_size(world_size);
  spec.mutable_resources()->set_device(zerotrain::ResourceConfig::CPU);
  return spec;
}

// Nodes that register (`devices` CPU devices each) and heartbeat every `interval` from their
// own threads until the object goes away. They never start ranks: jobs placed on them stay
// PLACED, so the load is the control plane's alone. Failed calls are counted.
class SimulatedNodes {
 public:
  SimulatedNodes(const std::string& address, const std::string& token, int count, int devices,
                 std::chrono::milliseconds interval) {
    for (int i = 0; i < count; ++i) {
      threads_.emplace_back([=, this] {
        auto channel = ConnectControlPlane({.address = address});
        if (!channel.ok()) {
          failures_.fetch_add(1);
          return;
        }
        auto nodes = zerotrain::NodeService::NewStub(*channel);
        zerotrain::RegisterRequest request;
        zerotrain::NodeInfo* info = request.mutable_info();
        info->set_id(absl::StrCat("sim-", i));
        info->set_hostname(info->id());
        for (int d = 0; d < devices; ++d) {
          zerotrain::DeviceInfo* device = info->add_devices();
          device->set_index(d);
          device->set_kind(zerotrain::ResourceConfig::CPU);
          device->set_name("cpu");
          device->set_memory_bytes(int64_t{4} << 30);
        }
        zerotrain::RegisterResponse registered;
        if (!nodes
                 ->Register(ReadyContext(token, std::chrono::seconds(20)).get(), request,
                            &registered)
                 .ok()) {
          failures_.fetch_add(1);
        }
        while (!stop_.load()) {
          zerotrain::HeartbeatRequest beat;
          beat.set_node_id(info->id());
          zerotrain::HeartbeatResponse response;
          if (nodes->Heartbeat(ReadyContext(token, std::chrono::seconds(20)).get(), beat, &response)
                  .ok()) {
            heartbeats_.fetch_add(1);
          } else {
            failures_.fetch_add(1);
          }
          std::this_thread::sleep_for(interval);
        }
      });
    }
  }
  ~SimulatedNodes() {
    stop_.store(true);
    for (std::thread& t : threads_) t.join();
  }
  SimulatedNodes(const SimulatedNodes&) = delete;
  SimulatedNodes& operator=(const SimulatedNodes&) = delete;

  int heartbeats() const { return heartbeats_.load(); }
  int failures() const { return failures_.load(); }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<int> heartbeats_{0};
  std::atomic<int> failures_{0};
  std::vector<std::thread> threads_;
};

}  // namespace zt::testing
