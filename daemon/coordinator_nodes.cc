// The coordinator's node side: registration and heartbeats, assignment queues, rank reports,
// attempts (start, failure, cancel drain) and the scheduling pass. See coordinator.h.
#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/coordinator.h"
#include "worker/checkpoint/checkpoint_directory.h"
#include "worker/checkpoint/checkpoint_owner.h"
#include "worker/job/failure_kind.h"
#include "worker/status_macros.h"

namespace zt {
namespace {

using zerotrain::Job;

constexpr char kPreemptedPrefix[] = "preempted: ";

bool AttemptActive(const Job& job) {
  return (job.state() == Job::PLACED || job.state() == Job::RUNNING) && job.attempts_size() > 0 &&
         job.attempts(job.attempts_size() - 1).ended_ms() == 0;
}

// A failed rank's exit by the one classification (worker/job/failure_kind.h) of the code it
// carries; a node that sends none (status_code 0, built before the field) is unclassified.
bool IsPermanent(const zerotrain::RankExit& exit) {
  return ClassifyFailure(static_cast<absl::StatusCode>(exit.status_code())) ==
         FailureKind::kPermanent;
}

// The step `latest` names in `dir` (0 when it names none that exists).
int64_t LatestStep(const std::string& dir) {
  absl::StatusOr<std::string> latest = FindLatest(dir);
  if (!latest.ok()) return 0;
  const size_t dash = latest->rfind("step-");
  int64_t step = 0;
  if (dash != std::string::npos) (void)absl::SimpleAtoi(latest->substr(dash + 5), &step);
  return step;
}

bool HasLatest(const std::string& dir) {
  if (dir.empty()) return false;
  FILE* f = std::fopen(absl::StrCat(dir, "/", kCheckpointLatestName).c_str(), "r");
  if (f == nullptr) return false;
  std::fclose(f);
  return true;
}

// Background-pass failures have no caller to return to; the daemon's stderr is its log.
void LogError(const absl::Status& status, const char* what) {
  if (!status.ok()) std::fprintf(stderr, "coordinator: %s: %s\n", what, status.ToString().c_str());
}

}  // namespace

void Coordinator::Push(NodeRecord& node, zerotrain::Assignment assignment) {
  node.queue.push_back(std::move(assignment));
  assignments_changed_.SignalAll();
}

bool Coordinator::AttemptHoldsDevices(const std::string& job_id, int32_t attempt) const {
  for (const auto& [id, node] : nodes_) {
    for (const auto& [device, held] : node.held) {
      if (held.job_id == job_id && held.attempt == attempt) return true;
    }
  }
  return false;
}

void Coordinator::ReleaseDevice(const std::string& node_id, const std::string& job_id,
                                int32_t attempt, int32_t rank) {
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) return;
  std::erase_if(it->second.held, [&](const auto& entry) {
    return entry.second.job_id == job_id && entry.second.attempt == attempt &&
           entry.second.rank == rank;
  });
  RefreshNodeViews(node_id);
}

void Coordinator::StopAttemptRanks(const JobRecord& record, zerotrain::StopRanks::Reason reason) {
  const Job& job = record.job;
  if (job.attempts_size() == 0) return;
  const int32_t attempt = job.attempts(job.attempts_size() - 1).number();
  for (auto& [id, node] : nodes_) {
    const bool holds = std::any_of(node.held.begin(), node.held.end(), [&](const auto& entry) {
      return entry.second.job_id == job.id() && entry.second.attempt == attempt;
    });
    if (!holds || !node.healthy) continue;
    zerotrain::Assignment assignment;
    zerotrain::StopRanks* stop = assignment.mutable_stop();
    stop->set_job_id(job.id());
    stop->set_attempt(attempt);
    stop->set_reason(reason);
    Push(node, std::move(assignment));
  }
}

