// GEMM and the linear layer built on it.
//
// Legend: M rows (B·T tokens), K input channels, N output channels.
// Weights are stored [out, in] (N, K) as torch.nn.Linear does, for every family; Hugging Face
// GPT-2's Conv1D [in, out] weights are transposed on import/export (worker/model/hf_*).
// Accumulation rule: parameter gradients (dweight, dbias) are always added to (+=);
// the input gradient is written (=) or added (+=) as the caller says.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/device.h"
#include "kernels/tensor.h"

namespace zt {

enum class Transpose : uint8_t { kNo, kYes };
enum class Accumulate : uint8_t { kOverwrite, kAdd };

struct GemmArgs {
  Transpose trans_a = Transpose::kNo;
  Transpose trans_b = Transpose::kNo;
  float alpha = 1.0f;
  float beta = 0.0f;
};

// c(M, N) = alpha · op(a) · op(b) + beta · c, where op(a) is (M, K) and op(b) is (K, N).
// All f32, 2-D, row-major, on one device. Scratch comes from ctx.workspace: FailedPrecondition
// (naming both sizes) when it holds fewer bytes than GemmWorkspaceBytes says this GEMM needs.
absl::Status Gemm(const DeviceContext& ctx, const Tensor& a, const Tensor& b, const Tensor& c,
                  const GemmArgs& args);

struct LinearForwardArgs {
  Tensor inp;     // (M, K)
  Tensor weight;  // (N, K)
  Tensor bias;    // (N) or empty
  Tensor out;     // (M, N), written
};
// out = inp · weightᵀ + bias.
absl::Status LinearForward(const DeviceContext& ctx, const LinearForwardArgs& args);

struct LinearBackwardArgs {
  Tensor dout;     // (M, N)
  Tensor inp;      // (M, K), the forward input
  Tensor weight;   // (N, K)
  Tensor dinp;     // (M, K), or empty to skip
  Tensor dweight;  // (N, K), += doutᵀ · inp
  Tensor dbias;    // (N) += column sums of dout, or empty
  Accumulate dinp_mode = Accumulate::kOverwrite;
};
absl::Status LinearBackward(const DeviceContext& ctx, const LinearBackwardArgs& args);

// A GEMM as the workspace sizing sees it: op(a) (m, k) · op(b) (k, n), operands packed
// (leading dimension = row length), alpha 1; `accumulate` is beta ≠ 0.
struct GemmShape {
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  Transpose trans_a = Transpose::kNo;
  Transpose trans_b = Transpose::kNo;
  bool accumulate = false;
};

// Scratch bytes that GEMM needs in ctx.workspace on the context's backend and thread count:
// 0 for OpenBLAS (which keeps its own buffers) and for empty shapes. On oneDNN this creates
// (and caches) the primitive descriptor, so the GEMM itself later finds it ready.
// InvalidArgument names a negative dimension; InternalError carries oneDNN's refusal.
absl::StatusOr<int64_t> GemmWorkspaceBytes(const DeviceContext& ctx, const GemmShape& shape);

// The most scratch any GEMM of LinearForward or LinearBackward needs for a layer with M rows,
// K inputs and N outputs: forward with and without bias, dinp overwritten and accumulated,
// dweight.
absl::StatusOr<int64_t> LinearWorkspaceBytes(const DeviceContext& ctx, int64_t M, int64_t K,
                                             int64_t N);

// "oneDNN 2.6.3 matmul, ISA avx512_core_bf16" or "OpenBLAS 0.3.21 (Haswell)": what a CPU
// context's GEMM runs on, for benchmarks and logs.
std::string CpuGemmDescription(CpuGemm gemm);

namespace internal {
// Shapes (with strides, transposes, alpha, beta and thread count) the process-wide oneDNN
// primitive cache holds: tests observe with it that a repeated GEMM creates nothing.
int64_t GemmPrimitiveCacheSize();
}  // namespace internal

}  // namespace zt
