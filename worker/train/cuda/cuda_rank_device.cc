#include "worker/train/cuda/cuda_rank_device.h"

#include <cuda_runtime_api.h>

#include <memory>

#include "absl/strings/str_cat.h"
#include "kernels/status_macros.h"
#include "worker/comm/cuda/cuda_copy_engine.h"
#include "worker/plan/cuda/cuda_arena_allocator.h"

namespace zt {
namespace {

absl::Status Check(const char* call, cudaError_t e) {
  if (e == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();  // clear the sticky error of this thread
  return absl::FailedPreconditionError(absl::StrCat("rank device: ", call,
                                                    " failed with CUDA error ", static_cast<int>(e),
                                                    ": ", cudaGetErrorString(e)));
}

}  // namespace

absl::StatusOr<RankDevice::Parts> CudaRankDeviceParts(const zerotrain::JobSpec& job, int rank,
                                                      int cuda_device) {
  int count = 0;
  ZT_RETURN_IF_ERROR(Check("cudaGetDeviceCount", cudaGetDeviceCount(&count)));
  if (count < 1) {
    return absl::FailedPreconditionError("resources.device is CUDA but no CUDA device is visible");
  }
  if (cuda_device >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank, " was placed on CUDA device ", cuda_device, " but ", count,
                     " CUDA device(s) are visible (CUDA_VISIBLE_DEVICES?)"));
  }
  const bool placed = cuda_device >= 0;
  const int device = placed ? cuda_device : rank % count;
  ZT_RETURN_IF_ERROR(Check("cudaSetDevice", cudaSetDevice(device)));
  cudaStream_t stream = nullptr;
  ZT_RETURN_IF_ERROR(Check("cudaStreamCreateWithFlags",
                           cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)));
  RankDevice::Parts parts;
  parts.keep_alive = std::shared_ptr<void>(stream, [device](void* s) {
    cudaSetDevice(device);
    cudaStreamSynchronize(static_cast<cudaStream_t>(s));
    cudaStreamDestroy(static_cast<cudaStream_t>(s));
  });
  parts.context.device = Device{.kind = DeviceKind::kCuda, .index = device};
  parts.context.num_threads = 1;
  parts.context.stream = stream;
  parts.context.allow_tf32 = job.precision().allow_tf32();
  ZT_ASSIGN_OR_RETURN(parts.allocator, MakeCudaArenaAllocator(device));
  ZT_ASSIGN_OR_RETURN(std::unique_ptr<CudaCopyEngine> copies,
                      CudaCopyEngine::Create(device, stream));
  parts.copies = std::move(copies);
  parts.host_addressable = false;
  parts.allocate_scratch = [device](int64_t bytes) -> absl::StatusOr<std::shared_ptr<void>> {
    ZT_RETURN_IF_ERROR(Check("cudaSetDevice", cudaSetDevice(device)));
    void* p = nullptr;
    ZT_RETURN_IF_ERROR(Check("cudaMalloc", cudaMalloc(&p, static_cast<size_t>(bytes))));
    if (absl::Status s = Check("cudaMemset", cudaMemset(p, 0, static_cast<size_t>(bytes)));
        !s.ok()) {
      cudaFree(p);
      return s;
    }
    return std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
  };
  // A coordinator places one rank per GPU; local ranks have one each while they are few enough.
  parts.comm.nccl =
      job.parallel().world_size() > 1 && (placed || job.parallel().world_size() <= count);
#if !ZT_HAVE_NCCL
  parts.comm.nccl = false;
#endif
  parts.comm.cuda_device = device;
  parts.comm.stream = stream;
  if (!parts.comm.nccl) {
    parts.comm.make_copy_engine = [device,
                                   stream]() -> absl::StatusOr<std::unique_ptr<DeviceCopyEngine>> {
      ZT_ASSIGN_OR_RETURN(std::unique_ptr<CudaCopyEngine> e,
                          CudaCopyEngine::Create(device, stream));
      return std::unique_ptr<DeviceCopyEngine>(std::move(e));
    };
  }
  return parts;
}

}  // namespace zt
