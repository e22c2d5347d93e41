// Control-plane figures (issue 6), against real `ztd` processes on loopback.
//
//   --mode latency     `ztd --dev` (coordinator + a node of 2 CPU devices) as a child; `--jobs`
//                      tiny GPT-2 jobs submitted one after another through JobService.SubmitJob
//                      and watched with WatchJob: time from SubmitJob's return to PLACED,
//                      RUNNING and the first progress event with step >= 1. The reference is
//                      the same job under `zt train` (a child process): from its start to the
//                      first line of its metrics.jsonl.
//   --mode throughput  `ztd --coordinator` as a child; `--nodes` simulated nodes registered
//                      (8 devices of 80 GiB each), then Heartbeat driven for all of them from
//                      `--threads` client threads as fast as they go for `--seconds`, then
//                      SubmitJob of world-size-8 jobs for `--submit-seconds`; calls/s,
//                      p50/p99 latency, and the coordinator's VmRSS/VmHWM after registration
//                      and after the load.
//   --mode mixed       `ztd --coordinator` as a child (issue 20); `--nodes` simulated nodes that
//                      register and heartbeat every `--heartbeat-ms` from their own threads;
//                      then for each count in `--clients` (default 64,256), that many client
//                      threads, each on its own connection, mix SubmitJob (`--submit-percent`),
//                      ListJobs (pages of 20), GetJob, WatchJob (the history's first event, then
//                      hang up) and CancelJob for `--seconds`: calls/s, p50/p99 latency overall
//                      and by call, and the failure count with the first failure. Calls wait
//                      for their channel to be ready within a 30 s deadline. The coordinator's
//                      VmRSS is sampled every `--rss-interval` seconds over the whole run with
//                      the job count beside it, so a long run (--seconds 3600) shows whether
//                      memory stays flat or grows only with the jobs kept. With `--live-jobs N`
//                      a client holding N jobs retires its oldest instead of submitting: it
//                      cancels it, reports its ranks' exits as their (simulated) node would,
//                      and deletes it, so the coordinator holds a bounded number of jobs and
//                      any growth of its memory over an hour is a leak.
// Each mode prints one JSON line per figure group on stdout; progress goes to stderr.
// The client threads and the coordinator share this machine's cores.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "proto/control.grpc.pb.h"
#include "worker/data/token_shard.h"
#include "worker/node/control_channel.h"

namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

int64_t UnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The q-quantile (nearest rank) of `v`, which it sorts.
double Quantile(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())));
  return v[i];
}

// A child process with stdout and stderr sent to a log file; SIGTERM and a wait on
// destruction.
class Child {
 public:
  static absl::StatusOr<std::unique_ptr<Child>> Start(const std::vector<std::string>& argv,
                                                      const std::string& log_path) {
    const pid_t pid = fork();
    if (pid < 0) return absl::UnavailableError("fork failed");
    if (pid == 0) {
      FILE* log = std::fopen(log_path.c_str(), "w");
      if (log != nullptr) {
        dup2(fileno(log), STDOUT_FILENO);
        dup2(fileno(log), STDERR_FILENO);
      }
      std::vector<char*> args;
      for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    return std::unique_ptr<Child>(new Child(pid));
  }
  ~Child() { Stop(); }

  pid_t pid() const { return pid_; }
  bool Exited() {
    if (pid_ <= 0) return true;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = 0;
      return true;
    }
    return false;
  }
  void Stop() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = 0;
  }

 private:
  explicit Child(pid_t pid) : pid_(pid) {}
  pid_t pid_;
};

// VmRSS and VmHWM of `pid` in bytes.
std::pair<int64_t, int64_t> Rss(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  int64_t rss = 0, hwm = 0;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) rss = std::atoll(line.c_str() + 6) * 1024;
    if (line.rfind("VmHWM:", 0) == 0) hwm = std::atoll(line.c_str() + 6) * 1024;
  }
  return {rss, hwm};
}

