#include "worker/node/node_daemon.h"

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "kernels/status_macros.h"
#include "worker/checkpoint/checkpoint_directory.h"
#include "worker/job/job_loading.h"
#include "worker/job/offload_validation.h"
#include "worker/node/job_inputs_check.h"
#include "worker/node/remote_store.h"
#include "worker/train/stop_request.h"
#include "worker/train/trainer.h"

namespace zt {
namespace {

std::chrono::milliseconds Millis(absl::Duration d) {
  return std::chrono::milliseconds(std::max<int64_t>(1, absl::ToInt64Milliseconds(d)));
}

// Seconds since the Unix epoch: Prometheus timestamps (`time() - gauge` is an age).
double UnixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Deadline of a registration, a heartbeat, and a started or exit report.
constexpr absl::Duration kCallTimeout = absl::Seconds(10);

// The step of the checkpoint `latest` names in `dir`; 0 when there is none.
int64_t LatestCheckpointStep(const std::string& dir) {
  if (dir.empty()) return 0;
  absl::StatusOr<std::string> latest = FindLatest(dir);
  if (!latest.ok()) return 0;
  const std::string name = std::filesystem::path(*latest).filename().string();
  int64_t step = 0;
  absl::string_view digits = name;
  if (!absl::ConsumePrefix(&digits, "step-") || !absl::SimpleAtoi(digits, &step)) return 0;
  return step;
}

void FillMemory(zerotrain::MemoryByCategory& out, const std::array<int64_t, 8>& bytes) {
  static_assert(kMemoryCategoryCount == 8, "MemoryByCategory has one field per category");
  out.set_parameters(bytes[static_cast<int>(MemoryCategory::kParameters)]);
  out.set_gradients(bytes[static_cast<int>(MemoryCategory::kGradients)]);
  out.set_optimizer(bytes[static_cast<int>(MemoryCategory::kOptimizerState)]);
  out.set_activations(bytes[static_cast<int>(MemoryCategory::kActivations)]);
  out.set_workspace(bytes[static_cast<int>(MemoryCategory::kWorkspace)]);
  out.set_communication(bytes[static_cast<int>(MemoryCategory::kCommunication)]);
  out.set_pinned_host(bytes[static_cast<int>(MemoryCategory::kPinnedHost)]);
  out.set_nvme(bytes[static_cast<int>(MemoryCategory::kNvme)]);
}

}  // namespace

struct NodeDaemon::Attempt {
  zerotrain::StartRanks start;  // spec validated, defaults applied
  std::string run_dir;
  StopRequest stop;
  std::atomic<bool> preempted{false};
  std::unique_ptr<RemoteStore> store;
  // offload.optimizer NVME: the node's swap store, shared by the attempt's ranks (and by any
  // other job on the same offload.nvme_path).
  std::shared_ptr<offload::SwapStore> swap_store;
  // Guarded by the daemon's mu_:
  std::vector<std::thread> threads;
  int remaining = 0;
  int trainers = 0;  // ranks whose trainer has not been destroyed yet
  bool finished = false;
  bool rank0_done = false;  // rank 0 is local and its Run returned
};

absl::StatusOr<std::unique_ptr<NodeDaemon>> NodeDaemon::Create(NodeDaemonOptions options) {
  if (options.token.empty()) return absl::InvalidArgumentError("node: token is empty");
  if (options.unavailable_streak < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "node: unavailable_streak ", options.unavailable_streak, " (must be at least 1)"));
  }
  ZT_ASSIGN_OR_RETURN(zerotrain::NodeInfo info, DetectNodeInfo(options.inventory));
  ZT_ASSIGN_OR_RETURN(AllowedRoots roots, AllowedRoots::Create(options.allowed_roots));
  ZT_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                      ConnectControlPlane(options.coordinator));
  return std::unique_ptr<NodeDaemon>(
      new NodeDaemon(std::move(options), std::move(info), std::move(roots), std::move(channel)));
}

NodeDaemon::NodeDaemon(NodeDaemonOptions options, zerotrain::NodeInfo info, AllowedRoots roots,
                       std::shared_ptr<grpc::Channel> channel)
    : options_(std::move(options)),
      info_(std::move(info)),
      roots_(std::move(roots)),
      channel_(std::move(channel)),
      node_stub_(zerotrain::NodeService::NewStub(channel_)) {
  if (options_.registry != nullptr) metrics_ = std::make_unique<NodeMetrics>(*options_.registry);
}

