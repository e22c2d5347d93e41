// CPU GEMM and linear layer: oneDNN's matmul primitive (scratch from the context's workspace)
// or OpenBLAS's sgemm, chosen per context. Internal to kernels/: the public entry points
// (kernels/linear.h) validate the arguments and dispatch here, so nothing in this file checks
// shapes again.
//
// Legend: M rows (B·T tokens), K input channels, N output channels. Row-major throughout.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "kernels/device.h"
#include "kernels/linear.h"

namespace zt::cpu {

// c(m, n) = alpha · op(a) · op(b) + beta · c with leading dimensions in elements.
struct SgemmCall {
  Transpose trans_a = Transpose::kNo;
  Transpose trans_b = Transpose::kNo;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  float alpha = 1.0f;
  const float* a = nullptr;
  int64_t lda = 0;
  const float* b = nullptr;
  int64_t ldb = 0;
  float beta = 0.0f;
  float* c = nullptr;
  int64_t ldc = 0;
};

// Runs on ctx.cpu_gemm with ctx.num_threads threads. oneDNN's team is the calling thread's
// OpenMP team (per-thread ICV); OpenBLAS (pthreads build) has one process-wide pool whose size
// is set to ctx.num_threads. oneDNN primitives are created once per key (shape, strides,
// transposes, alpha, beta, threads) in a process-wide cache and run on ctx.workspace:
// FailedPrecondition names both sizes when it is too small. Returns InternalError when the
// library reports a failure. Thread-safe; concurrent calls need distinct workspaces.
absl::Status Sgemm(const DeviceContext& ctx, const SgemmCall& call);

// Scratch bytes Sgemm needs for `shape` with packed operands and alpha 1 (see
// kernels/linear.h); on oneDNN creates the cache entry without its primitive.
absl::StatusOr<int64_t> GemmWorkspaceBytes(const DeviceContext& ctx, const GemmShape& shape);

// Entries in the oneDNN primitive cache.
int64_t GemmPrimitiveCacheSize();

absl::Status LinearForward(const DeviceContext& ctx, const LinearForwardArgs& args);
absl::Status LinearBackward(const DeviceContext& ctx, const LinearBackwardArgs& args);

std::string GemmDescription(CpuGemm gemm);

}  // namespace zt::cpu
