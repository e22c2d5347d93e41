// RankDevice: the device one rank trains on, and every crossing between its memory and the
// host. The trainer takes from it the arenas' allocator, the ops' context and the copy engine
// through which every byte of the step loop crosses (the batch up, the step's statistics down),
// so the step loop is written once for every device:
//   CPU:  host arenas, the pinned_host category from the offload tier's pinned host pool
//         (worker/train/pinned_host_arena.h), a host copy engine (copies are memcpy), a CPU
//         context;
//   CUDA: arenas from one cudaMalloc per category (cudaHostAlloc for pinned host), a
//         CudaCopyEngine on a copy stream of its own, a context on a compute stream of its own
//         (worker/train/cuda/cuda_rank_device.h).
// The copy engine's copies block until the bytes have arrived, after everything enqueued on
// the compute stream so far: a Download is the step loop's wait (the only one), and an Upload
// never overwrites a buffer a queued kernel still reads.
//
// host_addressable() says whether the host may read and write the arenas' device memory
// directly (CPU devices); where it may not, set-up, checkpoints, resume and export move the
// bytes through Upload/Download and host staging. Tests build a RankDevice from parts
// (FromParts) to count the crossings, or to run the CUDA paths over host memory.
//
// Thread-safety: one rank thread uses it; the copy engine's own rules apply to it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/device.h"
#include "kernels/tensor.h"
#include "proto/job.pb.h"
#include "worker/comm/device_copy_engine.h"
#include "worker/plan/arena.h"
#include "worker/shard/rank_communicators.h"

namespace zt {

// Memory outside the memory plan, for set-up and export only (never the step loop): the
// tensor's memory lives as long as `owner`.
struct ScratchTensor {
  std::shared_ptr<void> owner;
  Tensor tensor;
};

class RankDevice {
 public:
  struct Parts {
    // The ops' context: device, threads, stream (the trainer sets its workspace from the plan).
    DeviceContext context;
    std::unique_ptr<ArenaAllocator> allocator;
    std::unique_ptr<DeviceCopyEngine> copies;
    bool host_addressable = true;
    // Device memory outside the plan: `bytes` zeroed, 64-byte aligned, freed with the owner.
    // Null: host memory (the device is host memory).
    std::function<absl::StatusOr<std::shared_ptr<void>>(int64_t bytes)> allocate_scratch;
    // How the rank's communicators reach its memory (rank_communicators.h).
    RankCommDevice comm;
    // Released after everything above (a CUDA stream the context and the engines use).
    std::shared_ptr<void> keep_alive;
  };

  // The job's device (resources.device) for `rank`. A CUDA rank computes on GPU
  // `cuda_device` when it is ≥ 0 (the device a coordinator placed it on: one rank per GPU, so
  // a job of several ranks talks over NCCL), else on local GPU rank % count (`zt train`'s
  // ranks, NCCL only when every rank gets a GPU of its own). Unimplemented for CUDA in a build
  // without CUDA; FailedPrecondition naming the CUDA error when no GPU is usable, or naming
  // `cuda_device` when no such GPU is visible. `cuda_device` is ignored on CPU devices.
  static absl::StatusOr<std::unique_ptr<RankDevice>> Create(const zerotrain::JobSpec& job,
                                                            int rank, int cuda_device);
  // InvalidArgument when the allocator or the copy engine is missing.
  static absl::StatusOr<std::unique_ptr<RankDevice>> FromParts(Parts parts);
  ~RankDevice();
  RankDevice(const RankDevice&) = delete;
  RankDevice& operator=(const RankDevice&) = delete;

  const DeviceContext& context() const { return parts_.context; }
  DeviceContext& mutable_context() { return parts_.context; }
  bool host_addressable() const { return parts_.host_addressable; }
  const RankCommDevice& comm() const { return parts_.comm; }
  // The engine every crossing goes through; the host step of offloaded optimizer states
  // (worker/optim/host_optimizer.h) moves its gradients and parameters with it.
  DeviceCopyEngine& copies() { return *parts_.copies; }

  // The arenas' allocator, handed over once (FailedPrecondition the second time).
  absl::StatusOr<std::unique_ptr<ArenaAllocator>> TakeAllocator();

  // Host memory the copies run at full speed from (page-locked on CUDA), for the engine's life.
  absl::StatusOr<void*> AllocateStaging(int64_t bytes);
  // f32 device memory outside the plan (set-up and export only).
  absl::StatusOr<ScratchTensor> AllocateScratchF32(int64_t numel);

  // dst (device) ← dst.size_bytes() bytes of `host`, after the compute enqueued so far.
  absl::Status Upload(const Tensor& dst, const void* host);
  // src.size_bytes() bytes of src (device) → `host`, after the compute enqueued so far: waits.
  absl::Status Download(void* host, const Tensor& src);

 private:
  explicit RankDevice(Parts parts) : parts_(std::move(parts)) {}
  Parts parts_;
};

}  // namespace zt