NodeDaemon::~NodeDaemon() { Shutdown(); }

std::vector<zerotrain::RunningAttempt> NodeDaemon::Running() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<zerotrain::RunningAttempt> running;
  for (const auto& [key, attempt] : attempts_) {
    if (attempt->finished) continue;
    zerotrain::RunningAttempt& r = running.emplace_back();
    r.set_job_id(key.first);
    r.set_attempt(key.second);
    for (const zerotrain::RankPlacement& p : attempt->start.ranks()) r.add_ranks(p.rank());
  }
  return running;
}

absl::Status NodeDaemon::RegisterOnce() {
  std::lock_guard<std::mutex> serial(register_mu_);
  zerotrain::RegisterRequest request;
  *request.mutable_info() = info_;
  for (zerotrain::RunningAttempt& r : Running()) *request.add_running() = std::move(r);
  zerotrain::RegisterResponse response;
  auto context = AuthorizedContext(options_.token, Millis(kCallTimeout));
  ZT_RETURN_IF_ERROR(
      FromGrpc(node_stub_->Register(context.get(), request, &response),
               absl::StrCat("register node ", info_.id(), " with ", options_.coordinator.address)));
  std::lock_guard<std::mutex> lock(mu_);
  heartbeat_interval_ = response.heartbeat_interval_ms() > 0
                            ? absl::Milliseconds(response.heartbeat_interval_ms())
                            : absl::Seconds(5);
  return absl::OkStatus();
}

absl::Status NodeDaemon::Start() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (started_) return absl::FailedPreconditionError("node daemon: Start() called twice");
    started_ = true;
  }
  // RegisterOnce's message names the node and the coordinator already.
  ZT_RETURN_IF_ERROR(CallRetrying(
      options_.retry, "node daemon start", absl::InfiniteFuture(),
      [&] {
        const absl::Status s = RegisterOnce();
        return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
      },
      [&] { return draining_.load(); }));
  heartbeat_thread_ = std::thread([this] { HeartbeatLoop(); });
  assignment_thread_ = std::thread([this] { AssignmentLoop(); });
  return absl::OkStatus();
}

bool NodeDaemon::SleepUnlessStopping(absl::Duration d) {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait_for(lock, Millis(d), [&] { return stopping_.load(); });
  return !stopping_.load();
}

void NodeDaemon::HeartbeatLoop() {
  int failures = 0;
  while (true) {
    absl::Duration interval;
    {
      std::lock_guard<std::mutex> lock(mu_);
      interval = heartbeat_interval_;
    }
    if (!SleepUnlessStopping(interval)) return;
    zerotrain::HeartbeatRequest request;
    request.set_node_id(info_.id());
    for (zerotrain::RunningAttempt& r : Running()) *request.add_running() = std::move(r);
    zerotrain::HeartbeatResponse response;
    auto context = AuthorizedContext(options_.token, Millis(std::max(interval, kCallTimeout)));
    const grpc::Status status = node_stub_->Heartbeat(context.get(), request, &response);
    if (status.ok()) {
      failures = 0;
      if (response.register_again()) {
        if (absl::Status s = RegisterOnce(); !s.ok()) {
          std::fprintf(stderr, "ztd node: %s\n", s.ToString().c_str());
        }
      }
    } else if (++failures >= options_.unavailable_streak) {
      // The coordinator may have restarted without the node's session: announce the running
      // attempts again once it answers.
      if (RegisterOnce().ok()) failures = 0;
    }
  }
}

void NodeDaemon::AssignmentLoop() {
  bool first = true;
  while (!stopping_.load()) {
    if (!first) {
      if (!SleepUnlessStopping(options_.reconnect_backoff)) return;
      // After a break the coordinator may not know this node: the stream is refused until it
      // registered again.
      RegisterOnce().IgnoreError();  // the heartbeat thread reports persistent failures
    }
    first = false;
    ReapFinished();
    auto context = AuthorizedContext(options_.token, std::chrono::milliseconds(0));
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_.load()) return;
      assignment_context_ = context.get();
    }
    zerotrain::AssignmentsRequest request;
    request.set_node_id(info_.id());
    std::unique_ptr<grpc::ClientReader<zerotrain::Assignment>> reader =
        node_stub_->Assignments(context.get(), request);
    zerotrain::Assignment assignment;
    while (reader->Read(&assignment)) {
      if (assignment.has_start()) HandleStart(assignment.start());
      if (assignment.has_stop()) HandleStop(assignment.stop());
    }
    reader->Finish().IgnoreError();  // a broken stream is reopened; nothing else to do with it
    std::lock_guard<std::mutex> lock(mu_);
    assignment_context_ = nullptr;
  }
}

