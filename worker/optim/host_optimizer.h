// The optimizer step of ZeRO-Offload (DESIGN.md, "Offload tier"): for a rank whose fp32 master
// weights and optimizer states live in host memory (the memory plan's pinned_host buffers
// with offload.optimizer CPU), each unit in turn has its reduced gradient shard copied down
// from the device into a host buffer, is updated on host threads by the same Optimizer and
// kernels the device path runs, and has its updated parameter shard copied back up. On a CPU
// device the result is bit for bit the device path's (the same arithmetic on the same values;
// tests/unit/worker/optim/host_optimizer_test.cc).
//
// With Args::gradients (the trainer's, whenever the plan holds "<unit>.grads.host") the
// gradient came down during the backward (gradient_downloads.h) and the step only waits for
// that unit's copy; without, it copies it through grad_staging itself.
//
// When the parameters are their own master (fp32 without master weights) the parameter shard
// also comes down before the update. Units go one at a time through two host buffers (the
// plan's pinned ring), so host staging stays one unit's shard whatever the model's size.
// With the parameters themselves in host memory (offload.params CPU, Args::params) only the
// gradients come down: the update writes the host shard, which the next gathers read.
//
// Not thread-safe: one per rank, like its Optimizer. The copy engine is not owned and must
// outlive it.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "kernels/device.h"
#include "kernels/tensor.h"
#include "worker/comm/device_copy_engine.h"
#include "worker/optim/gradient_downloads.h"
#include "worker/optim/optimizer.h"

namespace zt {

class HostOptimizer {
 public:
  struct Args {
    // Steps the host-resident master weights and states: Optimizer::Create over the arenas
    // that hold them, with the rank's ranges.
    Optimizer optimizer;
    // Moves bytes between the device the parameters and gradients are on and host memory.
    DeviceCopyEngine* copies = nullptr;
    // Host buffers (any dtype; their bytes count), each at least the largest unit range of
    // gradients / parameters in bytes: buffers of the plan's "offload.ring.<k>". Only those the
    // step uses: no grad_staging with `gradients`, no param_staging with params kHost (empty
    // tensors then).
    Tensor grad_staging;
    Tensor param_staging;
    // kHost: params[u] of Step are host memory (offload.params CPU); the update reads and
    // writes them in place, and no parameter byte crosses the copy engine.
    ParamHome params = ParamHome::kDevice;
    // Not owned: the reduced gradients, copied down during the backward (ZeRO-Offload's
    // overlap). Step takes unit u's from it instead of copying it through grad_staging.
    GradientDownloads* gradients = nullptr;
  };
  // InvalidArgument when `copies` is null or a staging buffer the step uses is not on the host.
  static absl::StatusOr<HostOptimizer> Create(Args args);

  // Optimizer::Step's contract, unit by unit through host memory: params[u] and grads[u] are
  // device views whose first element is element range(u).begin of unit u. FailedPrecondition
  // naming the unit when its range does not fit a staging buffer; the copy engine's errors
  // as they come.
  absl::Status Step(const DeviceContext& host_ctx, const std::vector<Tensor>& params,
                    const std::vector<Tensor>& grads, float lr, float grad_scale,
                    uint64_t seed = 0);

  // The delayed update's host step (delayed_host_step.h): the update alone, in host memory,
  // no copy. host_params[u] holds unit u's range of parameters (read when they are their own
  // master) and receives the updated ones; host_grads[u] its reduced gradient. The same
  // StepUnit calls in the same order as Step, then CountStep, so the arithmetic is Step's.
  // Touches no Stats (it runs beside the rank's thread, which reads them): the caller times
  // it. May run on another thread than Step, never beside it.
  absl::Status StepOnHost(const DeviceContext& host_ctx, const std::vector<Tensor>& host_params,
                          const std::vector<Tensor>& host_grads, float lr, float grad_scale,
                          uint64_t seed = 0);

  // What the steps so far moved and spent, cumulative: the bytes copied device → host
  // (gradients, and parameters that are their own master) and host → device (updated
  // parameters), the seconds those copies took, and the seconds of the host updates.
  struct Stats {
    int64_t bytes_to_host = 0;
    int64_t bytes_to_device = 0;
    double seconds_to_host = 0;
    double seconds_to_device = 0;
    double seconds_update = 0;
    // With Args::gradients: the seconds Step waited for a gradient copy still in flight
    // (the copies' own seconds are GradientDownloads::Stats').
    double seconds_gradient_wait = 0;
  };
  const Stats& stats() const { return stats_; }

  const Optimizer& optimizer() const { return optimizer_; }
  Optimizer& optimizer() { return optimizer_; }

 private:
  explicit HostOptimizer(Args args);

  Optimizer optimizer_;
  DeviceCopyEngine* copies_;
  Tensor grad_staging_;
  Tensor param_staging_;
  ParamHome params_home_;
  GradientDownloads* gradients_;
  Stats stats_;
};

}  // namespace zt
