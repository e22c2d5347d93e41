// Entry points of kernels/linear.h: argument checks, then dispatch on the device kind.
#include "kernels/linear.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/arg_checks.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cuda/linear.h"
#include "kernels/status_macros.h"

namespace zt {

using internal::CheckContext;
using internal::CheckOnDevice;
using internal::CheckRank;

namespace {

bool IsFloat(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

absl::Status CheckFloat(const char* op, const char* arg, DType t) {
  if (IsFloat(t)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": ", arg, " has dtype ", DTypeName(t), ", must be f32, bf16 or f16"));
}

// A 2-D float tensor on the context's device, sizes checked by the caller.
absl::Status CheckMatrix(const char* op, const char* arg, const Tensor& t,
                         const DeviceContext& ctx) {
  ZT_RETURN_IF_ERROR(CheckOnDevice(op, arg, t, ctx));
  ZT_RETURN_IF_ERROR(CheckFloat(op, arg, t.dtype()));
  return CheckRank(op, arg, t, 2);
}

// A float tensor of exactly `shape` on the context's device.
absl::Status CheckFloatOperand(const char* op, const char* arg, const Tensor& t,
                               const DeviceContext& ctx, std::initializer_list<int64_t> shape) {
  ZT_RETURN_IF_ERROR(CheckOnDevice(op, arg, t, ctx));
  ZT_RETURN_IF_ERROR(CheckFloat(op, arg, t.dtype()));
  return CheckShape(op, arg, t, shape);
}

}  // namespace

absl::Status Gemm(const DeviceContext& ctx, const Tensor& a, const Tensor& b, const Tensor& c,
                  const GemmArgs& args) {
  constexpr const char* kOp = "Gemm";
  ZT_RETURN_IF_ERROR(CheckContext(kOp, ctx));
  ZT_RETURN_IF_ERROR(CheckMatrix(kOp, "a", a, ctx));
  ZT_RETURN_IF_ERROR(CheckMatrix(kOp, "b", b, ctx));
  const bool ta = args.trans_a == Transpose::kYes;
  const bool tb = args.trans_b == Transpose::kYes;
  const int64_t m = ta ? a.dim(1) : a.dim(0);
  const int64_t k = ta ? a.dim(0) : a.dim(1);
  const int64_t n = tb ? b.dim(0) : b.dim(1);
  const int64_t kb = tb ? b.dim(1) : b.dim(0);
  if (kb != k) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": b has shape ", b.DebugString(), (tb ? " (transposed)" : ""),
                     ", inner dimension ", kb, " must equal a's inner dimension ", k, " (a ",
                     a.DebugString(), (ta ? " transposed" : ""), ")"));
  }
  ZT_RETURN_IF_ERROR(CheckFloatOperand(kOp, "c", c, ctx, {m, n}));
  if (ctx.device.kind == DeviceKind::kCuda) {
    return ZT_CUDA_OP(kOp, cuda::Gemm(ctx, a, b, c, args));
  }
  return cpu::Gemm(ctx, {.trans_a = args.trans_a,
                         .trans_b = args.trans_b,
                         .m = m,
                         .n = n,
                         .k = k,
                         .alpha = args.alpha,
                         .a = {a.raw(), a.dtype(), a.dim(1)},
                         .b = {b.raw(), b.dtype(), b.dim(1)},
                         .beta = args.beta,
                         .c = {c.raw(), c.dtype(), c.dim(1)}});
}

absl::Status LinearForward(const DeviceContext& ctx, const LinearForwardArgs& args) {
  constexpr const char* kOp = "LinearForward";
  ZT_RETURN_IF_ERROR(CheckContext(kOp, ctx));
  ZT_RETURN_IF_ERROR(CheckMatrix(kOp, "inp", args.inp, ctx));
  ZT_RETURN_IF_ERROR(CheckMatrix(kOp, "weight", args.weight, ctx));
  const int64_t m = args.inp.dim(0);
  const int64_t k = args.inp.dim(1);
  const int64_t n = args.weight.dim(0);
  ZT_RETURN_IF_ERROR(CheckShape(kOp, "weight", args.weight, {n, k}));
  ZT_RETURN_IF_ERROR(CheckFloatOperand(kOp, "out", args.out, ctx, {m, n}));
  if (!args.bias.empty()) {
    ZT_RETURN_IF_ERROR(CheckFloatOperand(kOp, "bias", args.bias, ctx, {n}));
  }
  if (ctx.device.kind == DeviceKind::kCuda) {
    return ZT_CUDA_OP(kOp, cuda::LinearForward(ctx, args));
  }
  return cpu::LinearForward(ctx, args);
}

