#include "worker/comm/cuda/cuda_copy_engine.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"

namespace zt {
namespace {

// The kernels' mapping of CUDA errors to statuses (memory → ResourceExhausted), named for the
// engine and the step that failed.
absl::Status CudaStatus(const char* what, cudaError_t e) {
  return cuda::CudaError("CudaCopyEngine", what, e);
}

#define ZT_COPY_ENGINE_CHECK(what, expr)                        \
  do {                                                          \
    const cudaError_t zt_copy_error_ = (expr);                  \
    if (zt_copy_error_ != cudaSuccess) return CudaStatus((what), zt_copy_error_); \
  } while (0)

}  // namespace

absl::StatusOr<std::unique_ptr<CudaCopyEngine>> CudaCopyEngine::Create(
    int device, cudaStream_t compute_stream) {
  int count = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess || device >= count ||
                                                        device < 0) {
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat(
        "CudaCopyEngine: CUDA device ", device, " is not usable (", count, " devices visible",
        e != cudaSuccess ? absl::StrCat(", ", cudaGetErrorString(e)) : std::string(), ")"));
  }
  std::unique_ptr<CudaCopyEngine> engine(new CudaCopyEngine());
  engine->device_ = device;
  engine->compute_ = compute_stream;
  ZT_COPY_ENGINE_CHECK("cudaSetDevice", cudaSetDevice(device));
  ZT_COPY_ENGINE_CHECK("creating the copy stream",
                       cudaStreamCreateWithFlags(&engine->copy_, cudaStreamNonBlocking));
  for (cudaEvent_t& e : engine->events_) {
    ZT_COPY_ENGINE_CHECK("creating an issue event",
                         cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  return engine;
}

CudaCopyEngine::~CudaCopyEngine() {
  cudaSetDevice(device_);
  if (copy_ != nullptr) cudaStreamSynchronize(copy_);
  for (cudaEvent_t e : events_) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  if (copy_ != nullptr) cudaStreamDestroy(copy_);
  for (void* p : staging_) cudaFreeHost(p);
}

absl::StatusOr<void*> CudaCopyEngine::AllocateStaging(int64_t bytes) {
  void* p = nullptr;
  ZT_COPY_ENGINE_CHECK(absl::StrCat("cudaHostAlloc of ", bytes, " bytes of staging").c_str(),
                       cudaHostAlloc(&p, static_cast<size_t>(bytes > 0 ? bytes : 1),
                                     cudaHostAllocPortable));
  staging_.push_back(p);
  return p;
}

absl::StatusOr<DeviceCopyEngine::IssueMark> CudaCopyEngine::MarkIssue() {
  cudaEvent_t event;
  {
    std::lock_guard<std::mutex> lock(mu_);
    event = events_[next_mark_];
    next_mark_ = (next_mark_ + 1) % kMarks;
  }
  ZT_COPY_ENGINE_CHECK("cudaSetDevice", cudaSetDevice(device_));
  ZT_COPY_ENGINE_CHECK("recording an issue event", cudaEventRecord(event, compute_));
  // A non-owning handle to the event: the engine owns every event for its life.
  return IssueMark(std::shared_ptr<const void>(), static_cast<const void*>(event));
}

absl::Status CudaCopyEngine::Copy(const IssueMark& mark, void* dst, const void* src,
                                  int64_t bytes, cudaMemcpyKind kind, const char* what) {
  if (bytes == 0) return absl::OkStatus();
  ZT_COPY_ENGINE_CHECK("cudaSetDevice", cudaSetDevice(device_));
  if (mark != nullptr) {
    auto event = static_cast<cudaEvent_t>(const_cast<void*>(mark.get()));
    ZT_COPY_ENGINE_CHECK("waiting for the issue point", cudaStreamWaitEvent(copy_, event, 0));
  }
  ZT_COPY_ENGINE_CHECK(what, cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), kind, copy_));
  ZT_COPY_ENGINE_CHECK(what, cudaStreamSynchronize(copy_));
  return absl::OkStatus();
}

absl::Status CudaCopyEngine::CopyToHost(const IssueMark& mark, void* host, const void* device,
                                        int64_t bytes) {
  return Copy(mark, host, device, bytes, cudaMemcpyDeviceToHost, "device → host copy");
}

absl::Status CudaCopyEngine::CopyToDevice(const IssueMark& mark, void* device, const void* host,
                                          int64_t bytes) {
  return Copy(mark, device, host, bytes, cudaMemcpyHostToDevice, "host → device copy");
}

}  // namespace zt