std::string ReadTrimmed(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::string s = text.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// Waits for the coordinator of `child` to write <state_dir>/address; its address and token.
absl::StatusOr<std::pair<std::string, std::string>> WaitForCoordinator(Child& child,
                                                                       const std::string& state_dir,
                                                                       const std::string& log) {
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (!std::filesystem::exists(state_dir + "/address")) {
    if (child.Exited() || Clock::now() > deadline) {
      return absl::UnavailableError(absl::StrCat("ztd did not start; see ", log));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return std::make_pair(ReadTrimmed(state_dir + "/address"), ReadTrimmed(state_dir + "/token"));
}

std::unique_ptr<zerotrain::JobService::Stub> JobStub(const std::string& address) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = zt::ConnectControlPlane({address});
  return channel.ok() ? zerotrain::JobService::NewStub(*channel) : nullptr;
}

// ---------------------------------------------------------------------------------------------
// Submit-to-first-step latency

constexpr int kVocab = 64;
constexpr int kSeq = 16;

// The tiny job both paths run: GPT-2, 2 layers, d 32, vocab 64, seq 16, one CPU rank.
zerotrain::JobSpec TinyJob(const std::string& name, const std::string& train, int steps) {
  zerotrain::JobSpec spec;
  spec.set_name(name);
  zerotrain::ModelConfig* m = spec.mutable_model();
  m->set_family(zerotrain::ModelConfig::GPT2);
  m->set_n_layer(2);
  m->set_n_head(2);
  m->set_d_model(32);
  m->set_vocab_size(kVocab);
  m->set_max_seq_len(kSeq);
  spec.mutable_data()->add_train(train);
  spec.mutable_data()->set_seq_len(kSeq);
  spec.mutable_train()->set_micro_batch_size(2);
  spec.mutable_train()->set_max_steps(steps);
  spec.mutable_train()->set_log_interval(1000);
  spec.mutable_optimizer()->set_lr(1e-3f);
  spec.mutable_parallel()->set_world_size(1);
  spec.mutable_resources()->set_device(zerotrain::ResourceConfig::CPU);
  spec.mutable_resources()->set_cpu_threads(1);
  return spec;
}

std::string TinyJobYaml(const std::string& name, const std::string& train, int steps) {
  return absl::StrCat("name: ", name,
                      "\nmodel: {family: GPT2, n_layer: 2, n_head: 2, d_model: 32, vocab_size: ",
                      kVocab, ", max_seq_len: ", kSeq, "}\ndata: {train: [", train,
                      "], seq_len: ", kSeq, "}\ntrain: {micro_batch_size: 2, max_steps: ", steps,
                      ", log_interval: 1000}\noptimizer: {lr: 1.0e-3}\nparallel: {world_size: 1}\n"
                      "resources: {device: CPU, cpu_threads: 1}\n");
}

struct LatencySample {
  double submit_rpc_ms = 0;
  // From SubmitJob's return, by the coordinator's event timestamps (ms resolution; PLACED can
  // precede the return: the handler runs a scheduling pass before it answers).
  double to_placed_ms = 0;
  double to_running_ms = 0;
  double to_first_step_ms = 0;
  // The first step's event as the watching client received it (it arrives live).
  double to_first_step_received_ms = 0;
  double first_step_ms = 0;
};

absl::StatusOr<LatencySample> SubmitAndWatch(zerotrain::JobService::Stub& jobs,
                                             const std::string& token,
                                             const zerotrain::JobSpec& spec) {
  zerotrain::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  zerotrain::Job job;
  LatencySample s;
  const auto start = Clock::now();
  {
    auto context = zt::AuthorizedContext(token);
    grpc::Status status = jobs.SubmitJob(context.get(), request, &job);
    if (!status.ok()) return zt::FromGrpc(status, "SubmitJob");
  }
  s.submit_rpc_ms = MsSince(start);
  const auto returned = Clock::now();
  const int64_t returned_unix_ms = UnixMs();

  zerotrain::WatchJobRequest watch;
  watch.set_job_id(job.id());
  auto context = zt::AuthorizedContext(token, std::chrono::minutes(5));
  std::unique_ptr<grpc::ClientReader<zerotrain::JobEvent>> reader =
      jobs.WatchJob(context.get(), watch);
  zerotrain::JobEvent event;
  bool placed = false, running = false, stepped = false;
  zerotrain::Job::State last = zerotrain::Job::PENDING;
  while (reader->Read(&event)) {
    const double at = static_cast<double>(event.time_ms() - returned_unix_ms);
    last = event.state();
    if (!placed && event.state() == zerotrain::Job::PLACED) {
      placed = true;
      s.to_placed_ms = at;
    }
    if (!running && event.state() == zerotrain::Job::RUNNING) {
      running = true;
      s.to_running_ms = at;
    }
    if (!stepped && event.has_progress() && event.progress().step() >= 1) {
      stepped = true;
      s.to_first_step_ms = at;
      s.to_first_step_received_ms = MsSince(returned);
      s.first_step_ms = event.progress().step_ms();
    }
  }
  grpc::Status status = reader->Finish();
  if (!status.ok()) return zt::FromGrpc(status, "WatchJob");
  if (last != zerotrain::Job::SUCCEEDED || !placed || !running || !stepped) {
    return absl::InternalError(absl::StrCat(
        "job ", job.id(), " ended ", zerotrain::Job::State_Name(last), " without every milestone"));
  }
  return s;
}

// `zt train` on the same job: from the process start to the first metrics.jsonl line.
absl::StatusOr<double> ZtTrainToFirstStep(const std::string& zt, const std::string& dir, int i,
                                          const std::string& train, int steps) {
  const std::string job = absl::StrCat(dir, "/ref-", i, ".yaml");
  const std::string run = absl::StrCat(dir, "/ref-run-", i);
  std::ofstream(job) << TinyJobYaml(absl::StrCat("ref", i), train, steps);
  const std::string metrics = run + "/metrics.jsonl";
  const auto start = Clock::now();
  absl::StatusOr<std::unique_ptr<Child>> child =
      Child::Start({zt, "train", job, "--run-dir", run}, absl::StrCat(dir, "/ref-", i, ".log"));
  if (!child.ok()) return child.status();
  double first = -1;
  while (true) {
    if (first < 0 && std::filesystem::exists(metrics) && std::filesystem::file_size(metrics) > 0) {
      first = MsSince(start);
    }
    if ((*child)->Exited()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (first < 0) {
    return absl::InternalError(
        absl::StrCat("zt train wrote no metrics; see ", dir, "/ref-", i, ".log"));
  }
  return first;
}

int RunLatency(const std::string& ztd, const std::string& zt, const std::string& dir, int jobs,
               int steps) {
  const std::string train = dir + "/train.bin";
  std::vector<int32_t> tokens(1 << 14);
  std::mt19937 rng(7);
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % kVocab);
  if (absl::Status s = zt::WriteTokenShard(train, tokens, kVocab); !s.ok()) {
    std::fprintf(stderr, "control_plane_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  const std::string state = dir + "/dev-state";
  const std::string log = dir + "/ztd-dev.log";
  const auto spawn = Clock::now();
  absl::StatusOr<std::unique_ptr<Child>> child = Child::Start(
      {ztd, "--dev", "--state-dir", state, "--listen", "127.0.0.1:0", "--metrics-addr", "off"},
      log);
  if (!child.ok()) return 1;
  auto coordinator = WaitForCoordinator(**child, state, log);
  if (!coordinator.ok()) {
    std::fprintf(stderr, "control_plane_bench: %s\n", coordinator.status().ToString().c_str());
    return 1;
  }
  const auto& [address, token] = *coordinator;
  auto stub = JobStub(address);
  // The node registers after the coordinator serves: wait until it is there, so every job
  // measures placement and not the node's start.
  while (true) {
    zerotrain::ListNodesResponse nodes;
    auto context = zt::AuthorizedContext(token);
    if (stub->ListNodes(context.get(), {}, &nodes).ok() && nodes.nodes_size() > 0 &&
        nodes.nodes(0).healthy()) {
      break;
    }
    if (MsSince(spawn) > 60000) {
      std::fprintf(stderr, "control_plane_bench: no node registered; see %s\n", log.c_str());
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const double daemon_ready_ms = MsSince(spawn);

  std::vector<double> placed, running, first, received, step_ms, rpc;
  for (int i = 0; i < jobs; ++i) {
    absl::StatusOr<LatencySample> s =
        SubmitAndWatch(*stub, token, TinyJob(absl::StrCat("lat", i), train, steps));
    if (!s.ok()) {
      std::fprintf(stderr, "control_plane_bench: %s\n", s.status().ToString().c_str());
      return 1;
    }
    std::fprintf(stderr, "job %d: submit %.1f ms, placed %+.0f, running %+.0f, step 1 %+.0f ms\n",
                 i, s->submit_rpc_ms, s->to_placed_ms, s->to_running_ms, s->to_first_step_ms);
    rpc.push_back(s->submit_rpc_ms);
    placed.push_back(s->to_placed_ms);
    running.push_back(s->to_running_ms);
    first.push_back(s->to_first_step_ms);
    received.push_back(s->to_first_step_received_ms);
    step_ms.push_back(s->first_step_ms);
  }
  (*child)->Stop();

  std::vector<double> reference;
  if (!zt.empty()) {
    for (int i = 0; i < jobs; ++i) {
      absl::StatusOr<double> ms = ZtTrainToFirstStep(zt, dir, i, train, steps);
      if (!ms.ok()) {
        std::fprintf(stderr, "control_plane_bench: %s\n", ms.status().ToString().c_str());
        return 1;
      }
      std::fprintf(stderr, "zt train %d: first metrics line after %.0f ms\n", i, *ms);
      reference.push_back(*ms);
    }
  }
  auto summary = [](std::vector<double> v) {
    const double median = Quantile(v, 0.5);
    return nlohmann::json{{"median", median}, {"max", v.empty() ? 0 : v.back()}};
  };
  const nlohmann::json line = {{"mode", "latency"},
                               {"jobs", jobs},
                               {"steps", steps},
                               {"daemon_ready_ms", daemon_ready_ms},
                               {"submit_rpc_ms", summary(rpc)},
                               {"to_placed_ms", summary(placed)},
                               {"to_running_ms", summary(running)},
                               {"to_first_step_ms", summary(first)},
                               {"to_first_step_received_ms", summary(received)},
                               {"first_step_duration_ms", summary(step_ms)},
                               {"zt_train_to_first_step_ms", summary(reference)}};
  std::printf("%s\n", line.dump().c_str());
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Coordinator throughput

constexpr int kDevicesPerNode = 8;
constexpr int64_t kDeviceBytes = int64_t{80} << 30;

zerotrain::NodeInfo FakeNode(int i) {
  zerotrain::NodeInfo info;
  info.set_id(absl::StrCat("sim-", i));
  info.set_hostname(info.id());
  // CPU devices, as in the figures recorded before the coordinator accepted CUDA jobs, so the
  // runs stay comparable; jobs must be placeable for SubmitJob to exercise placement.
  for (int d = 0; d < kDevicesPerNode; ++d) {
    zerotrain::DeviceInfo* device = info.add_devices();
    device->set_index(d);
    device->set_kind(zerotrain::ResourceConfig::CPU);
    device->set_name("simulated 80 GiB device");
    device->set_memory_bytes(kDeviceBytes);
    device->set_peak_flops(1e15);
  }
  info.set_host_memory_bytes(int64_t{2} << 40);
  info.set_cpu_cores(128);
  return info;
}

struct CallStats {
  int64_t calls = 0;
  int64_t errors = 0;
  std::vector<double> latencies_ms;
  std::string first_error;
};

// Runs `call(stub, thread, i)` (nullopt: no call made) from `threads` threads, each with a stub of
// `Service` over its own connection, until `seconds` passed (or, with `per_thread` > 0, that many
// calls per thread); merged statistics.
template <typename Service, typename Call>
CallStats Drive(const std::string& address, int threads, double seconds, int64_t per_thread,
                Call call, double* elapsed_s) {
  std::vector<CallStats> stats(threads);
  std::vector<std::thread> workers;
  const auto start = Clock::now();
  const auto end = start + std::chrono::duration<double>(seconds);
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
      // Its own connection, as separate node processes would have.
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      auto stub = Service::NewStub(
          grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
      for (int64_t i = 0; per_thread > 0 ? i < per_thread : Clock::now() < end; ++i) {
        const auto before = Clock::now();
        std::optional<grpc::Status> status = call(*stub, t, i);
        if (!status.has_value()) continue;
        stats[t].latencies_ms.push_back(MsSince(before));
        ++stats[t].calls;
        if (!status->ok()) {
          if (stats[t].errors++ == 0) stats[t].first_error = status->error_message();
        }
      }
    });
  }
  for (std::thread& w : workers) w.join();
  *elapsed_s = MsSince(start) / 1e3;
  CallStats all;
  for (CallStats& s : stats) {
    all.calls += s.calls;
    all.errors += s.errors;
    if (all.first_error.empty()) all.first_error = s.first_error;
    all.latencies_ms.insert(all.latencies_ms.end(), s.latencies_ms.begin(), s.latencies_ms.end());
  }
  return all;
}

nlohmann::json Summarize(CallStats& s, double elapsed_s) {
  nlohmann::json j = {{"calls", s.calls},
                      {"errors", s.errors},
                      {"seconds", elapsed_s},
                      {"calls_per_s", static_cast<double>(s.calls) / elapsed_s},
                      {"p50_ms", Quantile(s.latencies_ms, 0.5)},
                      {"p99_ms", Quantile(s.latencies_ms, 0.99)},
                      {"max_ms", s.latencies_ms.empty() ? 0 : s.latencies_ms.back()}};
  if (!s.first_error.empty()) j["first_error"] = s.first_error;
  return j;
}

struct CoordinatorChild {
  std::unique_ptr<Child> child;
  std::string address, token;
};

// `ztd --coordinator` in `dir`, without metrics, once it serves; errors are printed.
std::optional<CoordinatorChild> StartCoordinatorChild(const std::string& ztd,
                                                      const std::string& dir, int heartbeat_ms) {
  const std::string state = dir + "/coordinator-state";
  const std::string log = dir + "/ztd-coordinator.log";
  absl::StatusOr<std::unique_ptr<Child>> child =
      Child::Start({ztd, "--coordinator", "--listen", "127.0.0.1:0", "--state-dir", state,
                    "--metrics-addr", "off", "--heartbeat-interval-ms", absl::StrCat(heartbeat_ms)},
                   log);
  if (!child.ok()) return std::nullopt;
  auto coordinator = WaitForCoordinator(**child, state, log);
  if (!coordinator.ok()) {
    std::fprintf(stderr, "control_plane_bench: %s\n", coordinator.status().ToString().c_str());
    return std::nullopt;
  }
  return CoordinatorChild{*std::move(child), coordinator->first, coordinator->second};
}

int RunThroughput(const std::string& ztd, const std::string& dir, int nodes, int threads,
                  double seconds, double submit_seconds) {
  // A 60 s heartbeat interval keeps the nodes alive through registration and the SubmitJob
  // phase, when nothing heartbeats them; it changes nothing in what a heartbeat costs.
  std::optional<CoordinatorChild> started = StartCoordinatorChild(ztd, dir, 60000);
  if (!started) return 1;
  const std::string address = started->address, token = started->token;
  std::unique_ptr<Child>* child = &started->child;
  const pid_t pid = (*child)->pid();
  const auto [rss_idle, hwm_idle] = Rss(pid);

  double elapsed = 0;
  std::fprintf(stderr, "registering %d nodes from %d threads\n", nodes, threads);
  const int64_t per_thread = (nodes + threads - 1) / threads;
  CallStats reg = Drive<zerotrain::NodeService>(
      address, threads, 0, per_thread,
      [&](zerotrain::NodeService::Stub& stub, int t, int64_t i) -> std::optional<grpc::Status> {
        const int64_t n = t * per_thread + i;
        if (n >= nodes) return std::nullopt;
        zerotrain::RegisterRequest request;
        *request.mutable_info() = FakeNode(static_cast<int>(n));
        zerotrain::RegisterResponse response;
        auto context = zt::AuthorizedContext(token);
        return stub.Register(context.get(), request, &response);
      },
      &elapsed);
  const nlohmann::json registration = Summarize(reg, elapsed);
  const auto [rss_registered, hwm_registered] = Rss(pid);

  std::fprintf(stderr, "heartbeats for %.0f s from %d threads\n", seconds, threads);
  CallStats beats = Drive<zerotrain::NodeService>(
      address, threads, seconds, 0,
      [&](zerotrain::NodeService::Stub& stub, int t, int64_t i) -> std::optional<grpc::Status> {
        // Thread t heartbeats nodes t, t + threads, ... round robin.
        const int64_t mine = (nodes - t + threads - 1) / threads;
        const int64_t n = t + (i % mine) * threads;
        zerotrain::HeartbeatRequest request;
        request.set_node_id(absl::StrCat("sim-", n));
        zerotrain::HeartbeatResponse response;
        auto context = zt::AuthorizedContext(token);
        grpc::Status status = stub.Heartbeat(context.get(), request, &response);
        if (status.ok() && response.register_again()) {
          return grpc::Status(grpc::StatusCode::INTERNAL, "register_again");
        }
        return status;
      },
      &elapsed);
  const nlohmann::json heartbeat = Summarize(beats, elapsed);

  std::fprintf(stderr, "SubmitJob for %.0f s from %d threads\n", submit_seconds, threads);
  std::vector<int64_t> placed(threads, 0), pending(threads, 0);
  CallStats submits = Drive<zerotrain::JobService>(
      address, threads, submit_seconds, 0,
      [&](zerotrain::JobService::Stub& stub, int t, int64_t i) -> std::optional<grpc::Status> {
        zerotrain::SubmitJobRequest request;
        zerotrain::JobSpec& spec = *request.mutable_spec();
        spec = TinyJob(absl::StrCat("load", t, "x", i), dir + "/train.bin", 100);
        spec.mutable_model()->set_n_layer(12);
        spec.mutable_model()->set_d_model(768);
        spec.mutable_model()->set_n_head(12);
        spec.mutable_model()->set_vocab_size(50257);
        spec.mutable_model()->set_max_seq_len(1024);
        spec.mutable_data()->set_seq_len(1024);
        spec.mutable_parallel()->set_world_size(kDevicesPerNode);
        zerotrain::Job job;
        auto context = zt::AuthorizedContext(token);
        grpc::Status status = stub.SubmitJob(context.get(), request, &job);
        if (status.ok()) ++(job.state() == zerotrain::Job::PLACED ? placed[t] : pending[t]);
        return status;
      },
      &elapsed);
  nlohmann::json submit = Summarize(submits, elapsed);
  int64_t total_placed = 0, total_pending = 0;
  for (int t = 0; t < threads; ++t) {
    total_placed += placed[t];
    total_pending += pending[t];
  }
  submit["placed_on_return"] = total_placed;
  submit["not_placed_on_return"] = total_pending;
  const auto [rss_loaded, hwm_loaded] = Rss(pid);
  (*child)->Stop();

  const nlohmann::json line = {
      {"mode", "throughput"},
      {"nodes", nodes},
      {"devices_per_node", kDevicesPerNode},
      {"client_threads", threads},
      {"register", registration},
      {"heartbeat", heartbeat},
      {"submit", submit},
      {"rss_bytes",
       {{"idle", {{"vm_rss", rss_idle}, {"vm_hwm", hwm_idle}}},
        {"after_registration", {{"vm_rss", rss_registered}, {"vm_hwm", hwm_registered}}},
        {"after_load", {{"vm_rss", rss_loaded}, {"vm_hwm", hwm_loaded}}}}}};
  std::printf("%s\n", line.dump().c_str());
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Mixed job-API load while nodes heartbeat

enum class Call { kSubmit, kList, kGet, kWatch, kCancel, kRetire };
constexpr int kCallKinds = 6;
constexpr const char* kCallNames[kCallKinds] = {
    "SubmitJob", "ListJobs",  "GetJob",
    "WatchJob",  "CancelJob", "Retire (CancelJob, the ranks' exits, DeleteJob)"};

struct MixedStats {
  int64_t failures = 0;
  std::string first_failure;
  std::vector<double> latencies_ms[kCallKinds];
};

std::unique_ptr<grpc::ClientContext> ReadyContext(const std::string& token) {
  auto context = zt::AuthorizedContext(token, std::chrono::seconds(30));
  context->set_wait_for_ready(true);
  return context;
}

// Retires job `id`: cancels it, reports every rank of its current attempt as stopped, as the
// simulated node it was placed on would, and deletes it once it is CANCELLED.
grpc::Status RetireJob(zerotrain::JobService::Stub& jobs, zerotrain::NodeService::Stub& nodes,
                       const std::string& token, const std::string& id) {
  zerotrain::CancelJobRequest cancel;
  cancel.set_job_id(id);
  zerotrain::Job job;
  grpc::Status status = jobs.CancelJob(ReadyContext(token).get(), cancel, &job);
  if (!status.ok()) return status;
  if (job.attempts_size() > 0) {
    const zerotrain::Attempt& attempt = job.attempts(job.attempts_size() - 1);
    for (const zerotrain::RankPlacement& p : attempt.placement()) {
      zerotrain::RankReport report;
      report.set_node_id(p.node_id());
      report.set_job_id(id);
      report.set_attempt(attempt.number());
      report.set_rank(p.rank());
      report.mutable_exit()->set_outcome(zerotrain::RankExit::STOPPED);
      zerotrain::RankReportResponse response;
      status = nodes.ReportRank(ReadyContext(token).get(), report, &response);
      if (!status.ok()) return status;
    }
  }
  zerotrain::DeleteJobRequest request;
  request.set_job_id(id);
  zerotrain::DeleteJobResponse response;
  return jobs.DeleteJob(ReadyContext(token).get(), request, &response);
}

// One client thread's loop until `end`. `live_jobs` > 0: at most that many jobs of its own
// at a time (the oldest is retired instead of a submit).
void MixedClient(const std::string& address, const std::string& token, const std::string& dir,
                 int t, int submit_percent, int live_jobs, Clock::time_point end, MixedStats* stats,
                 std::atomic<int64_t>* submitted, std::atomic<int64_t>* retired) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // its own connection, as a process has
  const std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  auto jobs = zerotrain::JobService::NewStub(channel);
  auto nodes = zerotrain::NodeService::NewStub(channel);
  std::mt19937 rng(static_cast<unsigned>(t) * 7919u + 1);
  std::vector<std::string> mine;
  for (int64_t i = 0; Clock::now() < end; ++i) {
    const int roll = static_cast<int>(rng() % 100);
    Call call = Call::kSubmit;
    if (!mine.empty() && roll >= submit_percent) {
      const int rest = (roll - submit_percent) * 100 / std::max(1, 100 - submit_percent);
      call = rest < 35   ? Call::kList
             : rest < 75 ? Call::kGet
             : rest < 90 ? Call::kWatch
                         : Call::kCancel;
    }
    if (call == Call::kSubmit && live_jobs > 0 && static_cast<int>(mine.size()) >= live_jobs) {
      call = Call::kRetire;
    }
    const std::string some = mine.empty() ? "" : mine[rng() % mine.size()];
    const auto before = Clock::now();
    grpc::Status status;
    switch (call) {
      case Call::kSubmit: {
        zerotrain::SubmitJobRequest request;
        *request.mutable_spec() = TinyJob(absl::StrCat("mix", t, "x", i), dir + "/train.bin", 100);
        zerotrain::Job job;
        status = jobs->SubmitJob(ReadyContext(token).get(), request, &job);
        if (status.ok()) {
          mine.push_back(job.id());
          submitted->fetch_add(1);
        }
        break;
      }
      case Call::kList: {
        zerotrain::ListJobsRequest request;
        request.set_page_size(20);
        zerotrain::ListJobsResponse response;
        status = jobs->ListJobs(ReadyContext(token).get(), request, &response);
        break;
      }
      case Call::kGet: {
        zerotrain::GetJobRequest request;
        request.set_job_id(some);
        zerotrain::Job job;
        status = jobs->GetJob(ReadyContext(token).get(), request, &job);
        break;
      }
      case Call::kWatch: {
        zerotrain::WatchJobRequest request;
        request.set_job_id(some);
        auto context = ReadyContext(token);
        auto reader = jobs->WatchJob(context.get(), request);
        zerotrain::JobEvent event;
        const bool got = reader->Read(&event);
        context->TryCancel();
        while (reader->Read(&event)) {
        }
        status = reader->Finish();
        if (got) status = grpc::Status::OK;  // the cancel is ours
        break;
      }
      case Call::kCancel: {
        zerotrain::CancelJobRequest request;
        request.set_job_id(some);
        zerotrain::Job job;
        status = jobs->CancelJob(ReadyContext(token).get(), request, &job);
        break;
      }
      case Call::kRetire: {
        status = RetireJob(*jobs, *nodes, token, mine.front());
        mine.erase(mine.begin());
        retired->fetch_add(1);
        break;
      }
    }
    stats->latencies_ms[static_cast<int>(call)].push_back(MsSince(before));
    if (!status.ok() && stats->failures++ == 0) {
      stats->first_failure = absl::StrCat(kCallNames[static_cast<int>(call)], ": ",
                                          status.error_code(), " ", status.error_message());
    }
  }
}

nlohmann::json LatencySummary(std::vector<double>& v, double seconds) {
  return {{"calls", v.size()},
          {"calls_per_s", static_cast<double>(v.size()) / seconds},
          {"p50_ms", Quantile(v, 0.5)},
          {"p99_ms", Quantile(v, 0.99)},
          {"max_ms", v.empty() ? 0 : v.back()}};
}

int RunMixed(const std::string& ztd, const std::string& dir, int nodes,
             const std::vector<int>& client_counts, double seconds, int submit_percent,
             int live_jobs, int heartbeat_ms, double rss_interval) {
  std::optional<CoordinatorChild> started =
      StartCoordinatorChild(ztd, dir, std::max(heartbeat_ms, 10));
  if (!started) return 1;
  const std::string address = started->address, token = started->token;
  std::unique_ptr<Child>* child = &started->child;
  const pid_t pid = (*child)->pid();
  const auto start = Clock::now();

  // The simulated nodes: registered once, then a heartbeat each per interval.
  std::atomic<bool> stop{false};
  std::atomic<int64_t> heartbeats{0}, node_failures{0};
  std::vector<std::thread> node_threads;
  constexpr int kNodeThreads = 4;
  for (int k = 0; k < kNodeThreads; ++k) {
    node_threads.emplace_back([&, k] {
      auto channel = zt::ConnectControlPlane({address});
      if (!channel.ok()) return;
      auto stub = zerotrain::NodeService::NewStub(*channel);
      for (int n = k; n < nodes; n += kNodeThreads) {
        zerotrain::RegisterRequest request;
        *request.mutable_info() = FakeNode(n);
        zerotrain::RegisterResponse response;
        if (!stub->Register(ReadyContext(token).get(), request, &response).ok()) ++node_failures;
      }
      while (!stop.load()) {
        const auto round = Clock::now();
        for (int n = k; n < nodes && !stop.load(); n += kNodeThreads) {
          zerotrain::HeartbeatRequest request;
          request.set_node_id(absl::StrCat("sim-", n));
          zerotrain::HeartbeatResponse response;
          if (stub->Heartbeat(ReadyContext(token).get(), request, &response).ok()) {
            ++heartbeats;
          } else {
            ++node_failures;
          }
        }
        std::this_thread::sleep_until(round + std::chrono::milliseconds(heartbeat_ms));
      }
    });
  }

  // RSS samples with the number of jobs the coordinator keeps.
  std::atomic<int64_t> jobs_submitted{0}, jobs_retired{0};
  nlohmann::json rss_samples = nlohmann::json::array();
  std::mutex rss_mu;
  std::thread sampler([&] {
    while (!stop.load()) {
      {
        std::lock_guard<std::mutex> lock(rss_mu);
        rss_samples.push_back({{"t_s", MsSince(start) / 1e3},
                               {"vm_rss", Rss(pid).first},
                               {"jobs", jobs_submitted.load() - jobs_retired.load()}});
      }
      const auto next = Clock::now() + std::chrono::duration<double>(rss_interval);
      while (!stop.load() && Clock::now() < next) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
  });

  nlohmann::json runs = nlohmann::json::array();
  for (int clients : client_counts) {
    std::fprintf(stderr, "mixed load: %d clients for %.0f s, %d nodes heartbeating\n", clients,
                 seconds, nodes);
    std::vector<MixedStats> stats(clients);
    std::vector<std::thread> threads;
    const auto run_start = Clock::now();
    const Clock::time_point end = run_start + std::chrono::duration_cast<Clock::duration>(
                                                  std::chrono::duration<double>(seconds));
    for (int t = 0; t < clients; ++t) {
      threads.emplace_back(MixedClient, address, token, dir, t, submit_percent, live_jobs, end,
                           &stats[t], &jobs_submitted, &jobs_retired);
    }
    for (std::thread& th : threads) th.join();
    const double elapsed = MsSince(run_start) / 1e3;
    MixedStats all;
    for (MixedStats& s : stats) {
      all.failures += s.failures;
      if (all.first_failure.empty()) all.first_failure = s.first_failure;
      for (int c = 0; c < kCallKinds; ++c) {
        all.latencies_ms[c].insert(all.latencies_ms[c].end(), s.latencies_ms[c].begin(),
                                   s.latencies_ms[c].end());
      }
    }
    std::vector<double> every;
    nlohmann::json by_call;
    for (int c = 0; c < kCallKinds; ++c) {
      if (all.latencies_ms[c].empty()) continue;
      every.insert(every.end(), all.latencies_ms[c].begin(), all.latencies_ms[c].end());
      by_call[kCallNames[c]] = LatencySummary(all.latencies_ms[c], elapsed);
    }
    nlohmann::json run = {{"clients", clients},
                          {"seconds", elapsed},
                          {"all", LatencySummary(every, elapsed)},
                          {"by_call", by_call},
                          {"failures", all.failures}};
    if (!all.first_failure.empty()) run["first_failure"] = all.first_failure;
    runs.push_back(run);
  }
  stop.store(true);
  for (std::thread& th : node_threads) th.join();
  sampler.join();
  (*child)->Stop();
  const nlohmann::json line = {{"mode", "mixed"},
                               {"nodes", nodes},
                               {"heartbeat_ms", heartbeat_ms},
                               {"submit_percent", submit_percent},
                               {"live_jobs", live_jobs},
                               {"jobs_retired", jobs_retired.load()},
                               {"runs", runs},
                               {"heartbeats", heartbeats.load()},
                               {"node_failures", node_failures.load()},
                               {"rss", rss_samples}};
  std::printf("%s\n", line.dump().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode, ztd, zt, dir;
  int jobs = 5, steps = 20, nodes = 1000, threads = 12;
  double seconds = 10, submit_seconds = 5;
  std::vector<int> clients = {64, 256};
  int submit_percent = 10, live_jobs = 0, heartbeat_ms = 1000;
  double rss_interval = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--mode")
      mode = value;
    else if (flag == "--ztd")
      ztd = value;
    else if (flag == "--zt")
      zt = value;
    else if (flag == "--dir")
      dir = value;
    else if (flag == "--jobs")
      jobs = std::atoi(value.c_str());
    else if (flag == "--steps")
      steps = std::atoi(value.c_str());
    else if (flag == "--nodes")
      nodes = std::atoi(value.c_str());
    else if (flag == "--threads")
      threads = std::atoi(value.c_str());
    else if (flag == "--seconds")
      seconds = std::atof(value.c_str());
    else if (flag == "--submit-seconds")
      submit_seconds = std::atof(value.c_str());
    else if (flag == "--clients") {
      clients.clear();
      std::stringstream list(value);
      for (std::string item; std::getline(list, item, ',');)
        clients.push_back(std::atoi(item.c_str()));
    } else if (flag == "--submit-percent")
      submit_percent = std::atoi(value.c_str());
    else if (flag == "--live-jobs")
      live_jobs = std::atoi(value.c_str());
    else if (flag == "--heartbeat-ms")
      heartbeat_ms = std::atoi(value.c_str());
    else if (flag == "--rss-interval")
      rss_interval = std::atof(value.c_str());
    else {
      std::fprintf(stderr, "control_plane_bench: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  const bool clients_ok =
      !clients.empty() && std::all_of(clients.begin(), clients.end(), [](int c) { return c >= 1; });
  if ((mode != "latency" && mode != "throughput" && mode != "mixed") || ztd.empty() ||
      dir.empty() || jobs < 1 || steps < 1 || nodes < 1 || threads < 1 || seconds <= 0 ||
      submit_seconds <= 0 || !clients_ok || submit_percent < 1 || submit_percent > 100 ||
      live_jobs < 0 || heartbeat_ms < 1 || rss_interval <= 0) {
    std::fprintf(stderr,
                 "usage: control_plane_bench --mode latency|throughput|mixed --ztd PATH --dir DIR "
                 "[--zt PATH] [--jobs N>=1] [--steps N>=1] [--nodes N>=1] [--threads N>=1] "
                 "[--seconds S>0] [--submit-seconds S>0] [--clients N,N,...] "
                 "[--submit-percent 1..100] [--live-jobs N>=0] [--heartbeat-ms MS>=1] "
                 "[--rss-interval S>0]\n");
    return 2;
  }
  std::filesystem::create_directories(dir);
  if (mode == "mixed") {
    return RunMixed(ztd, dir, nodes, clients, seconds, submit_percent, live_jobs, heartbeat_ms,
                    rss_interval);
  }
  return mode == "latency" ? RunLatency(ztd, zt, dir, jobs, steps)
                           : RunThroughput(ztd, dir, nodes, threads, seconds, submit_seconds);
}
