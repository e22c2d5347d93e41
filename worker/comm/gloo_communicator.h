// GlooCommunicator: the Communicator over Gloo's TCP transport, for host buffers.
//
// Ranks rendezvous through a zt::Store (GlooStoreAdapter) under the key prefix of the
// options, so several communicators (data-parallel group, shard group) share one store.
// Each collective is numbered in issue order; before entering it a rank overwrites
// "<prefix>/progress/<rank>" with its number (point-to-point operations are numbered per
// (sender, receiver) pair, under "<prefix>/p2p/<src>to<dst>/progress/<rank>"), and a
// heartbeat thread bumps "<prefix>/alive/<rank>" every heartbeat interval (a tenth of the
// timeout, clamped to [0.1 s, 1 s]). The store's keys stay bounded however long the job runs.
// When an operation fails, the ranks whose progress is behind it "did not arrive"
// (DeadlineExceeded); otherwise those whose heartbeat stays still for three intervals
// "stopped responding" — killed or hung inside the operation (Unavailable). Both name the
// ranks; Gloo's own message follows in parentheses.
//
// Algorithms and the bytes CommStats reports for them (payload per rank, b = bytes of the
// tensor, n = elements, N = ranks; 16-bit reductions travel as f32, so their b is 4·n):
//   AllReduce      Gloo's ring all-reduce:           sent = received = 2·(N−1)·b / N
//   ReduceScatter  ring over unbound buffers (here):  sent = received = (N−1)·b_out
//   AllGather      Gloo's ring all-gather:           sent = received = (N−1)·b_in
//   Broadcast      Gloo's broadcast, counted one-to-all: root sent (N−1)·b, others received b
//   Send / Recv    one transfer:                      b
//   Barrier        0
// These are the algorithm's nominal volumes (Gloo does not report wire bytes), rounded down.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "worker/comm/communicator.h"
#include "worker/comm/store.h"

namespace gloo {
class Context;
}

namespace zt {

struct GlooCommunicatorOptions {
  int rank = 0;
  int size = 1;
  Store* store = nullptr;  // not owned; must outlive the communicator
  // Namespace of this communicator's keys in the store; unique per communicator in a job.
  std::string prefix = "comm";
  // Address this rank listens on; tests use loopback. `iface` (e.g. "eth0"), when set,
  // selects the interface instead of `hostname`.
  std::string hostname = "127.0.0.1";
  std::string iface;
  // Every rendezvous and operation fails after this long without progress.
  double timeout_seconds = 300;
  // Capacity, in elements, of the two f32 conversion buffers for 16-bit reductions: a 16-bit
  // all-reduce of n elements, or reduce-scatter of an N·n input, needs n (or N·n) at most
  // this. f32 operations need no conversion buffer and have no such limit, nor does a
  // communicator of one rank (its reductions return their input unchanged).
  int64_t max_16bit_elements = int64_t{1} << 20;
  // Where those two buffers live: both null, the communicator allocates them; both set (each
  // max_16bit_elements floats, valid for the communicator's life), it uses them — so the
  // engine can take them from its memory plan.
  float* conversion_buffers[2] = {nullptr, nullptr};
};

class GlooCommunicator : public Communicator {
 public:
  // Connects to every peer (blocks until all ranks of the group called Create, or the
  // timeout: DeadlineExceeded naming the missing store keys). InvalidArgument names the bad
  // option.
  static absl::StatusOr<std::unique_ptr<GlooCommunicator>> Create(
      const GlooCommunicatorOptions& options);
  // Finishes the operation in progress; operations still queued complete with Cancelled.
  ~GlooCommunicator() override;

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }

  absl::StatusOr<CommHandle> AllReduce(Tensor data, ReduceOp op, const std::string& label) override;
  absl::StatusOr<CommHandle> ReduceScatter(Tensor input, Tensor output, ReduceOp op,
                                           const std::string& label) override;
  absl::StatusOr<CommHandle> AllGather(Tensor input, Tensor output,
                                       const std::string& label) override;
  absl::StatusOr<CommHandle> Broadcast(Tensor data, int root, const std::string& label) override;
  absl::StatusOr<CommHandle> Send(Tensor data, int peer, const std::string& label) override;
  absl::StatusOr<CommHandle> Recv(Tensor data, int peer, const std::string& label) override;
  absl::StatusOr<CommHandle> Barrier(const std::string& label) override;

  CommStats stats() const override;

 private:
  struct Op {
    CommKind kind;
    std::string label;
    std::string progress_prefix;    // "<prefix>/progress/" or the pair's
    uint64_t sequence = 0;          // the operation's number in its sequence
    std::vector<int> participants;  // ranks whose progress is checked on failure
    uint32_t tag = 0;
    int64_t bytes_sent = 0;
    int64_t bytes_received = 0;
    std::function<void(const Op&)> body;  // may throw (Gloo reports errors as exceptions)
    std::shared_ptr<CommHandle::State> state;
  };

  explicit GlooCommunicator(const GlooCommunicatorOptions& options);
  CommHandle Enqueue(Op op);
  void WorkerLoop();
  absl::Status Run(const Op& op);
  std::vector<int> MissingRanks(const Op& op) const;
  // Of `ranks`, those whose heartbeat does not move within three intervals.
  std::vector<int> UnresponsiveRanks(const std::vector<int>& ranks) const;
  void HeartbeatLoop();
  Op MakeCollective(CommKind kind, const std::string& label);
  Op MakePointToPoint(CommKind kind, const std::string& label, int src, int dst, uint64_t index);

  // Collective bodies, run on the worker thread.
  void RingReduceScatter(float* work, float* scratch, float* out, int64_t n, uint32_t tag);

  const GlooCommunicatorOptions options_;
  const std::chrono::milliseconds timeout_;
  const absl::Duration heartbeat_interval_;
  std::shared_ptr<gloo::Context> context_;
  std::unique_ptr<GlooStoreAdapter> adapter_;
  // Owned by the worker thread while an operation runs.
  std::vector<float> owned_conversion_[2];  // when the options gave none
  float* convert_ = nullptr;
  float* recv_ = nullptr;

  // Issue-side counters; only the issuing thread touches them.
  uint64_t collective_seq_ = 0;
  std::vector<uint64_t> sends_to_;
  std::vector<uint64_t> recvs_from_;

  mutable std::mutex mu_;
  std::condition_variable queue_cv_;
  std::deque<Op> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);  // set once: the communicator is broken
  CommStats stats_ ABSL_GUARDED_BY(mu_);
  std::thread worker_;
  std::thread heartbeat_;
};

}  // namespace zt
