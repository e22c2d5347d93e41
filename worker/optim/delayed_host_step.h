// ZeRO-Offload's one-step delayed parameter update (DPU; Ren et al. 2021, §5.2;
// offload.delayed_update, docs/memory.md): the host optimizer step of step t runs on a thread
// of its own while the compute thread runs step t+1's forward and backward on the parameters
// from before step t's update. Once step t+1's backward has ended the compute thread calls
// Finish (wait for host step t, upload its parameters) and then Launch for step t+1. So after
// the warm-up p_{t+1} = Opt(p_t, g(p_{t-1})).
//
// What keeps the two threads apart:
// - gradients: the host step reads one bank of GradientDownloads' host buffers (the plan's
//   "<unit>.grads.host" or ".grads.host.1") while the next backward's copies fill the other;
//   Launch switches the bank, and needs the downloads drained.
// - parameters: the update writes the plan's "<unit>.params.host", never the device's
//   parameters, which the next step's compute reads; Finish uploads them. A Launch that does
//   not follow a Finish first downloads the device's shard into them (the host step reads
//   them when the parameters are their own master): the caller changes the device's shard
//   between a Finish and the next Launch only through collectives that keep it (FinishStep's
//   all-gather).
// - the copy engine: only the compute thread copies (Launch, Finish). The host thread touches
//   host memory alone: the gradients' bank, the master weights and states, params.host.
// - the host context: the host thread runs the optimizer's kernels with a copy of the rank's
//   host context without its GEMM workspace, which the compute thread's ops use.
//
// Not thread-safe beyond that: Launch and Finish from the rank's thread. Owns its thread; not
// the HostOptimizer (or NvmeOptimizer) or the downloads, which must outlive it. The destructor waits for a
// pending step (its result is dropped: the step it belongs to failed or the run is over).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/device.h"
#include "kernels/tensor.h"
#include "worker/comm/device_copy_engine.h"
#include "worker/optim/gradient_downloads.h"
#include "worker/optim/host_optimizer.h"

namespace zt {

class DelayedHostStep {
 public:
  struct Args {
    // Not owned. The host step's optimizer and the downloads with their two banks.
    HostOptimizer* host = nullptr;
    // Or, in place of `host` (offload.optimizer NVME, whose NvmeOptimizer::StepOnHost streams
    // the states through the swap store on the host thread): the optimizer whose ranges the
    // parameters are, and the step on host memory, with HostOptimizer::StepOnHost's contract.
    const Optimizer* optimizer = nullptr;
    std::function<absl::Status(const DeviceContext& host_ctx,
                               const std::vector<Tensor>& host_params,
                               const std::vector<Tensor>& host_grads, float lr, float grad_scale,
                               uint64_t seed)>
        step_on_host;
    GradientDownloads* gradients = nullptr;
    DeviceCopyEngine* copies = nullptr;
    // Per trainable unit: the plan's "<unit>.params.host" (host memory, at least the unit's
    // range in the parameters' dtype).
    std::vector<Tensor> params_host;
    // The rank's host context; its workspace is dropped (see above).
    DeviceContext host_ctx;
    // A probe for tests, or null: called on the host thread as host step `step` starts.
    std::function<void(int64_t step)> on_start;
  };
  // InvalidArgument when a pointer is null (neither `host` nor `optimizer` and
  // `step_on_host`), the downloads have no second bank or a buffer is not host memory.
  static absl::StatusOr<std::unique_ptr<DelayedHostStep>> Create(Args args);
  ~DelayedHostStep();
  DelayedHostStep(const DelayedHostStep&) = delete;
  DelayedHostStep& operator=(const DelayedHostStep&) = delete;

  // Starts host step `step` (1-based, for the probe) on the gradients the downloads just
  // drained, at learning rate `lr` with `grad_scale` (clipping), and switches the downloads to
  // the other bank. `params` are the device views of the rank's ranges (the engine's
  // param_views()). FailedPrecondition when a step is pending (Finish first) or the downloads
  // are not drained; the copy engine's errors as they come.
  absl::Status Launch(const std::vector<Tensor>& params, int64_t step, float lr, float grad_scale,
                      uint64_t seed);

  // What one host step did, for its step record.
  struct Finished {
    int64_t step = 0;  // 0: nothing was pending
    double update_seconds = 0;
    double upload_seconds = 0;
    int64_t bytes_to_device = 0;
    int64_t bytes_to_host = 0;  // the shard's download at Launch (a chain's first step)
    double download_seconds = 0;
  };
  // Waits for the pending host step and uploads its parameters into `params`; OK with
  // Finished{.step = 0} when none is pending. The host step's error, naming its step.
  absl::StatusOr<Finished> Finish(const std::vector<Tensor>& params);

  bool pending() const { return pending_; }
  // Host steps launched and finished so far.
  int64_t launched() const { return launched_; }

 private:
  explicit DelayedHostStep(Args args);
  void WorkerLoop();

  const Optimizer* const optimizer_;
  const std::function<absl::Status(const DeviceContext&, const std::vector<Tensor>&,
                                   const std::vector<Tensor>&, float, float, uint64_t)>
      step_on_host_;
  GradientDownloads* const gradients_;
  DeviceCopyEngine* const copies_;
  const std::vector<Tensor> params_host_;
  const DeviceContext host_ctx_;
  const std::function<void(int64_t)> on_start_;

  // The rank's thread only.
  bool pending_ = false;
  // Finish's upload left params.host equal to the device's shard (until the next Launch).
  bool uploaded_ = false;
  int64_t launched_ = 0;
  Finished launch_stats_;  // the download of the pending step's Launch

  std::mutex mu_;
  std::condition_variable cv_;
  // The job handed to the worker, and its outcome (guarded by mu_).
  struct Job {
    int64_t step = 0;
    float lr = 0;
    float grad_scale = 1;
    uint64_t seed = 0;
    std::vector<Tensor> grads;
  };
  bool has_job_ = false;
  bool done_ = false;
  bool stopping_ = false;
  Job job_;
  absl::Status result_;
  double update_seconds_ = 0;
  std::thread worker_;  // last: starts after the members it reads
};

}  // namespace zt
