// A CPU "device" whose memory is its own, as a GPU's is (TrainOptions::make_device): its arenas
// and its context say cpu:1, while the pinned host pool and every host buffer say cpu:0; the
// trainer is told the host cannot address it, and its communicators are staged through a copy
// engine (worker/comm/staged_communicator.h) as a GPU rank's are without NCCL. Every kernel
// refuses an argument from the other side by name (kernels/arg_checks.h) and every staged
// collective a buffer that is not on the device, so a run through it finds, on the CPU, each
// place a GPU rank would touch device memory from the host, or host memory from a device op or
// a collective, except through the rank's copy engine. What it cannot find is stream order.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/device.h"
#include "proto/job.pb.h"
#include "worker/comm/device_copy_engine.h"
#include "worker/plan/arena.h"
#include "worker/plan/memory_plan.h"
#include "worker/train/pinned_host_arena.h"
#include "worker/train/rank_device.h"

namespace zt::testing {

constexpr Device kSeparateDeviceMemory{.kind = DeviceKind::kCpu, .index = 1};

// Host memory said to be on `device`, every category (MakePinnedHostArenaAllocator puts the
// pinned_host one back on the host).
class RelabelledArenaAllocator : public ArenaAllocator {
 public:
  explicit RelabelledArenaAllocator(Device device)
      : inner_(MakeHostArenaAllocator()), device_(device) {}
  Device DeviceOf(MemoryCategory) const override { return device_; }
  absl::StatusOr<void*> Allocate(MemoryCategory c, int64_t bytes) override {
    return inner_->Allocate(c, bytes);
  }
  void Free(MemoryCategory c, void* data) override { inner_->Free(c, data); }

 private:
  std::unique_ptr<ArenaAllocator> inner_;
  Device device_;
};

inline absl::StatusOr<std::unique_ptr<RankDevice>> SeparateMemoryDevice(
    const zerotrain::JobSpec& job, int /*rank*/) {
  RankDevice::Parts parts;
  parts.context = JobDeviceContext(job);
  parts.context.device = kSeparateDeviceMemory;
  parts.allocator = MakePinnedHostArenaAllocator(
      std::make_unique<RelabelledArenaAllocator>(kSeparateDeviceMemory),
      {.pin_memory = job.offload().pin_memory()});
  parts.copies = MakeHostCopyEngine(kSeparateDeviceMemory);
  parts.host_addressable = false;
  parts.comm.make_copy_engine = []() -> absl::StatusOr<std::unique_ptr<DeviceCopyEngine>> {
    return MakeHostCopyEngine(kSeparateDeviceMemory);
  };
  return RankDevice::FromParts(std::move(parts));
}

}  // namespace zt::testing
