// CudaCopyEngine: the DeviceCopyEngine of one CUDA device: a copy stream of its own, issue
// marks as CUDA events recorded on the compute stream, and page-locked staging
// (cudaHostAlloc), so device ↔ host copies run on the copy engines beside the compute kernels.
//
// Marks come from a fixed ring of events created with the engine (nothing is created in the
// step loop). A ring slot may be recorded again before an older copy waited on it; the wait
// then covers a later point of the same compute stream, which is still correct (that point
// comes after the one asked for) and cannot deadlock: the compute stream never waits for a
// staged operation (its completion is a host-side handle).
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/comm/device_copy_engine.h"

namespace zt {

class CudaCopyEngine : public DeviceCopyEngine {
 public:
  // `compute_stream` is the stream the rank's kernels run on (not owned; may be the legacy
  // default stream, null). FailedPrecondition when the device cannot be used.
  static absl::StatusOr<std::unique_ptr<CudaCopyEngine>> Create(int device,
                                                                cudaStream_t compute_stream);
  ~CudaCopyEngine() override;

  Device device() const override { return Device{.kind = DeviceKind::kCuda, .index = device_}; }
  absl::StatusOr<void*> AllocateStaging(int64_t bytes) override;
  absl::StatusOr<IssueMark> MarkIssue() override;
  absl::Status CopyToHost(const IssueMark& mark, void* host, const void* device,
                          int64_t bytes) override;
  absl::Status CopyToDevice(const IssueMark& mark, void* device, const void* host,
                            int64_t bytes) override;

 private:
  static constexpr int kMarks = 64;
  CudaCopyEngine() = default;
  absl::Status Copy(const IssueMark& mark, void* dst, const void* src, int64_t bytes,
                    cudaMemcpyKind kind, const char* what);

  int device_ = 0;
  cudaStream_t compute_ = nullptr;
  cudaStream_t copy_ = nullptr;
  std::array<cudaEvent_t, kMarks> events_{};
  std::mutex mu_;
  int next_mark_ = 0;  // guarded by mu_
  std::vector<void*> staging_;
};

}  // namespace zt
