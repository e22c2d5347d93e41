// The coordinator's job side: construction and recovery, Submit/Get/List/Cancel/Resume/
// Estimate, events and watching. The node side (registration, assignments, rank reports,
// attempts, scheduling) is in coordinator_nodes.cc.
#include "daemon/coordinator.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "worker/checkpoint/checkpoint_owner.h"
#include "worker/job/allowed_roots.h"
#include "worker/job/job_defaults.h"
#include "worker/job/job_loading.h"
#include "worker/plan/sharding_planner.h"
#include "worker/status_macros.h"

namespace zt {
namespace {

using zerotrain::Job;

// The event a ResumeJob(job_id) writes; the attempt count after it is the new budget's base.
constexpr char kResumedPrefix[] = "resumed after attempt ";

// ListJobsResponse.next_page_token: the job number the page after it starts below.
constexpr char kPageTokenPrefix[] = "before-";
constexpr size_t kMaxRequestIdChars = 128;
constexpr size_t kMaxPrunedPerPass = 500;

absl::Status CheckRequestId(const std::string& id) {
  if (id.size() > kMaxRequestIdChars) {
    return absl::InvalidArgumentError(
        absl::StrCat("request_id: ", id.size(), " characters; at most ", kMaxRequestIdChars));
  }
  for (size_t i = 0; i < id.size(); ++i) {
    const char c = id[i];
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') {
      return absl::InvalidArgumentError(absl::StrCat(
          "request_id: may hold only [A-Za-z0-9._-], found byte 0x",
          absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2), " at position ", i));
    }
  }
  return absl::OkStatus();
}

zerotrain::JobSummary SummaryOf(const Job& job) {
  zerotrain::JobSummary summary;
  summary.set_id(job.id());
  summary.set_name(job.spec().name());
  summary.set_state(job.state());
  summary.set_world_size(job.spec().parallel().world_size());
  summary.set_attempts(job.attempts_size());
  if (job.has_progress()) *summary.mutable_progress() = job.progress();
  summary.set_failure_reason(job.failure_reason());
  summary.set_created_ms(job.created_ms());
  summary.set_updated_ms(job.updated_ms());
  return summary;
}

int64_t JobNumber(const std::string& job_id) {
  int64_t n = 0;
  const size_t dash = job_id.rfind('-');
  if (dash != std::string::npos) (void)absl::SimpleAtoi(job_id.substr(dash + 1), &n);
  return n;
}

}  // namespace

bool IsFinished(Job::State state) {
  return state == Job::SUCCEEDED || state == Job::FAILED || state == Job::CANCELLED;
}

int64_t Coordinator::NowMs() const { return absl::ToUnixMillis(absl::Now()); }

Coordinator::Coordinator(CoordinatorOptions options, AllowedRoots roots,
                         std::unique_ptr<StateStore> store, CoordinatorMetrics* metrics)
    : options_(std::move(options)),
      roots_(std::move(roots)),
      store_(std::move(store)),
      rendezvous_(std::make_unique<RendezvousKv>(store_.get())),
      metrics_(metrics),
      started_ms_(absl::ToUnixMillis(absl::Now())),
      plan_cache_(options_.plan_cache_entries) {}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(CoordinatorOptions options,
                                                                 CoordinatorMetrics* metrics) {
  if (options.heartbeat_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("heartbeat_interval must be > 0");
  }
  if (options.default_device_memory <= 0) {
    return absl::InvalidArgumentError("default_device_memory must be > 0");
  }
  if (options.run_root.empty()) options.run_root = absl::StrCat(options.state_dir, "/runs");
  ZT_ASSIGN_OR_RETURN(AllowedRoots roots, AllowedRoots::Create(options.allowed_roots));
  ZT_ASSIGN_OR_RETURN(
      std::unique_ptr<StateStore> store,
      StateStore::Open(options.state_dir,
                       {.env = options.store_env, .min_free_bytes = options.store_min_free_bytes}));
  std::unique_ptr<Coordinator> coordinator(
      new Coordinator(std::move(options), std::move(roots), std::move(store), metrics));
  ZT_RETURN_IF_ERROR(coordinator->Recover());
  coordinator->background_ = std::thread([c = coordinator.get()] { c->BackgroundLoop(); });
  return coordinator;
}

