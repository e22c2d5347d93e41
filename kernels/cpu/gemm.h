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
#include "kernels/dtype.h"
#include "kernels/linear.h"

namespace zt::cpu {

// One matrix of a GEMM: its data, element type (f32, bf16 or f16) and leading dimension in
// elements.
struct GemmOperand {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t ld = 0;
};

// c(m, n) = alpha · op(a) · op(b) + beta · c; c.data is written (the view is const only so
// that one operand type serves all three).
struct GemmCall {
  Transpose trans_a = Transpose::kNo;
  Transpose trans_b = Transpose::kNo;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  float alpha = 1.0f;
  GemmOperand a;
  GemmOperand b;
  float beta = 0.0f;
  GemmOperand c;
};

// Runs on ctx.cpu_gemm with ctx.num_threads threads, accumulating in fp32 and rounding the
// result once to c's dtype. All-f32 calls and bf16 · bf16 → f32/bf16 on oneDNN run directly;
// any other mix widens its 16-bit operands (and a 16-bit c) to f32 in ctx.workspace, runs the
// f32 GEMM and rounds into c. oneDNN's team is the calling thread's OpenMP team (per-thread
// ICV); OpenBLAS (pthreads build) has one process-wide pool whose size is set to
// ctx.num_threads. oneDNN primitives are created once per key (shape, strides, dtypes,
// transposes, alpha, beta, threads) in a process-wide cache; all scratch comes from
// ctx.workspace: FailedPrecondition names both sizes when it is too small. Returns
// InternalError when the library reports a failure. Thread-safe; concurrent calls need
// distinct workspaces.
absl::Status Gemm(const DeviceContext& ctx, const GemmCall& call);

// Scratch bytes Gemm needs for `shape` with packed operands and alpha 1 (see
// kernels/linear.h); on oneDNN creates the cache entries without their primitives.
absl::StatusOr<int64_t> GemmWorkspaceBytes(const DeviceContext& ctx, const GemmShape& shape);

// Entries in the oneDNN primitive cache.
int64_t GemmPrimitiveCacheSize();

absl::Status LinearForward(const DeviceContext& ctx, const LinearForwardArgs& args);
absl::Status LinearBackward(const DeviceContext& ctx, const LinearBackwardArgs& args);

std::string GemmDescription(CpuGemm gemm);

}  // namespace zt::cpu