absl::Status Coordinator::FailAttempt(JobRecord& record, const std::string& reason,
                                      Failure failure) {
  Job& job = record.job;
  zerotrain::Attempt* attempt = job.mutable_attempts(job.attempts_size() - 1);
  attempt->set_ended_ms(NowMs());
  attempt->set_end_reason(failure == Failure::kPreempted ? absl::StrCat(kPreemptedPrefix, reason)
                                                         : reason);
  record.awaiting_reattach.clear();
  StopAttemptRanks(record, zerotrain::StopRanks::ABORT);
  int failures = 0;
  for (const zerotrain::Attempt& a : job.attempts()) {
    if (a.number() <= record.budget_base || a.ended_ms() == 0) continue;
    if (a.end_reason() == "cancelled" || absl::StartsWith(a.end_reason(), kPreemptedPrefix)) {
      continue;
    }
    ++failures;
  }
  const int32_t max_restarts = job.spec().scheduling().max_restarts();
  const std::string what =
      absl::StrCat("attempt ", attempt->number(), " ",
                   failure == Failure::kPreempted ? "preempted" : "failed", ": ", reason);
  if (failure != Failure::kPreempted) job.set_failure_reason(reason);
  if (failure != Failure::kPermanent) job.clear_failure_code();
  if (failure == Failure::kPermanent || failures > max_restarts) {
    const std::string why =
        failure == Failure::kPermanent
            ? "a permanent error"
            : absl::StrCat(failures - 1, " of ", max_restarts, " restarts used");
    ZT_RETURN_IF_ERROR(AddEvent(record, Job::FAILED, absl::StrCat(what, " (", why, ")")));
    return OnTerminal(record);
  }
  if (metrics_ != nullptr) metrics_->AddRestart(job.id());
  return AddEvent(record, Job::RESTARTING, absl::StrCat(what, "; restarting"));
}

absl::Status Coordinator::FinishCancelIfDrained(JobRecord& record) {
  Job& job = record.job;
  if (IsFinished(job.state()) || job.attempts_size() == 0) return absl::OkStatus();
  const zerotrain::Attempt& attempt = job.attempts(job.attempts_size() - 1);
  if (attempt.end_reason() != "cancelled") return absl::OkStatus();
  if (job.state() != Job::PLACED && job.state() != Job::RUNNING) return absl::OkStatus();
  if (AttemptHoldsDevices(job.id(), attempt.number())) return absl::OkStatus();
  ZT_RETURN_IF_ERROR(AddEvent(record, Job::CANCELLED, "cancelled: every rank stopped"));
  return OnTerminal(record);
}

absl::Status Coordinator::StartAttempt(JobRecord& record, const JobPlacement& placement) {
  Job& job = record.job;
  const std::string& dir = job.spec().checkpoint().dir();
  // Only the job's own checkpoints, unless it was made to take over a directory's
  // (ResumeJob(checkpoint)): a first attempt never resumes from another job's.
  absl::StatusOr<std::optional<CheckpointOwner>> owner = ReadCheckpointOwner(dir);
  const bool own = owner.ok() && owner->has_value() && (*owner)->job_id == job.id();
  const bool resume = HasLatest(dir) && (own || job.takes_over_checkpoints());
  zerotrain::Attempt* attempt = job.add_attempts();
  attempt->set_number(job.attempts_size());
  attempt->set_started_ms(NowMs());
  attempt->set_resumed_from_step(resume ? LatestStep(dir) : 0);
  for (const zerotrain::RankPlacement& p : placement.ranks) *attempt->add_placement() = p;
  record.ranks.clear();
  record.awaiting_reattach.clear();

  std::map<std::string, std::vector<const zerotrain::RankPlacement*>> by_node;
  for (const zerotrain::RankPlacement& p : placement.ranks) {
    by_node[p.node_id()].push_back(&p);
    record.ranks[p.rank()] = RankState{};
    nodes_[p.node_id()].held[p.device()] = HeldDevice{job.id(), attempt->number(), p.rank()};
  }
  for (const auto& [node_id, ranks] : by_node) RefreshNodeViews(node_id);
  std::vector<std::string> where;
  for (const auto& [node_id, ranks] : by_node) {
    zerotrain::Assignment assignment;
    zerotrain::StartRanks* start = assignment.mutable_start();
    start->set_job_id(job.id());
    start->set_attempt(attempt->number());
    *start->mutable_spec() = job.spec();
    std::vector<std::string> devices;
    for (const zerotrain::RankPlacement* p : ranks) {
      *start->add_ranks() = *p;
      devices.push_back(absl::StrCat(p->device()));
    }
    start->set_resume_dir(resume ? dir : "");
    start->set_take_over_checkpoints(job.takes_over_checkpoints());
    start->set_resume_fallback(record.resume_fallback);
    start->set_run_dir(job.run_dir());
    start->set_store_scope(absl::StrCat(job.id(), "/", attempt->number()));
    Push(nodes_[node_id], std::move(assignment));
    where.push_back(absl::StrCat(node_id, ":", absl::StrJoin(devices, ",")));
  }
  std::string message =
      absl::StrCat("attempt ", attempt->number(), " placed on ", absl::StrJoin(where, ", "));
  if (resume) absl::StrAppend(&message, ", resuming from step ", attempt->resumed_from_step());
  return AddEvent(record, Job::PLACED, message);
}