void NodeDaemon::HandleStart(const zerotrain::StartRanks& start) {
  ReapFinished();
  const std::pair<std::string, int> key(start.job_id(), start.attempt());
  {
    std::lock_guard<std::mutex> lock(mu_);
    // The coordinator resends an attempt's StartRanks to a node that reconnects.
    if (attempts_.contains(key)) return;
  }
  auto attempt = std::make_shared<Attempt>();
  attempt->start = start;
  attempt->run_dir = !start.run_dir().empty() ? start.run_dir()
                     : !options_.run_root.empty()
                         ? (std::filesystem::path(options_.run_root) / start.job_id()).string()
                         : "";
  absl::Status ready = [&]() -> absl::Status {
    ZT_RETURN_IF_ERROR(roots_.CheckJob(start.spec()));
    ZT_ASSIGN_OR_RETURN(*attempt->start.mutable_spec(), ValidatedJob(start.spec()));
    // Before the gang starts: a job whose inputs are missing here fails this attempt with a
    // permanent code (worker/job/failure_kind.h), so the coordinator does not restart it.
    ZT_RETURN_IF_ERROR(CheckJobInputsOnNode(attempt->start.spec(), roots_));
    ZT_ASSIGN_OR_RETURN(attempt->store,
                        RemoteStore::Create(channel_, {.coordinator = options_.coordinator.address,
                                                       .token = options_.token,
                                                       .scope = start.store_scope(),
                                                       .retry = options_.retry}));
    if (UsesNvme(attempt->start.spec().offload())) {
      std::vector<int> ranks;
      for (const zerotrain::RankPlacement& p : start.ranks()) ranks.push_back(p.rank());
      ZT_ASSIGN_OR_RETURN(attempt->swap_store, swap_stores_.Acquire(attempt->start.spec(), ranks));
    }
    return absl::OkStatus();
  }();
  if (!ready.ok()) {
    for (const zerotrain::RankPlacement& p : start.ranks()) {
      zerotrain::RankExit exit;
      exit.set_outcome(zerotrain::RankExit::FAILED);
      exit.set_message(ready.ToString());
      exit.set_status_code(static_cast<int32_t>(ready.code()));
      exit.set_checkpoint_step(LatestCheckpointStep(start.spec().checkpoint().dir()));
      ReportExit(*attempt, p.rank(), std::move(exit));
    }
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (draining_.load()) return;
  attempts_[key] = attempt;
  attempt->remaining = start.ranks_size();
  attempt->trainers = start.ranks_size();
  for (const zerotrain::RankPlacement& p : start.ranks()) {
    attempt->threads.emplace_back([this, attempt, p] { RunRank(attempt, p); });
  }
  if (attempt->remaining == 0) attempt->finished = true;
}

void NodeDaemon::HandleStop(const zerotrain::StopRanks& stop) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = attempts_.find({stop.job_id(), stop.attempt()});
  if (it == attempts_.end()) return;
  // ABORT as well: ranks that can still agree stop together; one blocked in a collective with
  // a dead peer fails on its communicator's timeout.
  it->second->stop.Request(StopKind::kStop);
}

bool NodeDaemon::Report(const zerotrain::RankReport& report, bool reliable) {
  zerotrain::RankReportResponse response;
  const std::string what = absl::StrCat("report rank ", report.rank(), " of ", report.job_id(),
                                        " attempt ", report.attempt());
  absl::Status status;
  if (reliable) {
    status = CallRetrying(
        options_.retry, what, absl::InfiniteFuture(),
        [&] {
          auto context = AuthorizedContext(options_.token, Millis(kCallTimeout));
          return node_stub_->ReportRank(context.get(), report, &response);
        },
        [&] { return draining_.load(); });
  } else {
    auto context = AuthorizedContext(options_.token, Millis(options_.progress_timeout));
    status = FromGrpc(node_stub_->ReportRank(context.get(), report, &response), what);
  }
  if (!status.ok()) {
    // Progress is superseded by the next step's; a lost exit shows on the coordinator as the
    // node's running attempts no longer listing the rank.
    if (reliable) std::fprintf(stderr, "ztd node: %s\n", status.ToString().c_str());
    return false;
  }
  return response.stop();
}

