// NcclCommunicator: the Communicator over NCCL, for buffers in one CUDA device's memory.
//
// Rendezvous: rank 0 creates the ncclUniqueId and sets "<prefix>/nccl_unique_id" (hex) in the
// store; the other ranks wait for that key. The prefix must be unique per communicator in a
// job, as a key is never deleted: a reused prefix hands later ranks a stale id.
//
// Every operation is enqueued on one communication stream, so operations run in issue order
// on the device. The call returns once NCCL has enqueued the work, and the handle completes
// when the device has finished it: a watcher thread polls a CUDA event recorded after the
// operation, and ncclCommGetAsyncError. Ordering against the caller's compute:
//   - NcclCommunicatorOptions.compute_stream set (the trainer's way): each operation starts on
//     the device only once the compute stream has reached the point where the operation was
//     issued (an event recorded there, waited for by the communication stream), so it sees
//     every kernel issued before it, while kernels issued after it run beside it: a prefetch
//     gather or a gradient reduce-scatter overlaps the next unit's compute.
//   - compute_stream unset: the communication stream is not ordered after the caller's
//     compute; make it wait yourself (cudaStreamWaitEvent on stream()), or pass the compute
//     stream as NcclCommunicatorOptions.stream (no overlap).
// Either way, wait on the handle before reading the results or reusing the buffers: the
// compute stream is never made to wait for the communication stream.
//
// Errors: an operation not complete `timeout_seconds` after it could start (issued, and the
// previous operation complete) aborts the communicator (ncclCommAbort) and its handle fails
// with DeadlineExceeded naming the operation and label; an asynchronous NCCL error (a peer
// vanished, a network failure) fails it with Unavailable. Either way the communicator is
// broken: every operation still pending and every later one fails with FailedPrecondition,
// as with GlooCommunicator. Buffers of a failed operation hold unspecified data.
//
// Algorithms and the bytes CommStats reports (payload per rank, nominal ring volumes as in
// gloo_communicator.h; b = bytes of the tensor in its own dtype, since NCCL moves 16-bit data
// as 16-bit; N = ranks):
//   AllReduce      ncclAllReduce:      sent = received = 2·(N−1)·b / N
//   ReduceScatter  ncclReduceScatter:  sent = received = (N−1)·b_out
//   AllGather      ncclAllGather:      sent = received = (N−1)·b_in
//   Broadcast      ncclBroadcast, counted one-to-all: root sent (N−1)·b, others received b
//   Send / Recv    ncclSend / ncclRecv: b
//   Barrier        an all-reduce of one f32 on a device scratch word: 0
// ReduceScatter and AllGather run in place when the output chunk r aliases the input (as
// NCCL defines it). Seconds are the device time between events recorded around each operation
// (including the time spent waiting for peers).
//
// Numerics differ from GlooCommunicator for 16-bit data: NCCL reduces in the data's own type
// hop by hop, so a bf16 sum over N > 2 ranks may round more than once.
//
// Thread-safety: as Communicator; the methods take an internal lock, so the watcher may abort
// the communicator while another thread issues.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/comm/communicator.h"
#include "worker/comm/store.h"

namespace zt {

struct NcclCommunicatorOptions {
  int rank = 0;
  int size = 1;
  int device = 0;          // the CUDA device ordinal this rank uses
  Store* store = nullptr;  // not owned; must outlive Create. May be null when size is 1.
  std::string prefix = "comm";
  // Rendezvous, and each operation once it can start, fail after this long.
  double timeout_seconds = 300;
  // The communication stream, not owned; nullptr: the communicator creates and owns one.
  cudaStream_t stream = nullptr;
  // The stream the rank's kernels run on, not owned; each operation waits (on the device) for
  // the work issued on it before the operation. nullptr: no ordering (see the top).
  cudaStream_t compute_stream = nullptr;
};

class NcclCommunicator : public Communicator {
 public:
  // Rendezvous and ncclCommInitRankConfig (blocks until every rank joined, or the timeout:
  // DeadlineExceeded). FailedPrecondition when no CUDA device is usable, naming
  // cudaGetDeviceCount's error; InvalidArgument naming the bad option.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(
      const NcclCommunicatorOptions& options);
  // Waits for the pending operations (each within the timeout), then finalizes and destroys
  // the NCCL communicator, or aborts it when finalizing times out.
  ~NcclCommunicator() override;

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

  // The stream every operation is enqueued on; see the ordering note at the top.
  cudaStream_t stream() const { return stream_; }

 private:
  struct Op {
    CommKind kind;
    std::string label;
    int64_t bytes_sent = 0;
    int64_t bytes_received = 0;
    // Recorded on the compute stream at issue; the communication stream waits for it. Null
    // without a compute stream.
    cudaEvent_t ready = nullptr;
    cudaEvent_t start = nullptr;
    cudaEvent_t end = nullptr;
    absl::Time issued;
    std::shared_ptr<CommHandle::State> state;

    // Events of a failed operation may still be queued on a wedged stream: they are destroyed
    // (safe while queued) rather than reused. Release() takes the events of one that finished.
    ~Op() {
      if (ready != nullptr) cudaEventDestroy(ready);
      if (start != nullptr) cudaEventDestroy(start);
      if (end != nullptr) cudaEventDestroy(end);
    }
  };
  // Enqueues the NCCL call(s) of one operation on `stream`; returns NCCL's result.
  using Launch = std::function<ncclResult_t(ncclComm_t comm, cudaStream_t stream)>;

  explicit NcclCommunicator(const NcclCommunicatorOptions& options);
  absl::Status Init();
  absl::StatusOr<CommHandle> Issue(CommKind kind, const std::string& label, int64_t bytes_sent,
                                   int64_t bytes_received, const Launch& launch);
  // Polls until NCCL finished enqueuing (a non-blocking communicator returns ncclInProgress).
  ncclResult_t AwaitNccl(ncclResult_t result, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(comm_mu_);
  std::string NcclErrorText(ncclResult_t result) ABSL_EXCLUSIVE_LOCKS_REQUIRED(comm_mu_);
  // Aborts the NCCL communicator and fails every pending operation: `op` (if pending) with
  // `status`, the others with FailedPrecondition. Later operations fail likewise.
  void Break(const Op* op, const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(comm_mu_);
  void WatcherLoop();
  // The events an operation uses: ready (when ordered after compute), start, end.
  std::vector<cudaEvent_t*> OpEvents(Op& op) const;
  bool ordered_after_compute() const {
    return options_.compute_stream != nullptr && options_.compute_stream != stream_;
  }
  void Release(Op& op);
  CommHandle Failed(CommKind kind, const std::string& label, const std::string& cause);

  const NcclCommunicatorOptions options_;
  const absl::Duration timeout_;
  cudaStream_t stream_ = nullptr;
  bool owns_stream_ = false;
  float* barrier_scratch_ = nullptr;  // one f32 on the device

  // Guards every use of the NCCL communicator: issue, error polls, abort, destruction.
  std::mutex comm_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  ncclComm_t comm_ ABSL_GUARDED_BY(comm_mu_) = nullptr;

  mutable std::mutex mu_;
  std::condition_variable pending_cv_;
  std::deque<std::shared_ptr<Op>> pending_ ABSL_GUARDED_BY(mu_);
  std::vector<cudaEvent_t> free_events_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  std::string broken_cause_ ABSL_GUARDED_BY(mu_);
  CommStats stats_ ABSL_GUARDED_BY(mu_);
  std::thread watcher_;
};

}  // namespace zt
