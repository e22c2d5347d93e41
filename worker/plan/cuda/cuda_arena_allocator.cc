#include "worker/plan/cuda/cuda_arena_allocator.h"

#include <cuda_runtime_api.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"

namespace zt {
namespace {

bool OnHost(MemoryCategory c) {
  return c == MemoryCategory::kPinnedHost || c == MemoryCategory::kNvme;
}

// "memory plan: cudaMalloc of N bytes for <category> failed: CUDA error ...", with the kernels'
// mapping of CUDA errors to statuses (memory → ResourceExhausted).
absl::Status CudaFailure(MemoryCategory c, int64_t bytes, const char* call, cudaError_t e) {
  return cuda::CudaError("memory plan",
                         absl::StrCat(call, " of ", bytes, " bytes for ", MemoryCategoryName(c))
                             .c_str(),
                         e);
}

class CudaArenaAllocator : public ArenaAllocator {
 public:
  explicit CudaArenaAllocator(int device) : device_(device) {}

  Device DeviceOf(MemoryCategory c) const override {
    if (OnHost(c)) return Device{};
    return Device{.kind = DeviceKind::kCuda, .index = device_};
  }

  absl::StatusOr<void*> Allocate(MemoryCategory c, int64_t bytes) override {
    void* p = nullptr;
    const auto size = static_cast<size_t>(AlignedBytes(bytes));
    if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
      return CudaFailure(c, bytes, "cudaSetDevice", e);
    }
    if (OnHost(c)) {
      if (cudaError_t e = cudaHostAlloc(&p, size, cudaHostAllocPortable); e != cudaSuccess) {
        return CudaFailure(c, bytes, "cudaHostAlloc", e);
      }
      std::memset(p, 0, size);
      return p;
    }
    // cudaMalloc aligns to at least 256 bytes, more than kBufferAlignment.
    if (cudaError_t e = cudaMalloc(&p, size); e != cudaSuccess) {
      return CudaFailure(c, bytes, "cudaMalloc", e);
    }
    if (cudaError_t e = cudaMemset(p, 0, size); e != cudaSuccess) {
      cudaFree(p);
      return CudaFailure(c, bytes, "cudaMemset", e);
    }
    return p;
  }

  void Free(MemoryCategory c, void* data) override {
    cudaSetDevice(device_);
    if (OnHost(c)) {
      cudaFreeHost(data);
    } else {
      cudaFree(data);
    }
  }

 private:
  int device_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ArenaAllocator>> MakeCudaArenaAllocator(int device) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || device < 0 || device >= count) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA device ", device, " is not usable: ",
                     e != cudaSuccess ? cudaGetErrorString(e)
                                      : absl::StrCat(count, " devices visible").c_str()));
  }
  return std::make_unique<CudaArenaAllocator>(device);
}

}  // namespace zt