void Coordinator::SchedulePass() {
  if (!StoreWritable()) return;  // placement pauses while the state store cannot write
  std::vector<SchedulerJob> queued;
  for (const std::string& id : job_index_.queued()) queued.push_back(SchedulerJobFor(jobs_.at(id)));
  if (queued.empty()) return;
  // StartAttempt changes free_nodes_ (RefreshNodeViews): schedule first, then start.
  for (const JobPlacement& placement : ScheduleJobs(queued, free_nodes_)) {
    LogError(StartAttempt(jobs_.at(placement.job_id), placement), "placing a job");
  }
}

void Coordinator::RefreshNodeViews(const std::string& node_id) {
  auto record = nodes_.find(node_id);
  if (record == nodes_.end()) return;
  const NodeRecord& node = record->second;
  auto [position, added] = node_view_position_.try_emplace(node_id, all_nodes_.size());
  if (added) {
    all_nodes_.push_back(SchedulerNode{node_id, {}});
    free_nodes_.push_back(SchedulerNode{node_id, {}});
  }
  std::vector<SchedulerDevice>& all = all_nodes_[position->second].devices;
  std::vector<SchedulerDevice>& free = free_nodes_[position->second].devices;
  all.clear();
  free.clear();
  for (const zerotrain::DeviceInfo& d : node.info.devices()) {
    const SchedulerDevice device{d.index(), d.kind(), d.memory_bytes()};
    all.push_back(device);
    if (node.healthy && !node.draining && !node.held.contains(d.index())) free.push_back(device);
  }
  SummarizeCapacity(all_nodes_[position->second]);
  SummarizeCapacity(free_nodes_[position->second]);
}

