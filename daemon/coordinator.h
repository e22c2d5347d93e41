// The coordinator: the jobs' state machine, the node registry and the assignment queues that
// the control-plane services (daemon/control_services.h) expose. Thread-safe: one mutex
// guards all state; handlers of many RPCs call in at once.
//
// Job states (proto/control.proto, Job.State):
//   PENDING ──place──► PLACED ──every rank started──► RUNNING ──every rank FINISHED──► SUCCEEDED
//   PLACED/RUNNING ──attempt failed──► RESTARTING (requeued) or FAILED (budget spent/permanent)
//   any non-final ──Cancel──► CANCELLED (once the attempt's ranks exited)
//   FAILED/CANCELLED ──ResumeJob──► RESTARTING
// An attempt fails when a rank exits FAILED (or STOPPED without being asked), a node misses 3
// heartbeats, a node re-registers without the attempt's ranks, or a rank exits STOPPED with
// preempted=true (a preemption: requeued without counting against max_restarts). Failures
// whose RankExit.message names PERMISSION_DENIED or INVALID_ARGUMENT (an absl::Status
// rendered by ToString()) are permanent: FAILED at once, a restart would fail the same way.
// When an attempt ends, the other ranks get StopRanks{ABORT} (cancel: {CANCEL}); their
// devices stay held until their nodes report the ranks' exits or are declared dead.
//
// Restart budget: max_restarts counts the failed (not preempted) attempts since the job was
// submitted or last resumed by ResumeJob(job_id), which grants a fresh budget. The resume is
// recorded as an event "resumed after attempt N ...", from which a restarted coordinator
// recovers the budget.
//
// Events: every state change and every progress report of rank 0 is an event. All are
// persisted (state changes synced, progress to the WAL), so a watcher that reconnects with
// after_sequence misses nothing.
//
// Retention: a finished job stays until DeleteJob, or until the retention
// (CoordinatorOptions::keep_finished_*) prunes it; an unfinished job is never removed.
//
// State store faults (a full disk): the store resumes by itself once it can write again
// (daemon/state_store.h). Meanwhile calls that must persist fail with Unavailable, and no job
// is placed: queued jobs stay PENDING or RESTARTING instead of failing, and placement goes on
// once the store writes again (zt_store_writable shows which).
//
// Restart of the coordinator: construction loads every job, event and node from the state
// store. Nodes count as unhealthy until they register again. An attempt that was running
// keeps running when its nodes register again with its ranks (RegisterRequest.running)
// within 3 heartbeat intervals of construction; otherwise it ends as a failure.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/coordinator_metrics.h"
#include "daemon/job_index.h"
#include "daemon/plan_cache.h"
#include "daemon/rendezvous_kv.h"
#include "daemon/scheduler.h"
#include "daemon/state_store.h"
#include "proto/control.pb.h"
#include "worker/job/allowed_roots.h"

