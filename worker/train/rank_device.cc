#include "worker/train/rank_device.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/status_macros.h"
#include "worker/plan/memory_plan.h"
#include "worker/train/pinned_host_arena.h"
#if ZT_HAVE_CUDA_TRAINING
#include "worker/train/cuda/cuda_rank_device.h"
#endif

namespace zt {

absl::StatusOr<std::unique_ptr<RankDevice>> RankDevice::Create(const zerotrain::JobSpec& job,
                                                               int rank, int cuda_device) {
  if (job.resources().device() == zerotrain::ResourceConfig::CUDA) {
#if ZT_HAVE_CUDA_TRAINING
    ZT_ASSIGN_OR_RETURN(Parts parts, CudaRankDeviceParts(job, rank, cuda_device));
    return FromParts(std::move(parts));
#else
    (void)rank;
    (void)cuda_device;
    return absl::UnimplementedError(
        "resources.device: CUDA needs a build with CUDA and NCCL (this one has neither the "
        "CUDA kernels nor the CUDA copy engine)");
#endif
  }
  Parts parts;
  parts.context = JobDeviceContext(job);
  parts.allocator = MakePinnedHostArenaAllocator(MakeHostArenaAllocator(),
                                                 {.pin_memory = job.offload().pin_memory()});
  parts.copies = MakeHostCopyEngine(parts.context.device);
  parts.host_addressable = true;
  return FromParts(std::move(parts));
}

absl::StatusOr<std::unique_ptr<RankDevice>> RankDevice::FromParts(Parts parts) {
  if (parts.allocator == nullptr || parts.copies == nullptr) {
    return absl::InvalidArgumentError("RankDevice: parts need an allocator and a copy engine");
  }
  return std::unique_ptr<RankDevice>(new RankDevice(std::move(parts)));
}

RankDevice::~RankDevice() {
  // The engines use the stream keep_alive holds: they go first.
  parts_.copies.reset();
  parts_.allocator.reset();
  parts_.comm = {};
}

absl::StatusOr<std::unique_ptr<ArenaAllocator>> RankDevice::TakeAllocator() {
  if (parts_.allocator == nullptr) {
    return absl::FailedPreconditionError("RankDevice: the arena allocator was already taken");
  }
  return std::move(parts_.allocator);
}

absl::StatusOr<void*> RankDevice::AllocateStaging(int64_t bytes) {
  return parts_.copies->AllocateStaging(bytes);
}

absl::StatusOr<ScratchTensor> RankDevice::AllocateScratchF32(int64_t numel) {
  const int64_t bytes = std::max<int64_t>(numel, 1) * 4;
  ScratchTensor s;
  if (parts_.allocate_scratch) {
    ZT_ASSIGN_OR_RETURN(s.owner, parts_.allocate_scratch(bytes));
  } else {
    void* p = std::aligned_alloc(64, static_cast<size_t>((bytes + 63) / 64 * 64));
    if (p == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("scratch of ", bytes, " host bytes"));
    }
    std::memset(p, 0, static_cast<size_t>(bytes));
    s.owner = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  }
  s.tensor = Tensor(s.owner.get(), DType::kF32, {numel}, parts_.context.device);
  return s;
}

absl::Status RankDevice::Upload(const Tensor& dst, const void* host) {
  ZT_ASSIGN_OR_RETURN(DeviceCopyEngine::IssueMark mark, parts_.copies->MarkIssue());
  return parts_.copies->CopyToDevice(mark, dst.raw(), host, dst.size_bytes());
}

absl::Status RankDevice::Download(void* host, const Tensor& src) {
  ZT_ASSIGN_OR_RETURN(DeviceCopyEngine::IssueMark mark, parts_.copies->MarkIssue());
  return parts_.copies->CopyToHost(mark, host, src.raw(), src.size_bytes());
}

}  // namespace zt