Coordinator::~Coordinator() {
  Shutdown();
  {
    absl::MutexLock lock(&mu_);
    stop_thread_ = true;
    stop_changed_.SignalAll();
  }
  if (background_.joinable()) background_.join();
}

void Coordinator::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
  events_changed_.SignalAll();
  assignments_changed_.SignalAll();
}

absl::Status Coordinator::Recover() {
  ZT_ASSIGN_OR_RETURN(std::vector<zerotrain::Node> nodes, store_->LoadNodes());
  ZT_ASSIGN_OR_RETURN(std::vector<Job> jobs, store_->LoadJobs());
  absl::MutexLock lock(&mu_);
  for (zerotrain::Node& node : nodes) {
    NodeRecord& record = nodes_[node.info().id()];
    record.info = node.info();
    record.registered_ms = node.registered_ms();
  }
  for (Job& job : jobs) {
    JobRecord& record = jobs_[job.id()];
    ZT_ASSIGN_OR_RETURN(record.events, store_->LoadEvents(job.id()));
    record.number = JobNumber(job.id());
    for (const zerotrain::JobEvent& event : record.events) {
      if (!absl::StartsWith(event.message(), kResumedPrefix)) continue;
      const std::string rest = event.message().substr(sizeof(kResumedPrefix) - 1);
      int32_t base = 0;
      (void)absl::SimpleAtoi(rest.substr(0, rest.find_first_not_of("0123456789")), &base);
      record.budget_base = base;
    }
    if (!job.request_id().empty()) request_ids_[job.request_id()] = job.id();
    record.job = std::move(job);
    job_index_.Put(record.job);
    const Job& j = record.job;
    if ((j.state() == Job::PLACED || j.state() == Job::RUNNING) && j.attempts_size() > 0) {
      // The attempt's nodes may still run its ranks: hold their devices until they say.
      const zerotrain::Attempt& attempt = j.attempts(j.attempts_size() - 1);
      for (const zerotrain::RankPlacement& p : attempt.placement()) {
        nodes_[p.node_id()].held[p.device()] = HeldDevice{j.id(), attempt.number(), p.rank()};
        record.ranks[p.rank()].started = j.state() == Job::RUNNING;
        record.awaiting_reattach.insert(p.rank());
      }
      reattach_pending_ = true;
    }
  }
  for (const auto& [id, node] : nodes_) RefreshNodeViews(id);
  smallest_device_memory_.clear();
  UpdateMetrics();
  return absl::OkStatus();
}

void Coordinator::BackgroundLoop() {
  const absl::Duration period = std::min(options_.tick_interval, options_.heartbeat_interval / 4);
  absl::Time next_prune = absl::Now();
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      stop_changed_.WaitWithTimeout(&mu_, period);
      if (stop_thread_) return;
    }
    Tick();
    if (absl::Now() >= next_prune) {
      PruneFinishedJobs();
      next_prune = absl::Now() + options_.prune_interval;
    }
  }
}

absl::Status Coordinator::AddEvent(JobRecord& record, Job::State state, const std::string& message,
                                   const zerotrain::Progress* progress) {
  const bool state_change = state != record.job.state() || progress == nullptr;
  return AddEventWith(state_change ? Durability::kSync : Durability::kWal, record, state, message,
                      progress);
}

absl::Status Coordinator::AddEventWith(Durability durability, JobRecord& record, Job::State state,
                                       const std::string& message,
                                       const zerotrain::Progress* progress) {
  const int64_t now = NowMs();
  zerotrain::JobEvent event;
  event.set_sequence(static_cast<int64_t>(record.events.size()) + 1);
  event.set_time_ms(now);
  event.set_state(state);
  event.set_message(message);
  if (progress != nullptr) *event.mutable_progress() = *progress;
  record.job.set_state(state);
  record.job.set_updated_ms(now);
  job_index_.Put(record.job);
  record.events.push_back(event);
  events_changed_.SignalAll();
  UpdateJobMetrics(record.job.id());
  absl::Status persisted = store_->PutJobWithEvent(record.job, event, durability);
  if (!persisted.ok() && record.unsaved_from == 0) {
    record.unsaved_from = event.sequence();
    unsaved_.insert(record.job.id());
  }
  return persisted;
}