namespace zt {

// ListJobsRequest.page_size: 0 means kDefaultListPageSize; at most kMaxListPageSize.
inline constexpr int kDefaultListPageSize = 100;
inline constexpr int kMaxListPageSize = 1000;

// SUCCEEDED, FAILED or CANCELLED: the job has no attempt to come.
bool IsFinished(zerotrain::Job::State state);

struct CoordinatorOptions {
  // Holds the state store (and the token, daemon/auth.h). Must exist.
  std::string state_dir;
  // Every path of a job must resolve under one of these (worker/job/allowed_roots.h); empty: no
  // restriction.
  std::vector<std::string> allowed_roots;
  // Jobs' run_dir is <run_root>/<job id>. Empty: <state_dir>/runs.
  std::string run_root;
  // Nodes heartbeat this often; one silent for 3 intervals is declared dead.
  absl::Duration heartbeat_interval = absl::Seconds(5);
  // After a restart, how long the nodes have to register again with the ranks they still run
  // before those attempts end (at least 4 heartbeat intervals: a node notices the restart
  // after 3 failed heartbeats, then registers).
  absl::Duration reattach_grace = absl::Seconds(10);
  // The device memory jobs are planned for while no healthy node has devices of their kind.
  int64_t default_device_memory = int64_t{16} << 30;
  // The planner's safety margin (fraction of device memory kept free).
  double safety_margin = 0.10;
  // Plans of this many job shapes are kept (daemon/plan_cache.h), so SubmitJob plans a shape
  // once.
  size_t plan_cache_entries = 256;
  // How often the background pass runs (heartbeat deadlines, scheduling); it never runs
  // slower than a quarter of the heartbeat interval.
  absl::Duration tick_interval = absl::Seconds(1);
  // A submitted spec larger than this (serialized) is refused (--max-spec-bytes).
  int64_t max_spec_bytes = int64_t{1} << 20;
  // Retention of finished jobs (SUCCEEDED, FAILED, CANCELLED), applied by PruneFinishedJobs:
  // only the newest keep_finished_jobs of them are kept (0: no count limit), and none that
  // finished more than keep_finished_for ago (zero: no age limit).
  int64_t keep_finished_jobs = 10000;
  absl::Duration keep_finished_for = absl::Hours(30 * 24);
  // How often the background pass applies the retention.
  absl::Duration prune_interval = absl::Minutes(1);
  // The state store's RocksDB environment; null: the real file system (tests inject faults).
  rocksdb::Env* store_env = nullptr;
  // Free bytes the state store keeps on its disk (StateStoreOptions::min_free_bytes).
  int64_t store_min_free_bytes = StateStoreOptions{}.min_free_bytes;
};

class Coordinator {
 public:
  // Opens the state store under options.state_dir and recovers every job and node from it,
  // then starts the background pass. `metrics` may be null; otherwise it outlives this object.
  static absl::StatusOr<std::unique_ptr<Coordinator>> Create(CoordinatorOptions options,
                                                             CoordinatorMetrics* metrics = nullptr);
  // Stops the background pass (Shutdown() first).
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // ---- jobs (JobService)
  // Validates, plans and queues the job (see control.proto SubmitJob). InvalidArgument (every
  // violation, a spec over max_spec_bytes, a malformed request_id or one another job's name
  // used), PermissionDenied (a path outside the allowed roots), ResourceExhausted (the job can
  // never fit the registered nodes, with the numbers; nothing is stored). A request_id that
  // made a job before returns that job.
  absl::StatusOr<zerotrain::Job> Submit(const zerotrain::JobSpec& spec,
                                        const std::string& request_id = "");
  absl::StatusOr<zerotrain::Job> GetJob(const std::string& job_id) const;
  // One page of summaries, newest first (see control.proto ListJobs). InvalidArgument for a
  // page_size outside 0..kMaxListPageSize or a malformed page_token.
  absl::StatusOr<zerotrain::ListJobsResponse> ListJobs(
      const zerotrain::ListJobsRequest& request) const;
  // Removes a finished job, its events and its request_id. NotFound; FailedPrecondition naming
  // the state of a job that has not finished, or of one whose ranks have not all exited yet.
  absl::Status DeleteJob(const std::string& job_id);
  // Applies the retention (CoordinatorOptions::keep_finished_*) now, deleting at most 500 jobs
  // per call; returns how many it deleted. The background pass calls it every prune_interval.
  int PruneFinishedJobs();
  // The job after the request (unchanged when it had finished). NotFound.
  absl::StatusOr<zerotrain::Job> Cancel(const std::string& job_id);
  // job_id: FailedPrecondition unless the job is FAILED or CANCELLED. checkpoint: submits
  // `spec` with checkpoint.dir = the checkpoint directory (a step directory's parent).
  absl::StatusOr<zerotrain::Job> Resume(const zerotrain::ResumeJobRequest& request);
  absl::StatusOr<zerotrain::ShardingPlan> Estimate(
      const zerotrain::EstimateJobRequest& request) const;

  struct EventBatch {
    std::vector<zerotrain::JobEvent> events;
    // The job is SUCCEEDED, FAILED or CANCELLED and `events` ends its history.
    bool finished = false;
  };
  // The job's events with sequence > after_sequence, waiting up to `timeout` for the first
  // when there is none yet. NotFound; Unavailable once Shutdown() was called.
  absl::StatusOr<EventBatch> WaitForEvents(const std::string& job_id, int64_t after_sequence,
                                           absl::Duration timeout) const;

  // ---- nodes (NodeService)
  absl::StatusOr<zerotrain::RegisterResponse> Register(const zerotrain::RegisterRequest& request);
  absl::StatusOr<zerotrain::HeartbeatResponse> Heartbeat(
      const zerotrain::HeartbeatRequest& request);
  // The node's next assignment, waiting up to `timeout` (nullopt: none yet). NotFound for a
  // node that never registered; Unavailable once Shutdown() was called.
  absl::StatusOr<std::optional<zerotrain::Assignment>> NextAssignment(const std::string& node_id,
                                                                      absl::Duration timeout);
  // Puts back an assignment NextAssignment handed out that could not be delivered.
  void ReturnAssignment(const std::string& node_id, zerotrain::Assignment assignment);
  // InvalidArgument for a report without a kind or for a rank the attempt did not place on
  // the node; NotFound for an unknown job or node.
  absl::StatusOr<zerotrain::RankReportResponse> ReportRank(const zerotrain::RankReport& report);
  std::vector<zerotrain::Node> ListNodes() const;