void NodeDaemon::ReportExit(const Attempt& attempt, int rank, zerotrain::RankExit exit) {
  zerotrain::RankReport report;
  report.set_node_id(info_.id());
  report.set_job_id(attempt.start.job_id());
  report.set_attempt(attempt.start.attempt());
  report.set_rank(rank);
  exit.set_preempted(attempt.preempted.load());
  *report.mutable_exit() = std::move(exit);
  Report(report, /*reliable=*/true);
}

void NodeDaemon::RunRank(std::shared_ptr<Attempt> attempt, zerotrain::RankPlacement placement) {
  const zerotrain::StartRanks& start = attempt->start;
  const int rank = placement.rank();
  zerotrain::RankReport base;
  base.set_node_id(info_.id());
  base.set_job_id(start.job_id());
  base.set_attempt(start.attempt());
  base.set_rank(rank);
  const RankSeriesKey series{
      .job = start.job_id(), .rank = rank, .node = info_.id(), .device = placement.device()};
  double device_peak = 0;
  for (const zerotrain::DeviceInfo& d : info_.devices()) {
    if (d.index() == placement.device()) device_peak = d.peak_flops();
  }
  bool stopped_early = false;
  const absl::Status status = [&]() -> absl::Status {
    zerotrain::JobSpec spec = start.spec();
    if (spec.resources().cpu_threads() == 0) {
      spec.mutable_resources()->set_cpu_threads(
          std::max(1, info_.cpu_cores() / std::max(1, info_.devices_size())));
    }
    TrainOptions options;
    options.run_dir = attempt->run_dir;
    options.rank = rank;
    if (spec.resources().device() == zerotrain::ResourceConfig::CUDA) {
      options.cuda_device = placement.device();  // the node's CUDA devices are indexed by ordinal
    }
    options.store = attempt->store.get();
    options.swap_store = attempt->swap_store.get();
    options.resume_dir = start.resume_dir();
    options.resume_fallback = start.resume_fallback();
    // The directory belongs to this job; only a ResumeJob(checkpoint) job takes another's.
    options.checkpoint_owner = start.job_id();
    options.take_over_checkpoints = start.take_over_checkpoints();
    options.stop = &attempt->stop;
    ZT_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer, Trainer::Create(spec, options));

    std::array<int64_t, 8> planned{}, measured{};
    for (int c = 0; c < kMemoryCategoryCount; ++c) {
      planned[c] = trainer->plan().CategoryBytes(static_cast<MemoryCategory>(c));
      measured[c] = trainer->arenas().BytesInUse(static_cast<MemoryCategory>(c));
    }
    zerotrain::RankReport started = base;
    FillMemory(*started.mutable_started()->mutable_planned(), planned);
    FillMemory(*started.mutable_started()->mutable_measured(), measured);
    started.mutable_started()->set_start_step(trainer->step());
    if (metrics_) {
      metrics_->RecordMemory(series, trainer->plan(), trainer->arenas());
      metrics_->RecordStart(series,
                            {.load_seconds = trainer->resume_seconds(),
                             .step = trainer->step(),
                             .checkpoint_interval_steps = spec.checkpoint().interval_steps(),
                             .unix_time = UnixSeconds()});
    }
    if (Report(started, /*reliable=*/true)) attempt->stop.Request(StopKind::kStop);

    const double flops_per_token = ModelFlopsPerToken(spec, trainer->model().layout().total_numel);
    const double job_peak = device_peak * spec.parallel().world_size();
    ZT_RETURN_IF_ERROR(trainer->Run([&](const StepRecord& r) {
      if (metrics_) {
        metrics_->RecordStep(series, r, trainer->comm_stats(), flops_per_token, job_peak,
                             UnixSeconds());
        metrics_->RecordMemory(series, trainer->plan(), trainer->arenas());
      }
      if (rank != 0) return;
      zerotrain::RankReport report = base;
      zerotrain::Progress& p = *report.mutable_progress();
      p.set_step(r.step);
      p.set_max_steps(spec.train().max_steps());
      p.set_loss(r.loss);
      p.set_lr(r.lr);
      p.set_grad_norm(r.grad_norm);
      p.set_tokens_per_s(r.tokens_per_s);
      p.set_step_ms(r.step_ms);
      p.set_val_loss(r.val_loss ? *r.val_loss : std::numeric_limits<double>::quiet_NaN());
      p.set_loss_scale(r.loss_scale);
      p.set_skipped(r.skipped);
      p.set_comm_bytes(r.comm_bytes);
      p.set_comm_s(r.comm_s);
      p.set_memory_bytes(trainer->arenas().TotalBytesInUse());
      for (int c = 0; c < kMemoryCategoryCount; ++c) {
        measured[c] = trainer->arenas().BytesInUse(static_cast<MemoryCategory>(c));
      }
      FillMemory(*p.mutable_memory(), measured);
      FillMemory(*p.mutable_memory_plan(), planned);
      p.set_model_flops_per_s(flops_per_token * r.tokens_per_s);
      p.set_mfu(job_peak > 0 ? flops_per_token * r.tokens_per_s / job_peak : 0.0);
      if (Report(report, /*reliable=*/false)) attempt->stop.Request(StopKind::kStop);
    }));
    stopped_early = trainer->stopped_early();
    return absl::OkStatus();
  }();
  // The trainer is gone (its memory freed, any background save finished) before the
  // coordinator hears the rank exited and may place other work here. Rank 0 commits each
  // checkpoint after the others wrote their files: the others wait for it when it is local, so
  // that every rank's checkpoint_step names the final save. The last trainer hands the swap
  // store back (deleted when no other job on its path holds it) before its rank's exit is
  // reported, so a coordinator that has heard every exit finds the node's disk freed.
  std::shared_ptr<offload::SwapStore> released_swap_store;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (--attempt->trainers == 0) released_swap_store = std::move(attempt->swap_store);
    if (rank == 0) {
      attempt->rank0_done = true;
      changed_.notify_all();
    } else if (status.ok()) {
      bool rank0_local = false;
      for (const zerotrain::RankPlacement& p : start.ranks()) rank0_local |= p.rank() == 0;
      if (rank0_local) changed_.wait(lock, [&] { return attempt->rank0_done; });
    }
  }
  released_swap_store.reset();  // closing (and deleting) it outside the daemon's lock
  zerotrain::RankExit exit;
  if (!status.ok()) {
    exit.set_outcome(zerotrain::RankExit::FAILED);
    exit.set_message(status.ToString());
    exit.set_status_code(static_cast<int32_t>(status.code()));
  } else {
    exit.set_outcome(stopped_early ? zerotrain::RankExit::STOPPED : zerotrain::RankExit::FINISHED);
  }
  exit.set_checkpoint_step(LatestCheckpointStep(start.spec().checkpoint().dir()));
  ReportExit(*attempt, rank, std::move(exit));
  RankDone(*attempt);
}