absl::StatusOr<zerotrain::RegisterResponse> Coordinator::Register(
    const zerotrain::RegisterRequest& request) {
  const zerotrain::NodeInfo& info = request.info();
  if (info.id().empty() || info.id().size() > 256) {
    return absl::InvalidArgumentError("info.id must be 1–256 bytes");
  }
  std::set<int32_t> indices;
  for (int i = 0; i < info.devices_size(); ++i) {
    const zerotrain::DeviceInfo& d = info.devices(i);
    if (!indices.insert(d.index()).second || d.index() < 0 || d.memory_bytes() <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "info.devices[", i, "]: indices must be distinct and ≥ 0, memory_bytes > 0"));
    }
  }
  const int64_t now = NowMs();
  ZT_RETURN_IF_ERROR(store_->PutNode(info, now));
  absl::MutexLock lock(&mu_);
  NodeRecord& node = nodes_[info.id()];
  node.info = info;
  node.registered_ms = now;
  node.last_heartbeat_ms = now;
  node.healthy = true;
  node.draining = false;
  smallest_device_memory_.clear();
  node.running.assign(request.running().begin(), request.running().end());

  std::map<std::string, std::set<int32_t>> running;  // "<job>/<attempt>" -> ranks
  for (const zerotrain::RunningAttempt& r : request.running()) {
    running[absl::StrCat(r.job_id(), "/", r.attempt())].insert(r.ranks().begin(), r.ranks().end());
    auto it = jobs_.find(r.job_id());
    const bool current =
        it != jobs_.end() && it->second.job.attempts_size() > 0 &&
        it->second.job.attempts(it->second.job.attempts_size() - 1).number() == r.attempt() &&
        AttemptActive(it->second.job);
    if (!current) {
      zerotrain::Assignment stop;
      stop.mutable_stop()->set_job_id(r.job_id());
      stop.mutable_stop()->set_attempt(r.attempt());
      stop.mutable_stop()->set_reason(zerotrain::StopRanks::ABORT);
      Push(node, std::move(stop));
    }
  }
  // Devices held here for ranks the node no longer runs (and whose StartRanks it already
  // took) are free again; such ranks of a live attempt are lost, which fails the attempt.
  std::set<std::string> queued_starts;
  for (const zerotrain::Assignment& a : node.queue) {
    if (a.has_start()) {
      queued_starts.insert(absl::StrCat(a.start().job_id(), "/", a.start().attempt()));
    }
  }
  std::map<std::string, std::vector<std::string>> lost;  // job id -> ranks
  for (auto held = node.held.begin(); held != node.held.end();) {
    const std::string key = absl::StrCat(held->second.job_id, "/", held->second.attempt);
    if (queued_starts.contains(key) || running[key].contains(held->second.rank)) {
      ++held;
      continue;
    }
    auto job = jobs_.find(held->second.job_id);
    if (job != jobs_.end() && AttemptActive(job->second.job) &&
        job->second.job.attempts(job->second.job.attempts_size() - 1).number() ==
            held->second.attempt &&
        !job->second.ranks[held->second.rank].exited) {
      lost[held->second.job_id].push_back(absl::StrCat(held->second.rank));
    }
    if (job != jobs_.end()) lost.try_emplace(held->second.job_id);
    held = node.held.erase(held);
  }
  RefreshNodeViews(info.id());
  for (auto& [job_id, record] : jobs_) {
    if (record.awaiting_reattach.empty()) continue;
    const zerotrain::Attempt& attempt = record.job.attempts(record.job.attempts_size() - 1);
    for (const zerotrain::RankPlacement& p : attempt.placement()) {
      if (p.node_id() == info.id()) record.awaiting_reattach.erase(p.rank());
    }
  }
  for (const auto& [job_id, ranks] : lost) {
    JobRecord& record = jobs_.at(job_id);
    if (!ranks.empty() && AttemptActive(record.job)) {
      ZT_RETURN_IF_ERROR(
          FailAttempt(record,
                      absl::StrCat("node ", info.id(), " registered again without rank(s) ",
                                   absl::StrJoin(ranks, ", ")),
                      Failure::kRetryable));
    }
    ZT_RETURN_IF_ERROR(FinishCancelIfDrained(record));
  }
  SchedulePass();
  UpdateNodeMetrics(info.id());
  zerotrain::RegisterResponse response;
  response.set_heartbeat_interval_ms(absl::ToInt64Milliseconds(options_.heartbeat_interval));
  return response;
}

absl::StatusOr<zerotrain::HeartbeatResponse> Coordinator::Heartbeat(
    const zerotrain::HeartbeatRequest& request) {
  absl::MutexLock lock(&mu_);
  zerotrain::HeartbeatResponse response;
  auto it = nodes_.find(request.node_id());
  if (it == nodes_.end() || !it->second.healthy) {
    response.set_register_again(true);
    return response;
  }
  it->second.last_heartbeat_ms = NowMs();
  it->second.running.assign(request.running().begin(), request.running().end());
  return response;
}

absl::StatusOr<std::optional<zerotrain::Assignment>> Coordinator::NextAssignment(
    const std::string& node_id, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  while (true) {
    if (shutdown_) return absl::UnavailableError("the coordinator is shutting down");
    auto it = nodes_.find(node_id);
    if (it == nodes_.end()) {
      return absl::NotFoundError(absl::StrCat("node '", node_id, "' never registered"));
    }
    if (!it->second.queue.empty()) {
      zerotrain::Assignment next = std::move(it->second.queue.front());
      it->second.queue.pop_front();
      return std::optional<zerotrain::Assignment>(std::move(next));
    }
    if (absl::Now() >= deadline) return std::optional<zerotrain::Assignment>();
    assignments_changed_.WaitWithDeadline(&mu_, deadline);
  }
}