bool Coordinator::StoreWritable() {
  if (!store_->Writable()) return false;
  for (auto it = unsaved_.begin(); it != unsaved_.end();) {
    auto found = jobs_.find(*it);
    if (found != jobs_.end()) {
      JobRecord& record = found->second;
      for (int64_t seq = record.unsaved_from; seq <= static_cast<int64_t>(record.events.size());
           ++seq) {
        absl::Status s =
            store_->PutJobWithEvent(record.job, record.events[seq - 1], Durability::kSync);
        if (!s.ok()) return false;
        record.unsaved_from = seq + 1;
      }
      record.unsaved_from = 0;
    }
    it = unsaved_.erase(it);
  }
  return true;
}

void Coordinator::UpdateMetrics() {
  if (metrics_ == nullptr) return;
  UpdateJobCountMetrics();
  UpdateNodeCountMetrics();
  std::map<std::string, Job::State> states;
  for (const auto& [id, record] : jobs_) states.emplace(id, record.job.state());
  metrics_->SetJobStates(states);
  std::map<std::string, bool> health;
  for (const auto& [id, node] : nodes_) health.emplace(id, node.healthy);
  metrics_->SetNodeHealth(health);
}

void Coordinator::UpdateJobCountMetrics() {
  if (metrics_ == nullptr) return;
  metrics_->SetJobs(job_index_.counts());
  metrics_->SetStore(store_->writable(), store_->write_errors());
}

void Coordinator::UpdateNodeCountMetrics() {
  if (metrics_ == nullptr) return;
  int healthy = 0;
  for (const auto& [id, node] : nodes_) healthy += node.healthy ? 1 : 0;
  metrics_->SetNodes(static_cast<int>(nodes_.size()), healthy);
}

void Coordinator::UpdateJobMetrics(const std::string& job_id) {
  if (metrics_ == nullptr) return;
  UpdateJobCountMetrics();
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    metrics_->RemoveJob(job_id);
  } else {
    metrics_->SetJobState(job_id, it->second.job.state());
  }
}

void Coordinator::UpdateNodeMetrics(const std::string& node_id) {
  if (metrics_ == nullptr) return;
  UpdateNodeCountMetrics();
  auto it = nodes_.find(node_id);
  if (it != nodes_.end()) metrics_->SetNodeHealthy(node_id, it->second.healthy);
}

int64_t Coordinator::SmallestDeviceMemory(zerotrain::ResourceConfig::DeviceKind kind) const {
  auto [cached, computing] = smallest_device_memory_.try_emplace(kind, 0);
  if (computing) {
    for (const auto& [id, node] : nodes_) {
      if (!node.healthy) continue;
      for (const zerotrain::DeviceInfo& d : node.info.devices()) {
        if (d.kind() != kind) continue;
        if (cached->second == 0 || d.memory_bytes() < cached->second) {
          cached->second = d.memory_bytes();
        }
      }
    }
  }
  return cached->second > 0 ? cached->second : options_.default_device_memory;
}

absl::StatusOr<zerotrain::ShardingPlan> Coordinator::PlanFor(const zerotrain::JobSpec& submitted,
                                                             const zerotrain::JobSpec& validated,
                                                             int64_t device_memory_bytes) const {
  // ValidatedJob filled the defaults in; the planner must see the fields the user left unset
  // as unset, so it plans on a copy with them cleared again.
  zerotrain::JobSpec input = validated;
  const bool pinned_stage = submitted.parallel().has_zero_stage();
  const bool pinned_checkpointing = submitted.memory().activation_checkpointing() !=
                                    zerotrain::MemoryConfig::CHECKPOINTING_UNSPECIFIED;
  if (!pinned_stage) input.mutable_parallel()->clear_zero_stage();
  if (!pinned_checkpointing) {
    input.mutable_memory()->set_activation_checkpointing(
        zerotrain::MemoryConfig::CHECKPOINTING_UNSPECIFIED);
  }
  ZT_ASSIGN_OR_RETURN(
      zerotrain::ShardingPlan plan,
      plan_cache_.Plan(input, PlannerOptions{.device_memory_bytes = device_memory_bytes,
                                             .safety_margin = options_.safety_margin}));
  plan.clear_pinned();
  if (pinned_stage) plan.add_pinned("parallel.zero_stage");
  if (pinned_checkpointing) plan.add_pinned("memory.activation_checkpointing");
  return plan;
}

