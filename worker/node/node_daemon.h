// The node role of `ztd` (`ztd --node`): this machine's devices, offered to a coordinator, and
// the ranks it places here, each a thread running a Trainer.
//
// Start() registers the node (its NodeInfo from worker/node/device_inventory.h and what it is
// running), then runs two threads:
//   heartbeat    every RegisterResponse.heartbeat_interval_ms, reporting the running attempts;
//                registers again when the coordinator answers register_again or after
//                `unavailable_streak` heartbeats in a row failed (the coordinator restarted:
//                registering reports the running attempts, so it reattaches them);
//   assignments  the Assignments stream; when it breaks, the node registers again and reopens
//                it after `reconnect_backoff`.
// StartRanks: every path of the job must resolve under `allowed_roots`
// (worker/job/allowed_roots.h), else each of this node's ranks exits FAILED with
// "PERMISSION_DENIED: <field> <path> is outside the allowed roots (...)". Then one thread per
// local rank, all sharing one RemoteStore over the attempt's store_scope and one StopRequest:
// Trainer::Create → ReportRank{started: the plan's and the arenas' bytes by category} → Run,
// rank 0 reporting Progress after every step → ReportRank{exit}: FINISHED, STOPPED (the ranks
// stopped on request) or FAILED with the status as text ("<CODE>: <message>", so the
// coordinator can tell a permanent error from a transient one), checkpoint_step = the step
// `latest` names in checkpoint.dir when the rank exits (0 without one; rank 0 moves `latest`
// after the other ranks wrote their files, so a rank whose rank 0 runs on another node may
// report the save before its last: the coordinator takes rank 0's). Started and exit reports are
// retried through a coordinator restart (worker/node/rpc_retry.h); progress is sent once, with a
// short deadline, so a slow coordinator never stalls training. Stopping: a ReportRank answered
// stop=true, StopRanks CANCEL or StopRanks ABORT ask the attempt's ranks to stop after their
// current step (StopKind::kStop; a rank blocked in a collective whose peer died fails on its own
// with the communicator's timeout). A rank's compute threads: spec.resources.cpu_threads when set,
// else the node's cores divided by its CPU devices.
//
// Thread-safe. The destructor calls Shutdown().
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "prometheus/registry.h"
#include "proto/control.grpc.pb.h"
#include "worker/job/allowed_roots.h"
#include "worker/node/control_channel.h"
#include "worker/node/device_inventory.h"
#include "worker/node/node_metrics.h"
#include "worker/node/rpc_retry.h"
#include "worker/offload/node_swap_store.h"

namespace zt {

struct NodeDaemonOptions {
  // The coordinator's address and TLS files.
  ControlChannelOptions coordinator;
  // The bearer token (worker/node/control_channel.h ResolveToken).
  std::string token;
  // Node id, CPU devices, device memory, NVMe path, metrics address.
  InventoryOptions inventory;
  // Directories the jobs' paths must resolve under; empty: no restriction.
  std::vector<std::string> allowed_roots;
  // A rank's run directory when StartRanks gives none: <run_root>/<job id>. Empty: the ranks
  // write no metrics.jsonl or memory reports in that case.
  std::string run_root;
  // Where the ranks' series go (not owned; outlives the daemon). Null: no metrics.
  prometheus::Registry* registry = nullptr;
  // Retries of registration, started/exit reports and the rendezvous store.
  RetryPolicy retry;
  // Heartbeats failing in a row before the node registers again.
  int unavailable_streak = 3;
  // Pause before reopening a broken assignment stream.
  absl::Duration reconnect_backoff = absl::Milliseconds(500);
  // Deadline of a progress report.
  absl::Duration progress_timeout = absl::Seconds(2);
};

class NodeDaemon {
 public:
  // Detects the devices and resolves the allowed roots; contacts nobody yet. InvalidArgument
  // or NotFound naming the option that is wrong.
  static absl::StatusOr<std::unique_ptr<NodeDaemon>> Create(NodeDaemonOptions options);
  ~NodeDaemon();

  // Registers (retrying while the coordinator is unreachable, up to retry.retry_for) and starts
  // the heartbeat and assignment threads. The coordinator's error (UNAUTHENTICATED for a wrong
  // token) or UNAVAILABLE naming it.
  absl::Status Start();

  // The emergency stop of a preempted node (SIGTERM/SIGUSR1 under Slurm): every running
  // attempt checkpoints after its current step and stops; waits for every rank to exit and be
  // reported with preempted=true. Returns whether any rank was running.
  bool Preempt();

  // Stops every rank (StopKind::kStop) and waits for them, then ends the heartbeat and
  // assignment threads. Idempotent.
  void Shutdown();

  const zerotrain::NodeInfo& info() const { return info_; }
  // The attempts whose ranks run now.
  std::vector<zerotrain::RunningAttempt> Running() const;

 private:
  struct Attempt;

  NodeDaemon(NodeDaemonOptions options, zerotrain::NodeInfo info, AllowedRoots roots,
             std::shared_ptr<grpc::Channel> channel);

  // One Register call with the running attempts; sets heartbeat_interval_.
  absl::Status RegisterOnce();
  void HeartbeatLoop();
  void AssignmentLoop();
  void HandleStart(const zerotrain::StartRanks& start);
  void HandleStop(const zerotrain::StopRanks& stop);
  void RunRank(std::shared_ptr<Attempt> attempt, zerotrain::RankPlacement placement);
  // Sends one report; retried through a coordinator restart when `reliable`. Returns the
  // coordinator's stop answer (false when the report failed).
  bool Report(const zerotrain::RankReport& report, bool reliable);
  void ReportExit(const Attempt& attempt, int rank, zerotrain::RankExit exit);
  // Called by each rank thread last: the attempt's last rank removes its metrics and wakes
  // Preempt/Shutdown.
  void RankDone(Attempt& attempt);
  // Joins the threads of attempts whose ranks all exited.
  void ReapFinished();
  // Sleeps up to `d`; false when Shutdown() began.
  bool SleepUnlessStopping(absl::Duration d);

  const NodeDaemonOptions options_;
  const zerotrain::NodeInfo info_;
  const AllowedRoots roots_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<zerotrain::NodeService::Stub> node_stub_;
  std::unique_ptr<NodeMetrics> metrics_;
  // The swap stores of offload.optimizer NVME jobs, one per directory (RocksDB: one process).
  NodeSwapStores swap_stores_;

  mutable std::mutex mu_;
  std::condition_variable changed_;  // an attempt ended, or shutdown began
  // (job id, attempt number) → the attempt; finished ones wait here until reaped.
  std::map<std::pair<std::string, int>, std::shared_ptr<Attempt>> attempts_ ABSL_GUARDED_BY(mu_);
  absl::Duration heartbeat_interval_ ABSL_GUARDED_BY(mu_) = absl::Seconds(5);
  grpc::ClientContext* assignment_context_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  // Shutdown() began: no new attempts, reports get one try.
  std::atomic<bool> draining_{false};
  // The ranks are gone: the heartbeat and assignment threads end.
  std::atomic<bool> stopping_{false};
  std::mutex register_mu_;  // one Register at a time
  std::thread heartbeat_thread_;
  std::thread assignment_thread_;
};

}  // namespace zt
