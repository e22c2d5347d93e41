// StagedCommunicator: the Communicator for device buffers over a transport that moves host
// buffers (Gloo): device → host on a copy engine, the host collective, host → device.
//
// Why: NCCL refuses two ranks on one GPU, and the machines at hand have one GPU each, so a
// multi-rank GPU job on one machine (and every multi-rank GPU test) runs its ranks' collectives
// through host memory. NCCL is used when every rank has a GPU of its own.
//
// Staging is bounded: two host regions of `staging_bytes` each (page-locked on CUDA), taken
// once at creation (the memory plan's communication buffers). An operation larger than a
// region runs in chunks that fit: all-reduce, broadcast and point-to-point in contiguous
// pieces; reduce-scatter and all-gather in pieces of each rank's chunk (k elements of every
// one of the N chunks, so N·k fit a region). Every rank chunks the same operation the same
// way, since the chunk size depends only on the group size, the dtype and staging_bytes,
// which every rank of a job shares.
//
// Ordering: a call records the compute stream's point at issue (DeviceCopyEngine::MarkIssue)
// and queues the operation; one worker thread runs the queue in issue order, each operation's
// device → host copies after its mark, then the host collective (waited), then the copies back.
// The handle completes when the result is in device memory. So, as with the other
// communicators, buffers must stay untouched until Wait returns, and every rank issues the
// same operations in the same order.
//
// Errors: as the host communicator's (InvalidArgument at issue for bad arguments, naming the
// argument and rule); the first failure of a queued operation breaks the communicator, and
// every later operation fails with FailedPrecondition carrying the first failure.
//
// Numerics: those of the host communicator (Gloo reduces 16-bit data in f32 and rounds once).
// CommStats are the host communicator's (the payload it moved).
//
// Thread-safety: as Communicator.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/comm/communicator.h"
#include "worker/comm/device_copy_engine.h"

namespace zt {

struct StagedCommunicatorOptions {
  // The transport over host buffers (a GlooCommunicator); the staged one owns it.
  std::unique_ptr<Communicator> host;
  // Copies between the ranks' device and host memory; owned too.
  std::unique_ptr<DeviceCopyEngine> copies;
  // Bytes of each of the two staging regions; at least 64 · the group size, so that every
  // chunk of a reduce-scatter or all-gather holds at least one f32 per rank.
  int64_t staging_bytes = int64_t{16} << 20;
};

class StagedCommunicator : public Communicator {
 public:
  // InvalidArgument names the missing or bad option; ResourceExhausted the staging that could
  // not be allocated.
  static absl::StatusOr<std::unique_ptr<StagedCommunicator>> Create(
      StagedCommunicatorOptions options);
  // Finishes the operation in progress; operations still queued complete with Cancelled.
  ~StagedCommunicator() override;

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }

  absl::StatusOr<CommHandle> AllReduce(Tensor data, ReduceOp op, const std::string& label) override;
  absl::StatusOr<CommHandle> ReduceScatter(Tensor input, Tensor output, ReduceOp op,
                                           const std::string& label) override;
  absl::StatusOr<CommHandle> AllGather(Tensor input, Tensor output,
                                       const std::string& label) override;
  absl::StatusOr<CommHandle> Broadcast(Tensor data, int root, const std::string& label) override;
  absl::StatusOr<CommHandle> Send(Tensor data, int peer, const std::string& label) override;
  absl::StatusOr<CommHandle> Recv(Tensor data, int peer, const std::string& label) override;
  absl::StatusOr<CommHandle> Barrier(const std::string& label) override;

  CommStats stats() const override { return host_->stats(); }

  // Elements of `dtype` a chunk of a contiguous operation holds (tests use it to make
  // operations that need several chunks).
  int64_t ChunkElements(DType dtype) const;

 private:
  using Run = std::function<absl::Status(const DeviceCopyEngine::IssueMark&)>;
  struct Op {
    CommKind kind;
    std::string label;
    DeviceCopyEngine::IssueMark mark;
    Run run;
    std::shared_ptr<CommHandle::State> state;
  };

  StagedCommunicator() = default;
  absl::StatusOr<CommHandle> Enqueue(CommKind kind, const std::string& label, Run run);
  void WorkerLoop();

  // A host tensor over staging region `region` (0 or 1) with `n` elements of `dtype`.
  Tensor Staging(int region, DType dtype, int64_t n) const;
  // Copies elements [begin, begin + n) of a device tensor to or from a staging tensor's
  // elements [at, at + n).
  absl::Status ToHost(const DeviceCopyEngine::IssueMark& mark, const Tensor& device,
                      int64_t begin, int64_t n, const Tensor& staging, int64_t at);
  absl::Status ToDevice(const DeviceCopyEngine::IssueMark& mark, const Tensor& device,
                        int64_t begin, int64_t n, const Tensor& staging, int64_t at);

  absl::Status RunAllReduce(const DeviceCopyEngine::IssueMark& mark, const Tensor& data,
                            ReduceOp op, const std::string& label);
  absl::Status RunReduceScatter(const DeviceCopyEngine::IssueMark& mark, const Tensor& input,
                                const Tensor& output, ReduceOp op, const std::string& label);
  absl::Status RunAllGather(const DeviceCopyEngine::IssueMark& mark, const Tensor& input,
                            const Tensor& output, const std::string& label);
  absl::Status RunBroadcast(const DeviceCopyEngine::IssueMark& mark, const Tensor& data, int root,
                            const std::string& label);
  absl::Status RunSend(const DeviceCopyEngine::IssueMark& mark, const Tensor& data, int peer,
                       const std::string& label);
  absl::Status RunRecv(const DeviceCopyEngine::IssueMark& mark, const Tensor& data, int peer,
                       const std::string& label);

  std::unique_ptr<Communicator> host_;
  std::unique_ptr<DeviceCopyEngine> copies_;
  int64_t staging_bytes_ = 0;
  void* staging_[2] = {nullptr, nullptr};

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Op> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // The first failure; every later operation fails with it.
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  std::thread worker_;
};

}  // namespace zt