SchedulerJob Coordinator::SchedulerJobFor(const JobRecord& record) const {
  const zerotrain::JobSpec& spec = record.job.spec();
  const zerotrain::ShardingPlan& plan = record.job.plan();
  const double keep = 1.0 - plan.safety_margin();
  return SchedulerJob{
      .id = record.job.id(),
      .priority = spec.scheduling().priority(),
      .order = record.number,
      .world_size = spec.parallel().world_size(),
      .shard_group_size = spec.parallel().shard_group_size(),
      .device_kind = spec.resources().device(),
      .device_memory_bytes = static_cast<int64_t>(
          std::ceil(static_cast<double>(plan.chosen().peak_bytes_per_rank()) / keep)),
  };
}

absl::StatusOr<Job> Coordinator::Submit(const zerotrain::JobSpec& spec,
                                        const std::string& request_id) {
  return SubmitValidated(spec, /*resume_fallback=*/false, request_id);
}

absl::Status Coordinator::CheckCheckpointDirUnused(const std::string& dir) const {
  if (dir.empty()) return absl::OkStatus();
  // Lexical: symlinks are not followed (docs/daemon.md); paths are what the jobs wrote.
  const std::filesystem::path mine = NormalCheckpointDir(dir);
  const std::optional<JobIndex::CheckpointOverlap> overlap = job_index_.FindCheckpointOverlap(mine);
  if (!overlap.has_value()) return absl::OkStatus();
  const JobRecord& theirs = jobs_.at(overlap->job_id);
  using Relation = JobIndex::CheckpointOverlap::Relation;
  const std::string how = overlap->relation == Relation::kSame ? "is the checkpoint.dir"
                          : overlap->relation == Relation::kInside
                              ? "lies inside the checkpoint.dir"
                              : "contains the checkpoint.dir";
  return absl::FailedPreconditionError(absl::StrCat(
      "checkpoint.dir: '", mine.string(), "' ", how, " '", overlap->dir.string(), "' of job ",
      overlap->job_id, " (", theirs.job.spec().name(), "), which is ",
      Job::State_Name(theirs.job.state()),
      "; two jobs never share a checkpoint directory tree: choose another, or wait until ",
      overlap->job_id, " has finished"));
}

absl::Status Coordinator::CheckSpecSize(const zerotrain::JobSpec& spec) const {
  const size_t bytes = spec.ByteSizeLong();
  if (static_cast<int64_t>(bytes) <= options_.max_spec_bytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "spec: ", bytes, " bytes serialized; this coordinator accepts at most ",
      options_.max_spec_bytes, " (--max-spec-bytes). Point data.train at fewer, larger shards"));
}

const Coordinator::JobRecord* Coordinator::JobOfRequest(const std::string& request_id) const {
  if (request_id.empty()) return nullptr;
  auto id = request_ids_.find(request_id);
  if (id == request_ids_.end()) return nullptr;
  auto it = jobs_.find(id->second);
  return it == jobs_.end() ? nullptr : &it->second;
}