void NodeDaemon::RankDone(Attempt& attempt) {
  std::lock_guard<std::mutex> lock(mu_);
  if (--attempt.remaining > 0) return;
  attempt.finished = true;
  if (metrics_) metrics_->RemoveJob(attempt.start.job_id());
  changed_.notify_all();
}

void NodeDaemon::ReapFinished() {
  std::vector<std::shared_ptr<Attempt>> finished;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = attempts_.begin(); it != attempts_.end();) {
      if (it->second->finished) {
        finished.push_back(it->second);
        it = attempts_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const std::shared_ptr<Attempt>& attempt : finished) {
    for (std::thread& t : attempt->threads) t.join();
  }
}

bool NodeDaemon::Preempt() {
  std::unique_lock<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<Attempt>> running;
  for (const auto& [key, attempt] : attempts_) {
    if (attempt->finished) continue;
    attempt->preempted.store(true);
    attempt->stop.Request(StopKind::kCheckpointThenStop);
    running.push_back(attempt);
  }
  changed_.wait(lock, [&] {
    for (const auto& attempt : running) {
      if (!attempt->finished) return false;
    }
    return true;
  });
  lock.unlock();
  ReapFinished();
  return !running.empty();
}

void NodeDaemon::Shutdown() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    draining_.store(true);
    for (const auto& [key, attempt] : attempts_) attempt->stop.Request(StopKind::kStop);
    changed_.wait(lock, [&] {
      for (const auto& [key, attempt] : attempts_) {
        if (!attempt->finished) return false;
      }
      return true;
    });
    stopping_.store(true);
    if (assignment_context_ != nullptr) assignment_context_->TryCancel();
    changed_.notify_all();
  }
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
  if (assignment_thread_.joinable()) assignment_thread_.join();
  ReapFinished();
}

}  // namespace zt