absl::Status LinearBackward(const DeviceContext& ctx, const LinearBackwardArgs& args) {
  constexpr const char* kOp = "LinearBackward";
  ZT_RETURN_IF_ERROR(CheckContext(kOp, ctx));
  ZT_RETURN_IF_ERROR(CheckMatrix(kOp, "dout", args.dout, ctx));
  ZT_RETURN_IF_ERROR(CheckMatrix(kOp, "weight", args.weight, ctx));
  const int64_t m = args.dout.dim(0);
  const int64_t n = args.dout.dim(1);
  const int64_t k = args.weight.dim(1);
  ZT_RETURN_IF_ERROR(CheckShape(kOp, "weight", args.weight, {n, k}));
  ZT_RETURN_IF_ERROR(CheckFloatOperand(kOp, "inp", args.inp, ctx, {m, k}));
  ZT_RETURN_IF_ERROR(CheckFloatOperand(kOp, "dweight", args.dweight, ctx, {n, k}));
  if (!args.dinp.empty()) {
    ZT_RETURN_IF_ERROR(CheckFloatOperand(kOp, "dinp", args.dinp, ctx, {m, k}));
  }
  if (!args.dbias.empty()) {
    ZT_RETURN_IF_ERROR(CheckFloatOperand(kOp, "dbias", args.dbias, ctx, {n}));
  }
  if (ctx.device.kind == DeviceKind::kCuda) {
    return ZT_CUDA_OP(kOp, cuda::LinearBackward(ctx, args));
  }
  return cpu::LinearBackward(ctx, args);
}

absl::StatusOr<int64_t> GemmWorkspaceBytes(const DeviceContext& ctx, const GemmShape& shape) {
  constexpr const char* kOp = "GemmWorkspaceBytes";
  ZT_RETURN_IF_ERROR(CheckContext(kOp, ctx));
  for (const auto& [name, value] : {std::pair{"m", shape.m}, {"n", shape.n}, {"k", shape.k}}) {
    if (value < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(kOp, ": shape.", name, " is ", value, ", must be >= 0"));
    }
  }
  ZT_RETURN_IF_ERROR(CheckFloat(kOp, "shape.a_dtype", shape.a_dtype));
  ZT_RETURN_IF_ERROR(CheckFloat(kOp, "shape.b_dtype", shape.b_dtype));
  ZT_RETURN_IF_ERROR(CheckFloat(kOp, "shape.c_dtype", shape.c_dtype));
  if (ctx.device.kind == DeviceKind::kCuda) {
    return ZT_CUDA_OP(kOp, cuda::GemmWorkspaceBytes(ctx, shape));
  }
  return cpu::GemmWorkspaceBytes(ctx, shape);
}

absl::StatusOr<int64_t> LinearWorkspaceBytes(const DeviceContext& ctx, int64_t M, int64_t K,
                                             int64_t N, const LinearDTypes& dtypes) {
  // The GEMMs cpu::LinearForward / cpu::LinearBackward issue, each with every beta it may use.
  const GemmShape forward = {.m = M,
                             .n = N,
                             .k = K,
                             .trans_b = Transpose::kYes,
                             .a_dtype = dtypes.inp,
                             .b_dtype = dtypes.weight,
                             .c_dtype = dtypes.out};
  const GemmShape dinp = {.m = M,
                          .n = K,
                          .k = N,
                          .a_dtype = dtypes.dout,
                          .b_dtype = dtypes.weight,
                          .c_dtype = dtypes.dinp};
  GemmShape forward_bias = forward, dinp_add = dinp;
  forward_bias.accumulate = true;
  dinp_add.accumulate = true;
  const GemmShape dweight = {.m = N,
                             .n = K,
                             .k = M,
                             .trans_a = Transpose::kYes,
                             .accumulate = true,
                             .a_dtype = dtypes.dout,
                             .b_dtype = dtypes.inp,
                             .c_dtype = dtypes.dweight};
  const GemmShape gemms[] = {forward, forward_bias, dinp, dinp_add, dweight};
  // On CUDA the bias gradient's partial sums share the workspace too.
  int64_t most = ctx.device.kind == DeviceKind::kCuda ? cuda::BiasGradWorkspaceBytes(M, N) : 0;
  for (const GemmShape& g : gemms) {
    ZT_ASSIGN_OR_RETURN(int64_t bytes, GemmWorkspaceBytes(ctx, g));
    most = std::max(most, bytes);
  }
  return most;
}

std::string CpuGemmDescription(CpuGemm gemm) { return cpu::GemmDescription(gemm); }

namespace internal {
int64_t GemmPrimitiveCacheSize() { return cpu::GemmPrimitiveCacheSize(); }
}  // namespace internal

}  // namespace zt