absl::StatusOr<Job> Coordinator::SubmitValidated(const zerotrain::JobSpec& spec,
                                                 bool resume_fallback,
                                                 const std::string& request_id,
                                                 bool takes_over_checkpoints) {
  ZT_RETURN_IF_ERROR(CheckRequestId(request_id));
  // A retry of a submit whose reply was lost: the job the first call made, as it is now.
  auto repeated = [&](const JobRecord& made) -> absl::StatusOr<Job> {
    if (made.job.spec().name() != spec.name()) {
      return absl::InvalidArgumentError(
          absl::StrCat("request_id: '", request_id, "' already made job '", made.job.id(),
                       "' of another name; send a new request_id for a new job"));
    }
    return made.job;
  };
  {
    absl::MutexLock lock(&mu_);
    if (const JobRecord* made = JobOfRequest(request_id)) return repeated(*made);
  }
  ZT_RETURN_IF_ERROR(CheckSpecSize(spec));
  ZT_ASSIGN_OR_RETURN(zerotrain::JobSpec validated,
                      ValidatedJob(spec, {.check_paths = false, .check_engine_support = true}));
  ZT_RETURN_IF_ERROR(roots_.CheckJob(validated));
  // A new job has no id yet, so any job's checkpoints there are another job's.
  ZT_RETURN_IF_ERROR(
      CheckCheckpointOwnership(validated.checkpoint().dir(), /*me=*/"", takes_over_checkpoints));
  int64_t device_memory;
  {
    absl::MutexLock lock(&mu_);
    device_memory = SmallestDeviceMemory(validated.resources().device());
  }
  ZT_ASSIGN_OR_RETURN(zerotrain::ShardingPlan plan, PlanFor(spec, validated, device_memory));
  if (!plan.chosen().fits()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("job '", validated.name(), "' fits no sharding on devices of ",
                     FormatBytes(device_memory), ": ", plan.chosen().rejected_because()));
  }
  zerotrain::JobSpec planned = validated;
  if (!spec.parallel().has_zero_stage()) planned.mutable_parallel()->clear_zero_stage();
  if (spec.memory().activation_checkpointing() ==
      zerotrain::MemoryConfig::CHECKPOINTING_UNSPECIFIED) {
    planned.mutable_memory()->set_activation_checkpointing(
        zerotrain::MemoryConfig::CHECKPOINTING_UNSPECIFIED);
  }
  zerotrain::JobSpec effective = WithPlan(planned, plan);
  ApplyJobDefaults(&effective);

  absl::MutexLock lock(&mu_);
  // The same request_id may have been submitted concurrently while this one validated.
  if (const JobRecord* made = JobOfRequest(request_id)) return repeated(*made);
  ZT_RETURN_IF_ERROR(CheckCheckpointDirUnused(validated.checkpoint().dir()));
  JobRecord probe;
  probe.job.set_id(validated.name());
  *probe.job.mutable_spec() = effective;
  *probe.job.mutable_plan() = plan;
  if (!all_nodes_.empty()) {
    if (std::optional<std::string> why = NeverFits(SchedulerJobFor(probe), all_nodes_)) {
      return absl::ResourceExhaustedError(
          absl::StrCat("job '", validated.name(), "' can never be placed: ", *why));
    }
  }
  // Not synced by itself: the PENDING event below is a synced write, and it syncs this too.
  ZT_ASSIGN_OR_RETURN(int64_t number, store_->NextJobNumber(Durability::kWal));
  const std::string id = absl::StrCat(validated.name(), "-", number);
  const int64_t now = NowMs();
  JobRecord& record = jobs_[id];
  record.number = number;
  record.resume_fallback = resume_fallback;
  record.job = std::move(probe.job);
  record.job.set_id(id);
  record.job.set_state(Job::PENDING);
  record.job.set_created_ms(now);
  record.job.set_run_dir(absl::StrCat(options_.run_root, "/", id));
  record.job.set_request_id(request_id);
  record.job.set_takes_over_checkpoints(takes_over_checkpoints);
  // One sync per submission, not two: the PENDING event goes to the log, and placing the job
  // syncs it with its PLACED event; a job that stays queued is synced below. Either way it is
  // durable before the answer, and the lock keeps anyone else from acting on it before.
  auto forget = [&](absl::Status cause) {
    unsaved_.erase(id);
    job_index_.Remove(id);
    jobs_.erase(id);
    UpdateJobMetrics(id);
    return cause;
  };
  absl::Status persisted = AddEventWith(Durability::kWal, record, Job::PENDING, "submitted",
                                        /*progress=*/nullptr);
  if (!persisted.ok()) return forget(persisted);
  SchedulePass();
  if (jobs_.at(id).job.state() == Job::PENDING) {
    if (absl::Status synced = store_->SyncLog(); !synced.ok()) return forget(synced);
  }
  if (!request_id.empty()) request_ids_[request_id] = id;
  return jobs_.at(id).job;
}

absl::StatusOr<Job> Coordinator::GetJob(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  return it->second.job;
}