void Coordinator::ReturnAssignment(const std::string& node_id, zerotrain::Assignment assignment) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) return;
  it->second.queue.push_front(std::move(assignment));
  assignments_changed_.SignalAll();
}

absl::Status Coordinator::HandleExit(JobRecord& record, const zerotrain::RankReport& report) {
  const zerotrain::RankExit& exit = report.exit();
  RankState& rank = record.ranks[report.rank()];
  rank.exited = true;
  const std::string who = absl::StrCat("rank ", report.rank(), " on ", report.node_id());
  if (AttemptActive(record.job)) {
    switch (exit.outcome()) {
      case zerotrain::RankExit::FINISHED: {
        const bool all = std::all_of(record.ranks.begin(), record.ranks.end(),
                                     [](const auto& r) { return r.second.exited; });
        if (!all) return absl::OkStatus();
        zerotrain::Attempt* attempt = record.job.mutable_attempts(record.job.attempts_size() - 1);
        attempt->set_ended_ms(NowMs());
        attempt->set_end_reason("succeeded");
        ZT_RETURN_IF_ERROR(AddEvent(
            record, Job::SUCCEEDED,
            absl::StrCat("succeeded: every rank finished (attempt ", attempt->number(), ")")));
        return OnTerminal(record);
      }
      case zerotrain::RankExit::STOPPED:
        if (exit.preempted()) {
          if (auto node = nodes_.find(report.node_id()); node != nodes_.end()) {
            node->second.draining = true;
            RefreshNodeViews(report.node_id());
          }
          return FailAttempt(record, absl::StrCat(who, " was preempted"), Failure::kPreempted);
        }
        return FailAttempt(record, absl::StrCat(who, " stopped without a request"),
                           Failure::kRetryable);
      default: {
        const bool permanent = IsPermanent(exit);
        if (permanent) record.job.set_failure_code(exit.status_code());
        return FailAttempt(record, absl::StrCat(who, ": ", exit.message()),
                           permanent ? Failure::kPermanent : Failure::kRetryable);
      }
    }
  }
  return FinishCancelIfDrained(record);
}

absl::StatusOr<zerotrain::RankReportResponse> Coordinator::ReportRank(
    const zerotrain::RankReport& report) {
  if (report.kind_case() == zerotrain::RankReport::KIND_NOT_SET) {
    return absl::InvalidArgumentError("kind: set started, progress or exit");
  }
  absl::MutexLock lock(&mu_);
  if (!nodes_.contains(report.node_id())) {
    return absl::NotFoundError(absl::StrCat("node '", report.node_id(), "' never registered"));
  }
  auto it = jobs_.find(report.job_id());
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job '", report.job_id(), "'"));
  JobRecord& record = it->second;
  Job& job = record.job;
  const zerotrain::Attempt* attempt = nullptr;
  for (const zerotrain::Attempt& a : job.attempts()) {
    if (a.number() == report.attempt()) attempt = &a;
  }
  const bool placed_here =
      attempt != nullptr && std::any_of(attempt->placement().begin(), attempt->placement().end(),
                                        [&](const zerotrain::RankPlacement& p) {
                                          return p.rank() == report.rank() &&
                                                 p.node_id() == report.node_id();
                                        });
  if (!placed_here) {
    return absl::InvalidArgumentError(
        absl::StrCat("job '", job.id(), "' attempt ", report.attempt(), " placed no rank ",
                     report.rank(), " on node '", report.node_id(), "'"));
  }
  zerotrain::RankReportResponse response;
  const bool current = attempt->number() == job.attempts(job.attempts_size() - 1).number();
  if (report.has_exit()) {
    ReleaseDevice(report.node_id(), job.id(), report.attempt(), report.rank());
    if (current) ZT_RETURN_IF_ERROR(HandleExit(record, report));
    SchedulePass();
    return response;
  }
  if (!current || !AttemptActive(job)) {
    response.set_stop(true);
    return response;
  }
  if (report.has_started()) {
    record.ranks[report.rank()].started = true;
    const bool all = std::all_of(record.ranks.begin(), record.ranks.end(),
                                 [](const auto& r) { return r.second.started; });
    if (all && job.state() == Job::PLACED) {
      ZT_RETURN_IF_ERROR(
          AddEvent(record, Job::RUNNING,
                   absl::StrCat("running: all ", record.ranks.size(), " ranks started")));
    }
  } else if (report.has_progress() && report.rank() == 0) {
    *job.mutable_progress() = report.progress();
    job.add_recent_loss(report.progress().loss());
    constexpr int kRecentLosses = 64;
    if (job.recent_loss_size() > kRecentLosses) {
      auto* losses = job.mutable_recent_loss();
      losses->erase(losses->begin(), losses->begin() + (losses->size() - kRecentLosses));
    }
    ZT_RETURN_IF_ERROR(AddEvent(
        record, job.state(),
        absl::StrCat("step ", report.progress().step(), "/", report.progress().max_steps()),
        &report.progress()));
  }
  return response;
}

