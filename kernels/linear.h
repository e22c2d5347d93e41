// GEMM and the linear layer built on it.
//
// Legend: M rows (B·T tokens), K input channels, N output channels.
// Weights are stored [out, in] (N, K) as torch.nn.Linear does, for every family; Hugging Face
// GPT-2's Conv1D [in, out] weights are transposed on import/export (worker/model/hf_*).
// Accumulation rule: parameter gradients (dweight, dbias) are always added to (+=);
// the input gradient is written (=) or added (+=) as the caller says.
#pragma once

#include "absl/status/status.h"
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
// All f32, 2-D, row-major, on one device.
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

// "oneDNN 2.6 sgemm, ISA avx512_core_bf16" or "OpenBLAS 0.3.21 (Haswell)": what a CPU
// context's GEMM runs on, for benchmarks and logs.
std::string CpuGemmDescription(CpuGemm gemm);

}  // namespace zt