  RendezvousKv& rendezvous() { return *rendezvous_; }

  // The periodic pass: heartbeat deadlines, the reattach deadline after a restart, a
  // scheduling pass. The background thread calls it; tests may call it to avoid waiting.
  void Tick();
  // Ends waits (WaitForEvents, NextAssignment) with Unavailable; idempotent.
  void Shutdown();

 private:
  struct RankState {
    bool started = false;
    bool exited = false;
  };
  struct JobRecord {
    zerotrain::Job job;
    std::vector<zerotrain::JobEvent> events;
    // The n of "<name>-<n>": submission order.
    int64_t number = 0;
    // Attempts before the last ResumeJob(job_id); later failures count against the budget.
    int32_t budget_base = 0;
    bool resume_fallback = false;
    // Ranks of the current attempt.
    std::map<int32_t, RankState> ranks;
    // After a coordinator restart: ranks of the current attempt not yet reported again by
    // their nodes.
    std::set<int32_t> awaiting_reattach;
    // The first event the state store failed to take (0: every event is stored); written
    // again with the job once the store writes (PersistUnsaved).
    int64_t unsaved_from = 0;
  };
  struct HeldDevice {
    std::string job_id;
    int32_t attempt = 0;
    int32_t rank = 0;
  };
  struct NodeRecord {
    zerotrain::NodeInfo info;
    int64_t registered_ms = 0;
    int64_t last_heartbeat_ms = 0;
    // Registered with this process and not declared dead since.
    bool healthy = false;
    // Reported a preemption (its daemon is going away): gets no new ranks until it registers
    // again, so a requeued job is not placed back on the node that is leaving.
    bool draining = false;
    std::vector<zerotrain::RunningAttempt> running;
    std::deque<zerotrain::Assignment> queue;
    std::map<int32_t, HeldDevice> held;  // by device index
  };
  enum class Failure { kRetryable, kPreempted, kPermanent };

  Coordinator(CoordinatorOptions options, AllowedRoots roots, std::unique_ptr<StateStore> store,
              CoordinatorMetrics* metrics);
  absl::Status Recover() ABSL_LOCKS_EXCLUDED(mu_);
  void BackgroundLoop();