std::vector<zerotrain::Node> Coordinator::ListNodes() const {
  absl::MutexLock lock(&mu_);
  std::vector<zerotrain::Node> out;
  for (const auto& [id, node] : nodes_) {
    zerotrain::Node& n = out.emplace_back();
    *n.mutable_info() = node.info;
    n.set_healthy(node.healthy);
    n.set_registered_ms(node.registered_ms);
    n.set_last_heartbeat_ms(node.last_heartbeat_ms);
    for (const zerotrain::RunningAttempt& r : node.running) *n.add_running() = r;
    for (const zerotrain::DeviceInfo& d : node.info.devices()) {
      if (!node.held.contains(d.index())) n.add_free_devices(d.index());
    }
  }
  return out;
}

absl::Status Coordinator::DeclareNodeDead(NodeRecord& node, const std::string& reason) {
  node.healthy = false;
  smallest_device_memory_.clear();
  node.queue.clear();
  std::set<std::string> affected;
  for (const auto& [device, held] : node.held) affected.insert(held.job_id);
  node.held.clear();
  absl::Status first;
  for (const std::string& job_id : affected) {
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) continue;
    JobRecord& record = it->second;
    absl::Status status = AttemptActive(record.job)
                              ? FailAttempt(record, reason, Failure::kRetryable)
                              : FinishCancelIfDrained(record);
    first.Update(status);
  }
  return first;
}

absl::Status Coordinator::ReattachDeadlinePassed() {
  absl::Status first;
  for (auto& [job_id, record] : jobs_) {
    if (record.awaiting_reattach.empty()) continue;
    const zerotrain::Attempt& attempt = record.job.attempts(record.job.attempts_size() - 1);
    std::set<std::string> missing_nodes;
    for (const zerotrain::RankPlacement& p : attempt.placement()) {
      if (!record.awaiting_reattach.contains(p.rank())) continue;
      missing_nodes.insert(p.node_id());
      ReleaseDevice(p.node_id(), job_id, attempt.number(), p.rank());
    }
    record.awaiting_reattach.clear();
    const std::string reason = absl::StrCat("node(s) ", absl::StrJoin(missing_nodes, ", "),
                                            " did not report the attempt's ranks in time after the "
                                            "coordinator's restart");
    first.Update(AttemptActive(record.job) ? FailAttempt(record, reason, Failure::kRetryable)
                                           : FinishCancelIfDrained(record));
  }
  return first;
}

void Coordinator::Tick() {
  absl::MutexLock lock(&mu_);
  const int64_t now = NowMs();
  const int64_t limit = 3 * absl::ToInt64Milliseconds(options_.heartbeat_interval);
  for (auto& [id, node] : nodes_) {
    if (node.healthy && now - node.last_heartbeat_ms > limit) {
      LogError(DeclareNodeDead(node, absl::StrCat("node ", id, " missed 3 heartbeats")),
               "declaring a node dead");
      RefreshNodeViews(id);
    }
  }
  const int64_t reattach_limit =
      std::max(4 * absl::ToInt64Milliseconds(options_.heartbeat_interval),
               absl::ToInt64Milliseconds(options_.reattach_grace));
  if (reattach_pending_ && now - started_ms_ > reattach_limit) {
    reattach_pending_ = false;
    LogError(ReattachDeadlinePassed(), "ending attempts that did not reattach");
  }
  SchedulePass();
  UpdateMetrics();
}

}  // namespace zt
