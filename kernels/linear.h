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
// 2-D, row-major, on one device. Each of a, b and c may independently be f32, bf16 or f16:
// products are accumulated in fp32 and the result alpha · Σ + beta · c is rounded once (to
// nearest even) to c's dtype, c being read in fp32 when beta ≠ 0, as a GPU's fp32-accumulating
// GEMM with a 16-bit output does. bf16 · bf16 runs natively on oneDNN; every other 16-bit
// operand is widened to f32 in scratch first, which gives the same numerics (the widening is
// exact). Scratch comes from ctx.workspace: FailedPrecondition (naming both sizes) when it
// holds fewer bytes than GemmWorkspaceBytes says this GEMM needs.
absl::Status Gemm(const DeviceContext& ctx, const Tensor& a, const Tensor& b, const Tensor& c,
                  const GemmArgs& args);

// The linear layer's tensors may each be f32, bf16 or f16, independently (see Gemm for the
// rounding). The bias is added as its value in out's dtype (exact for an f32 out; for a 16-bit
// out it is rounded first, as autocast casts it to the compute dtype).
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
  Tensor dbias;    // (N) += column sums of dout (summed in float64), or empty
  Accumulate dinp_mode = Accumulate::kOverwrite;
};
// dinp, dweight and dbias are each rounded once to their dtype; a 16-bit dweight or dbias is
// read, added to in fp32 and rounded back.
absl::Status LinearBackward(const DeviceContext& ctx, const LinearBackwardArgs& args);

// A GEMM as the workspace sizing sees it: op(a) (m, k) · op(b) (k, n), operands packed
// (leading dimension = row length), alpha 1; `accumulate` is beta ≠ 0; the element types of
// a, b and c (f32, bf16 or f16).
struct GemmShape {
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  Transpose trans_a = Transpose::kNo;
  Transpose trans_b = Transpose::kNo;
  bool accumulate = false;
  DType a_dtype = DType::kF32;
  DType b_dtype = DType::kF32;
  DType c_dtype = DType::kF32;
};

// Scratch bytes that GEMM needs in ctx.workspace on the context's backend and thread count,
// exactly the most any call of that shape and dtypes uses: the library's own scratch (0 for
// OpenBLAS, which keeps its own buffers) plus f32 copies of the operands that must be widened
// and, for a widened 16-bit c, the f32 result. 0 for empty shapes. On oneDNN this creates (and
// caches) the primitive descriptors, so the GEMM itself later finds them ready.
// InvalidArgument names a negative dimension or a dtype that is not f32, bf16 or f16;
// InternalError carries oneDNN's refusal.
absl::StatusOr<int64_t> GemmWorkspaceBytes(const DeviceContext& ctx, const GemmShape& shape);

// Element types of a linear layer's tensors, as the workspace sizing sees them (the bias and
// dbias dtypes change no GEMM's scratch). ForPrecision fills them from a job's precision:
// activations and their gradients in the compute dtype, weights in the parameter dtype,
// weight gradients in the gradient dtype.
struct LinearDTypes {
  DType inp = DType::kF32;
  DType weight = DType::kF32;
  DType out = DType::kF32;
  DType dout = DType::kF32;
  DType dinp = DType::kF32;
  DType dweight = DType::kF32;

  static LinearDTypes ForPrecision(DType compute, DType param, DType grad) {
    return {.inp = compute,
            .weight = param,
            .out = compute,
            .dout = compute,
            .dinp = compute,
            .dweight = grad};
  }
};

// The most scratch any GEMM of LinearForward or LinearBackward needs for a layer with M rows,
// K inputs, N outputs and these dtypes: forward with and without bias, dinp overwritten and
// accumulated, dweight; on CUDA also the bias gradient's f64 partial sums (a few per column).
absl::StatusOr<int64_t> LinearWorkspaceBytes(const DeviceContext& ctx, int64_t M, int64_t K,
                                             int64_t N, const LinearDTypes& dtypes = {});

// "oneDNN 2.6.3 matmul, ISA avx512_core_bf16" or "OpenBLAS 0.3.21 (Haswell)": what a CPU
// context's GEMM runs on, for benchmarks and logs.
std::string CpuGemmDescription(CpuGemm gemm);

namespace internal {
// Shapes (with strides, transposes, alpha, beta and thread count) the process-wide oneDNN
// primitive cache holds: tests observe with it that a repeated GEMM creates nothing.
int64_t GemmPrimitiveCacheSize();
}  // namespace internal

}  // namespace zt