  // `takes_over_checkpoints`: ResumeJob(checkpoint), which continues whichever job's
  // checkpoints checkpoint.dir holds; otherwise a directory holding another job's is refused.
  absl::StatusOr<zerotrain::Job> SubmitValidated(const zerotrain::JobSpec& spec,
                                                 bool resume_fallback,
                                                 const std::string& request_id = "",
                                                 bool takes_over_checkpoints = false)
      ABSL_LOCKS_EXCLUDED(mu_);
  // FailedPrecondition naming both directories and the job when `dir` is, contains or lies
  // inside the checkpoint.dir of a job that has not finished: two jobs never write, resume
  // or prune one directory tree at once.
  absl::Status CheckCheckpointDirUnused(const std::string& dir) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // InvalidArgument naming both sizes when `spec` is over max_spec_bytes.
  absl::Status CheckSpecSize(const zerotrain::JobSpec& spec) const;
  // The job a request_id made, if any.
  const JobRecord* JobOfRequest(const std::string& request_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status DeleteJobLocked(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A finished job whose last attempt's ranks some node has not reported exited.
  bool StillHoldsDevices(const JobRecord& record) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The plan for `job` (defaults applied) given what `submitted` pinned.
  absl::StatusOr<zerotrain::ShardingPlan> PlanFor(const zerotrain::JobSpec& submitted,
                                                  const zerotrain::JobSpec& validated,
                                                  int64_t device_memory_bytes) const;
  int64_t SmallestDeviceMemory(zerotrain::ResourceConfig::DeviceKind kind) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  SchedulerJob SchedulerJobFor(const JobRecord& record) const;

  // Appends an event (the job's state becomes `state`) and persists job + event: synced when
  // the state changes or no progress is given, else to the log only.
  absl::Status AddEvent(JobRecord& record, zerotrain::Job::State state, const std::string& message,
                        const zerotrain::Progress* progress = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // AddEvent, persisted with `durability`: kWal only where a synced write or a log sync
  // follows before anyone is answered (SubmitJob).
  absl::Status AddEventWith(Durability durability, JobRecord& record, zerotrain::Job::State state,
                            const std::string& message, const zerotrain::Progress* progress)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Places queued jobs on free devices.
  void SchedulePass() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Brings `node_id`'s entries of all_nodes_ and free_nodes_ up to date with its record. Called
  // after every change to a node's devices, health, draining or held devices.
  void RefreshNodeViews(const std::string& node_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // True when the state store writes and every event it failed to take is written now; false
  // while it cannot write (placement waits for true).
  bool StoreWritable() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status StartAttempt(JobRecord& record, const JobPlacement& placement)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the current attempt; the job goes RESTARTING or FAILED.
  absl::Status FailAttempt(JobRecord& record, const std::string& reason, Failure failure)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pushes StopRanks to every node still holding devices of the current attempt.
  void StopAttemptRanks(const JobRecord& record, zerotrain::StopRanks::Reason reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool AttemptHoldsDevices(const std::string& job_id, int32_t attempt) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseDevice(const std::string& node_id, const std::string& job_id, int32_t attempt,
                     int32_t rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A cancelled attempt whose ranks all exited: CANCELLED.
  absl::Status FinishCancelIfDrained(JobRecord& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status OnTerminal(JobRecord& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status DeclareNodeDead(NodeRecord& node, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ReattachDeadlinePassed() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status HandleExit(JobRecord& record, const zerotrain::RankReport& report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Push(NodeRecord& node, zerotrain::Assignment assignment) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every series from the records: O(jobs + nodes) with a map of each, so only where many
  // may have changed (Recover, Tick); a call that changes one job or one node uses the two
  // below, which keep SubmitJob and Register independent of the number of nodes and jobs
  // beyond one allocation-free count.
  void UpdateMetrics() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job counts by state and `job_id`'s series (dropped when the job is gone).
  void UpdateJobMetrics(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The node counts and `node_id`'s health series.
  void UpdateNodeMetrics(const std::string& node_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // zt_jobs{state} (with the store's series), and zt_nodes_*, from a scan of the records (no
  // allocation per record).
  void UpdateJobCountMetrics() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateNodeCountMetrics() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t NowMs() const;

  const CoordinatorOptions options_;
  const AllowedRoots roots_;
  const std::unique_ptr<StateStore> store_;
  const std::unique_ptr<RendezvousKv> rendezvous_;
  CoordinatorMetrics* const metrics_;
  const int64_t started_ms_;
  // Thread-safe on its own: PlanFor runs outside mu_.
  mutable PlanCache plan_cache_;

  mutable absl::Mutex mu_;
  mutable absl::CondVar events_changed_;
  absl::CondVar assignments_changed_;
  absl::CondVar stop_changed_;
  std::map<std::string, JobRecord> jobs_ ABSL_GUARDED_BY(mu_);
  // Counts by state, the queued jobs and the unfinished jobs' checkpoint directories, kept in
  // step with jobs_ (every state change goes through AddEventWith).
  JobIndex job_index_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, NodeRecord> nodes_ ABSL_GUARDED_BY(mu_);
  // The scheduler's views of nodes_ (daemon/scheduler.h), kept change by change
  // (RefreshNodeViews) instead of rebuilt for every SubmitJob and pass: with 10,000 nodes the
  // rebuilding cost more than placing. One entry per node record at a fixed position
  // (node_view_position_); all_nodes_ lists every device (NeverFits), free_nodes_ the devices a
  // pass may use (none for a node that is unhealthy or draining; not the held ones).
  std::vector<SchedulerNode> all_nodes_ ABSL_GUARDED_BY(mu_);
  std::vector<SchedulerNode> free_nodes_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<std::string, size_t> node_view_position_ ABSL_GUARDED_BY(mu_);
  // SmallestDeviceMemory by kind, computed on first use after a node registered, died or was
  // recovered (those reset it): every SubmitJob asks, and scanning 10,000 nodes for it was
  // the largest part of a SubmitJob's time under the lock.
  mutable std::map<zerotrain::ResourceConfig::DeviceKind, int64_t> smallest_device_memory_
      ABSL_GUARDED_BY(mu_);
  // SubmitJobRequest.request_id → the job it made (Job.request_id, rebuilt by Recover).
  std::map<std::string, std::string> request_ids_ ABSL_GUARDED_BY(mu_);
  // Jobs with events the state store failed to take (JobRecord::unsaved_from).
  std::set<std::string> unsaved_ ABSL_GUARDED_BY(mu_);
  bool reattach_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_thread_ ABSL_GUARDED_BY(mu_) = false;
  std::thread background_;
};

}  // namespace zt