absl::StatusOr<zerotrain::ListJobsResponse> Coordinator::ListJobs(
    const zerotrain::ListJobsRequest& request) const {
  if (request.page_size() < 0 || request.page_size() > kMaxListPageSize) {
    return absl::InvalidArgumentError(absl::StrCat("page_size: ", request.page_size(),
                                                   " is outside 0..", kMaxListPageSize,
                                                   " (0: ", kDefaultListPageSize, ")"));
  }
  const size_t page_size =
      static_cast<size_t>(request.page_size() == 0 ? kDefaultListPageSize : request.page_size());
  int64_t before = std::numeric_limits<int64_t>::max();
  if (!request.page_token().empty()) {
    if (!absl::StartsWith(request.page_token(), kPageTokenPrefix) ||
        !absl::SimpleAtoi(request.page_token().substr(sizeof(kPageTokenPrefix) - 1), &before)) {
      return absl::InvalidArgumentError(
          absl::StrCat("page_token: '", absl::CHexEscape(request.page_token().substr(0, 64)),
                       "' is not a next_page_token this coordinator sent"));
    }
  }
  absl::MutexLock lock(&mu_);
  std::vector<const JobRecord*> order;
  for (const auto& [id, record] : jobs_) {
    const bool wanted =
        record.number < before &&
        (request.states().empty() || std::find(request.states().begin(), request.states().end(),
                                               record.job.state()) != request.states().end());
    if (wanted) order.push_back(&record);
  }
  std::sort(order.begin(), order.end(),
            [](const JobRecord* a, const JobRecord* b) { return a->number > b->number; });
  zerotrain::ListJobsResponse response;
  for (size_t i = 0; i < order.size() && i < page_size; ++i) {
    *response.add_jobs() = SummaryOf(order[i]->job);
  }
  if (order.size() > page_size) {
    response.set_next_page_token(absl::StrCat(kPageTokenPrefix, order[page_size - 1]->number));
  }
  return response;
}

absl::Status Coordinator::DeleteJob(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  if (!IsFinished(it->second.job.state())) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", job_id, "' is ", Job::State_Name(it->second.job.state()),
                     "; only a SUCCEEDED, FAILED or CANCELLED job can be deleted (cancel it "
                     "first)"));
  }
  if (StillHoldsDevices(it->second)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", job_id, "' is ", Job::State_Name(it->second.job.state()),
        " but its last attempt's ranks have not all exited on their nodes yet; try again when "
        "they have (seconds)"));
  }
  return DeleteJobLocked(job_id);
}

bool Coordinator::StillHoldsDevices(const JobRecord& record) const {
  const Job& job = record.job;
  return job.attempts_size() > 0 &&
         AttemptHoldsDevices(job.id(), job.attempts(job.attempts_size() - 1).number());
}

absl::Status Coordinator::DeleteJobLocked(const std::string& job_id) {
  ZT_RETURN_IF_ERROR(store_->DeleteJob(job_id));
  auto it = jobs_.find(job_id);
  if (const std::string& request_id = it->second.job.request_id(); !request_id.empty()) {
    request_ids_.erase(request_id);
  }
  jobs_.erase(it);
  job_index_.Remove(job_id);
  events_changed_.SignalAll();
  UpdateJobMetrics(job_id);
  return absl::OkStatus();
}

int Coordinator::PruneFinishedJobs() {
  absl::MutexLock lock(&mu_);
  std::vector<const JobRecord*> finished;
  for (const auto& [id, record] : jobs_) {
    // Devices still held: the nodes' exit reports must find the job (the next pass takes it).
    if (IsFinished(record.job.state()) && !StillHoldsDevices(record)) finished.push_back(&record);
  }
  std::sort(finished.begin(), finished.end(),
            [](const JobRecord* a, const JobRecord* b) { return a->number > b->number; });
  const int64_t now = NowMs();
  const int64_t max_age_ms = absl::ToInt64Milliseconds(options_.keep_finished_for);
  std::vector<std::string> doomed;
  // Each deletion is a synced write under the lock: a backlog (a lowered limit, a long
  // downtime) drains over several passes instead of stalling every call for seconds.
  for (size_t i = 0; i < finished.size() && doomed.size() < kMaxPrunedPerPass; ++i) {
    const bool too_many =
        options_.keep_finished_jobs > 0 && static_cast<int64_t>(i) >= options_.keep_finished_jobs;
    const bool too_old = max_age_ms > 0 && now - finished[i]->job.updated_ms() > max_age_ms;
    if (too_many || too_old) doomed.push_back(finished[i]->job.id());
  }
  int deleted = 0;
  for (const std::string& id : doomed) {
    // No caller to return to: the daemon's stderr is its log, and the next pass tries again.
    const absl::Status status = DeleteJobLocked(id);
    if (!status.ok()) {
      std::fprintf(stderr, "coordinator: pruning finished job %s: %s\n", id.c_str(),
                   status.ToString().c_str());
    }
    deleted += status.ok() ? 1 : 0;
  }
  return deleted;
}

