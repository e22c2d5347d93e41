// ZeRO-Offload's gradient overlap (DESIGN.md, "Offload tier"; Ren et al. 2021, §4): with the
// optimizer step on the host (offload.optimizer CPU or NVME), each unit's reduced gradient
// shard is copied device → host as soon as its reduction is issued on the step's last
// micro-batch, on a copy thread of its own, while the compute thread runs the backward of the
// next units. The host step then takes each unit's gradient from its pinned host buffer (the
// plan's "<unit>.grads.host", pinned_host), waiting only for that unit's copy.
//
// Order: Enqueue(u, after) is called on the compute thread (it records the compute stream's
// point, DeviceCopyEngine::MarkIssue, so a device op that wrote the gradient before it comes
// before the copy); the copy thread waits for the reductions in `after` (the communicators'
// handles), then copies with that mark. Copies run in the order they were enqueued.
//
// The copy thread is the "one other thread" the copy engine's contract allows besides the
// issuing thread (DeviceCopyEngine): on a CUDA rank its copies go to the engine's copy
// stream, the queue the CUDA backend plugs in.
//
// Thread-safe: Enqueue and BackwardEnded from the compute thread; Take and Drain from the
// thread that runs the host step (the same one). Owns its thread; not the copy engine, which
// must outlive it. The destructor finishes what is queued.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/tensor.h"
#include "worker/comm/communicator.h"
#include "worker/comm/device_copy_engine.h"
#include "worker/model/param_layout.h"
#include "worker/plan/arena.h"

namespace zt {

class GradientDownloads {
 public:
  struct Args {
    DeviceCopyEngine* copies = nullptr;
    // Per trainable unit: the reduced gradient the host step reads (a device view, the
    // engine's grad_views()[u]) and its pinned host buffer (at least as many bytes).
    std::vector<Tensor> device;
    std::vector<Tensor> host;
    // A second bank of host buffers (the plan's "<unit>.grads.host.1", offload.delayed_update)
    // or empty: the delayed host step reads one bank while the next backward fills the other.
    std::vector<Tensor> host_bank1;
  };
  // InvalidArgument when `copies` is null, the lists differ in length, a host buffer is not
  // host memory or is smaller than its gradient (naming the unit and the bank).
  static absl::StatusOr<std::unique_ptr<GradientDownloads>> Create(Args args);
  ~GradientDownloads();
  GradientDownloads(const GradientDownloads&) = delete;
  GradientDownloads& operator=(const GradientDownloads&) = delete;

  // Unit u's reduction has been issued (its last handles in `after`, possibly none): queue its
  // copy. Counted as issued during the backward until BackwardEnded is called for the step.
  void Enqueue(int u, std::vector<CommHandle> after);
  // The backward of the step's last micro-batch has ended (the engine's hook).
  void BackwardEnded();
  // Waits for unit u's copy of this step; a host view of its gradient (the device view's
  // dtype and element count). FailedPrecondition when no copy of u was enqueued since the last
  // Take of u; the reduction's or the copy's error otherwise.
  absl::StatusOr<Tensor> Take(int u);
  // Waits until every copy queued so far has finished (a skipped step's, before the next
  // step's backward writes the gradients again); the first error among them, or OK. Called
  // at the end of every step: what is enqueued after it belongs to the next step.
  absl::Status Drain();

  // The delayed update's double buffering. Copies enqueued from now on go to bank `bank`
  // (0: Args::host, 1: Args::host_bank1). FailedPrecondition when there is no bank 1 or a copy
  // is still queued or running (call after Drain, on the compute thread).
  absl::Status UseBank(int bank);
  int bank() const;
  // Host views of bank `bank`'s gradients (each its device view's dtype and element count):
  // what a host step reads without Take once Drain has returned.
  std::vector<Tensor> HostGradients(int bank) const;

  struct Stats {
    int64_t bytes = 0;        // copied device → host
    double copy_seconds = 0;  // the copy thread's time in copies (overlapped with compute)
    double wait_seconds = 0;  // the host step's time blocked in Take (not overlapped)
    int64_t copies = 0;       // copies made
      // Copies enqueued before their step's BackwardEnded, and copies finished before it (a
    // step ends with Drain).
    int64_t enqueued_during_backward = 0;
    int64_t finished_during_backward = 0;
  };
  Stats stats() const;

 private:
  struct Task {
    int unit = 0;
    DeviceCopyEngine::IssueMark mark;
    std::vector<CommHandle> after;
    int bank = 0;
  };
  explicit GradientDownloads(Args args);
  void WorkerLoop();

  DeviceCopyEngine* const copies_;
  const std::vector<Tensor> device_;
  const std::vector<Tensor> host_;
  const std::vector<Tensor> host_bank1_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool running_ = false;  // the worker holds a task
  bool stopping_ = false;
  std::vector<int64_t> enqueued_, finished_;  // per unit, copies so far
  std::vector<int64_t> taken_;                // per unit, copies Take returned
  std::vector<absl::Status> unit_status_;     // per unit, its last copy's status
  absl::Status first_error_;                  // since the last Drain
  bool backward_ended_ = false;  // this step's (BackwardEnded; Drain starts the next step)
  int bank_ = 0;                 // where Enqueue's copies go
  Stats stats_;
  std::thread worker_;  // last: starts after the members it reads
};

// The downloads of a rank whose plan holds "<unit>.grads.host" for every unit of `trained`
// (PlanMemory with offload.optimizer CPU), into those buffers (and "<unit>.grads.host.1", the
// second bank, when the plan holds them: offload.delayed_update) from `grads` (the
// engine's grad_views(), parallel to trained.units); nullptr when the plan holds none (the
// host step then copies each gradient itself). Internal when it holds some but not all.
absl::StatusOr<std::unique_ptr<GradientDownloads>> GradientDownloadsFromPlan(
    const Arenas& arenas, const ModelLayout& trained, const std::vector<Tensor>& grads,
    DeviceCopyEngine* copies);

}  // namespace zt
