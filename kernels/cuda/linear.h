// CUDA GEMM and linear layer through cuBLASLt: the twins of kernels/cpu/gemm.h, called by
// kernels/linear.cc after it has checked the arguments. No CUDA header here, so the entry
// points compile without nvcc.
//
// Legend: M rows (B·T tokens), K input channels, N output channels. Row-major throughout.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/device.h"
#include "kernels/linear.h"
#include "kernels/tensor.h"

namespace zt::cuda {

// c = alpha · op(a) · op(b) + beta · c (shapes checked by the caller), fp32 accumulation,
// rounded once to c's dtype. Scratch (cuBLASLt's workspace and f32 copies of operands that
// cuBLASLt cannot take as they are) comes from ctx.workspace: FailedPrecondition names both
// sizes when it holds fewer bytes than GemmWorkspaceBytes says.
absl::Status Gemm(const DeviceContext& ctx, const Tensor& a, const Tensor& b, const Tensor& c,
                  const GemmArgs& args);
absl::Status LinearForward(const DeviceContext& ctx, const LinearForwardArgs& args);
absl::Status LinearBackward(const DeviceContext& ctx, const LinearBackwardArgs& args);

// Host arithmetic only (no CUDA call): cuBLASLt's workspace (kCublasLtWorkspaceBytes) plus the
// f32 copies this shape's dtypes need; 0 for an empty shape.
absl::StatusOr<int64_t> GemmWorkspaceBytes(const DeviceContext& ctx, const GemmShape& shape);

// NVIDIA's recommended cuBLASLt workspace on Hopper (the cuBLAS documentation, "cuBLAS
// workspace": 32 MiB for sm_90; 4 MiB suffices before it). Smaller workspaces exclude the
// split-K and stream-K kernels the heuristic picks for skinny shapes such as 768 x 50304.
inline constexpr int64_t kCublasLtWorkspaceBytes = int64_t{32} << 20;

// The bias gradient's first pass splits dout's m rows into BiasGradChunks(m) chunks of about
// kBiasGradRowsPerChunk rows (a function of m alone, so the summation order never changes)
// and keeps one f64 partial per chunk and column in ctx.workspace.
inline constexpr int64_t kBiasGradRowsPerChunk = 512;
inline constexpr int64_t kBiasGradMaxChunks = 64;
inline int64_t BiasGradChunks(int64_t m) {
  const int64_t chunks = (m + kBiasGradRowsPerChunk - 1) / kBiasGradRowsPerChunk;
  return chunks < 1 ? 1 : (chunks > kBiasGradMaxChunks ? kBiasGradMaxChunks : chunks);
}
inline int64_t BiasGradWorkspaceBytes(int64_t m, int64_t n) { return BiasGradChunks(m) * n * 8; }

}  // namespace zt::cuda