absl::StatusOr<Job> Coordinator::Cancel(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  JobRecord& record = it->second;
  Job& job = record.job;
  if (IsFinished(job.state())) return job;
  if (job.state() == Job::PENDING || job.state() == Job::RESTARTING) {
    ZT_RETURN_IF_ERROR(AddEvent(record, Job::CANCELLED, "cancelled"));
    ZT_RETURN_IF_ERROR(OnTerminal(record));
    return job;
  }
  zerotrain::Attempt* attempt = job.mutable_attempts(job.attempts_size() - 1);
  if (attempt->ended_ms() == 0) {
    attempt->set_ended_ms(NowMs());
    attempt->set_end_reason("cancelled");
    StopAttemptRanks(record, zerotrain::StopRanks::CANCEL);
    ZT_RETURN_IF_ERROR(AddEvent(
        record, job.state(),
        absl::StrCat("cancel requested: stopping attempt ", attempt->number(), "'s ranks")));
  }
  ZT_RETURN_IF_ERROR(FinishCancelIfDrained(record));
  return job;
}

absl::StatusOr<Job> Coordinator::Resume(const zerotrain::ResumeJobRequest& request) {
  if (request.target_case() == zerotrain::ResumeJobRequest::kCheckpoint) {
    std::string dir = request.checkpoint();
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    const size_t slash = dir.rfind('/');
    if (slash != std::string::npos && absl::StartsWith(dir.substr(slash + 1), "step-")) {
      dir = dir.substr(0, std::max<size_t>(slash, 1));
    }
    zerotrain::JobSpec spec = request.spec();
    spec.mutable_checkpoint()->set_dir(dir);
    return SubmitValidated(spec, request.fallback(), /*request_id=*/"",
                           /*takes_over_checkpoints=*/true);
  }
  if (request.target_case() != zerotrain::ResumeJobRequest::kJobId) {
    return absl::InvalidArgumentError("target: set job_id or checkpoint");
  }
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(request.job_id());
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("no job '", request.job_id(), "'"));
  }
  JobRecord& record = it->second;
  if (record.job.state() != Job::FAILED && record.job.state() != Job::CANCELLED) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", request.job_id(), "' is ", Job::State_Name(record.job.state()),
                     "; only FAILED or CANCELLED jobs can be resumed"));
  }
  record.budget_base = record.job.attempts_size();
  record.resume_fallback = request.fallback();
  ZT_RETURN_IF_ERROR(AddEvent(
      record, Job::RESTARTING,
      absl::StrCat(kResumedPrefix, record.budget_base, " on request, with a new budget of ",
                   record.job.spec().scheduling().max_restarts(), " restarts")));
  SchedulePass();
  return record.job;
}

absl::StatusOr<zerotrain::ShardingPlan> Coordinator::Estimate(
    const zerotrain::EstimateJobRequest& request) const {
  if (request.device_memory_bytes() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("device_memory_bytes is ",
                                                   request.device_memory_bytes(),
                                                   "; it must be ≥ 0 (0: the registered nodes')"));
  }
  ZT_RETURN_IF_ERROR(CheckSpecSize(request.spec()));
  ZT_ASSIGN_OR_RETURN(
      zerotrain::JobSpec validated,
      ValidatedJob(request.spec(), {.check_paths = false, .check_engine_support = false}));
  int64_t device_memory = request.device_memory_bytes();
  if (device_memory == 0) {
    absl::MutexLock lock(&mu_);
    device_memory = SmallestDeviceMemory(validated.resources().device());
  }
  return PlanFor(request.spec(), validated, device_memory);
}

absl::StatusOr<Coordinator::EventBatch> Coordinator::WaitForEvents(const std::string& job_id,
                                                                   int64_t after_sequence,
                                                                   absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  while (true) {
    if (shutdown_) return absl::UnavailableError("the coordinator is shutting down");
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
    const JobRecord& record = it->second;
    EventBatch batch;
    const int64_t after = std::max<int64_t>(after_sequence, 0);
    for (size_t i = static_cast<size_t>(after); i < record.events.size(); ++i) {
      batch.events.push_back(record.events[i]);
    }
    batch.finished = IsFinished(record.job.state());
    if (!batch.events.empty() || batch.finished || absl::Now() >= deadline) return batch;
    events_changed_.WaitWithDeadline(&mu_, deadline);
  }
}

absl::Status Coordinator::OnTerminal(JobRecord& record) {
  return rendezvous_->DeleteJobScopes(record.job.id());
}

}  // namespace zt
