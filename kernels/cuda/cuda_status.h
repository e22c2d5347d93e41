// CUDA runtime and cuBLASLt results as absl::Status, for the CUDA twins of the ops
// (kernels/cuda/*.cu) and whatever else owns a stream.
//
// Every call is checked. A failed runtime call's error is cleared (cudaGetLastError) so the
// next call starts clean; the message names the op, the call and CUDA's own words. A launch
// is checked right after it is enqueued: that catches a bad configuration (too many threads,
// too much shared memory), not a fault inside the kernel, which surfaces where the step loop
// synchronizes. Nothing here synchronizes.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/device.h"

namespace zt::cuda {

// ResourceExhausted for memory (the caller's plan was wrong or the device is shared),
// Internal otherwise.
inline absl::Status CudaError(const char* op, const char* call, cudaError_t e) {
  cudaGetLastError();
  const std::string message =
      absl::StrCat(op, ": ", call, " failed: CUDA error ", static_cast<int>(e), " (",
                   cudaGetErrorName(e), "): ", cudaGetErrorString(e));
  if (e == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

inline absl::Status CublasError(const char* op, const char* call, cublasStatus_t s) {
  const std::string message = absl::StrCat(op, ": ", call, " failed: cuBLAS status ",
                                           static_cast<int>(s), " (", cublasLtGetStatusName(s), ")");
  if (s == CUBLAS_STATUS_ALLOC_FAILED) return absl::ResourceExhaustedError(message);
  if (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE) {
    return absl::InvalidArgumentError(message);
  }
  return absl::InternalError(message);
}

// The status of the launches enqueued since the last check.
inline absl::Status LaunchStatus(const char* op) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return absl::OkStatus();
  return CudaError(op, "kernel launch", e);
}

inline cudaStream_t StreamOf(const DeviceContext& ctx) {
  return static_cast<cudaStream_t>(ctx.stream);
}

// Blocks of `threads` covering `n` items, capped where a grid-stride loop takes the rest.
inline unsigned int GridFor(int64_t n, int threads, int64_t max_blocks = 65535LL * 8) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned int>(blocks < 1 ? 1 : (blocks > max_blocks ? max_blocks : blocks));
}

}  // namespace zt::cuda

// `expr` is a cudaError_t; `op` names the calling op in the error.
#define ZT_CUDA_RETURN_IF_ERROR(op, expr)                                 \
  do {                                                                    \
    const cudaError_t zt_cuda_error_ = (expr);                            \
    if (zt_cuda_error_ != cudaSuccess) {                                  \
      return ::zt::cuda::CudaError((op), #expr, zt_cuda_error_);          \
    }                                                                     \
  } while (0)

// `expr` is a cublasStatus_t.
#define ZT_CUBLAS_RETURN_IF_ERROR(op, expr)                               \
  do {                                                                    \
    const cublasStatus_t zt_cublas_status_ = (expr);                      \
    if (zt_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                     \
      return ::zt::cuda::CublasError((op), #expr, zt_cublas_status_);     \
    }                                                                     \
  } while (0)
